"""`python -m bench scale-out`: 4 replicas become 8 in the middle of a run, warm start on/off.

The router finds its backends in a file (file discovery); at `join_at` seconds the file gains
four more simulators, as an HPA scale-out would add pods to the Service. Each run samples
the engines every `sample_s`: the share of requests the new replicas served, the fleet's
engine hit rate, and the TTFT p50 of the requests sent in the window. Same workload and
request sequence for both runs; the only difference is the router setting `warm_start`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import statistics
import time
from pathlib import Path

from .fleet import Fleet
from .loadgen import run_load
from .run import KV_CAPACITY, MODEL, fetch_stats, reset, start_sims
from .workloads import build

RESULTS = Path(__file__).parent / "results" / "scale-out"
WORKLOAD = "system-prompts"


def time_to_share(
    series: list[dict[str, float]], join_at: float, share: float
) -> float | None:
    """Seconds from the join to the first window where the new replicas served `share`."""
    for w in series:
        if w["t"] > join_at and w["new_share"] >= share:
            return round(w["t"] - join_at, 1)
    return None


def after_join(series: list[dict[str, float]], join_at: float, span: float) -> dict[str, float]:
    """Means over the windows that end within `span` seconds after the join."""
    ws = [w for w in series if join_at < w["t"] <= join_at + span]
    if not ws:
        return {}
    ttfts = [w["ttft_p50_ms"] for w in ws if w["ttft_p50_ms"] is not None]
    return {
        "hit_rate": round(statistics.fmean(w["hit_rate"] for w in ws), 4),
        "new_share": round(statistics.fmean(w["new_share"] for w in ws), 4),
        "ttft_p50_ms": round(statistics.fmean(ttfts), 1) if ttfts else None,
    }


async def one_run(warm: bool, rate: float, seconds: float, join_at: float,
                  sample_s: float) -> dict:
    kv = KV_CAPACITY[WORKLOAD]
    wl = build(WORKLOAD, int(rate * seconds * 1.2) + 50)
    log_dir = Path("bench/.logs") / f"scale-out-{'warm' if warm else 'cold'}-{int(time.time())}"
    series: list[dict[str, float]] = []
    async with Fleet(log_dir) as fleet:
        sims = await start_sims(fleet, 8, kv, "llama-3.1-70b-h100", 1.0)
        old, new = sims[:4], sims[4:]
        listing = log_dir / "backends"
        listing.write_text("\n".join(old) + "\n")
        config = log_dir / "router.yaml"
        config.write_text(f"warm_start: {str(warm).lower()}\n")
        router = await fleet.start_router(
            "router0", [], policy="prefix", kv_capacity=kv,
            extra=["--discovery", "file", "--backends-file", str(listing),
                   "--config", str(config)],
        )
        await reset(sims)
        t0 = time.perf_counter()

        async def sampler() -> None:
            last = {u: (0, 0, 0) for u in sims}
            while True:
                await asyncio.sleep(sample_s)
                t = time.perf_counter() - t0
                stats = dict(zip(sims, await fetch_stats(sims), strict=True))
                d = {u: (s["requests"] - last[u][0], s["prompt_tokens"] - last[u][1],
                         s["cached_tokens"] - last[u][2]) for u, s in stats.items()}
                last = {u: (s["requests"], s["prompt_tokens"], s["cached_tokens"])
                        for u, s in stats.items()}
                reqs = sum(x[0] for x in d.values())
                prompt = sum(x[1] for x in d.values())
                series.append({
                    "t": round(t, 1),
                    "new_share": round(sum(d[u][0] for u in new) / reqs, 4) if reqs else 0.0,
                    "hit_rate": round(sum(x[2] for x in d.values()) / prompt, 4) if prompt else 0.0,
                    "ttft_p50_ms": None,  # from the client's results, below
                })

        async def scale_out() -> None:
            await asyncio.sleep(join_at)
            listing.write_text("\n".join(sims) + "\n")

        side = [asyncio.create_task(sampler()), asyncio.create_task(scale_out())]
        log = await run_load(wl, [router.url], MODEL, rate, seconds)
        for task in side:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    # TTFT per window, from the client's own results (by the time each request was sent)
    by_window: dict[float, list[float]] = {}
    for r in log.results:
        if r.ok and r.ttft is not None:
            at = r.sent_at - log.started
            for w in series:
                if w["t"] - sample_s < at <= w["t"]:
                    by_window.setdefault(w["t"], []).append(r.ttft)
                    break
    for w in series:
        vals = by_window.get(w["t"])
        w["ttft_p50_ms"] = round(statistics.median(vals) * 1000, 1) if vals else None
    failed = sum(1 for r in log.results if not r.ok)
    return {
        "warm_start": warm,
        "series": series,
        "failed_requests": failed,
        "requests": len(log.results),
        "seconds_to_40pct": time_to_share(series, join_at, 0.40),
        "first_30s_after_join": after_join(series, join_at, 30.0),
    }


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for run in result["runs"]:
        label = "warm start" if run["warm_start"] else "no warm start"
        xs = [w["t"] for w in run["series"]]
        axes[0].plot(xs, [w["new_share"] for w in run["series"]], marker="o", ms=3, label=label)
        axes[1].plot(xs, [w["hit_rate"] for w in run["series"]], marker="o", ms=3, label=label)
        axes[2].plot(xs, [w["ttft_p50_ms"] for w in run["series"]], marker="o", ms=3,
                     label=label)
    titles = ("share of requests on the 4 new replicas", "engine hit rate", "TTFT p50 (ms)")
    for ax, title in zip(axes, titles, strict=True):
        ax.axvline(result["join_at_s"], color="grey", ls="--")
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("seconds into the run")
        ax.legend(fontsize=8)
    axes[0].axhline(0.5, color="grey", lw=0.6)
    axes[0].set_ylim(0, 1)
    axes[1].set_ylim(0, 1)
    fig.suptitle(f"{WORKLOAD} at {result['rate']:g} req/s: 4 replicas become 8 at "
                 f"{result['join_at_s']:g} s", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(rate: float = 16.0, seconds: float = 90.0, join_at: float = 30.0,
         sample_s: float = 5.0) -> dict:
    runs = [asyncio.run(one_run(warm, rate, seconds, join_at, sample_s))
            for warm in (True, False)]
    result = {
        "workload": WORKLOAD, "rate": rate, "seconds": seconds, "join_at_s": join_at,
        "sample_s": sample_s,
        "command": f".venv/bin/python -m bench scale-out --rate {rate:g} --seconds {seconds:g}",
        "runs": runs,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "scale-out.json").write_text(json.dumps(result, indent=2) + "\n")
    plot(result, RESULTS / "scale-out.png")
    return result
