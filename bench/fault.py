"""Kill redis-server in the middle of a 3-router run and watch the engines' hit rate recover.

`python -m bench fault` runs `system-prompts` through 3 `prefix` routers sharing one Redis;
at `kill_at` seconds redis-server gets SIGKILL, at `restart_at` a new, EMPTY one starts on
the same port (what a restarted pod without persistence looks like). The engines' own
counters are sampled every `sample_s`; the result holds the hit rate per window, the number
of failed client requests, and the time from Redis coming back to the hit rate returning to
90% of its level before the kill.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

from .fleet import Fleet, free_port
from .loadgen import run_load
from .run import KV_CAPACITY, MODEL, fetch_stats, reset, start_sims
from .workloads import build

RESULTS = Path(__file__).parent / "results" / "shared-store"


def recovery_seconds(
    series: list[tuple[float, float]], kill_at: float, restart_at: float, frac: float = 0.9
) -> float | None:
    """Seconds from `restart_at` to the first window whose hit rate is back to `frac` x the
    mean before the kill (None if it never is). `series` holds (window end, hit rate)."""
    before = [h for t, h in series if 10.0 <= t <= kill_at]
    if not before:
        return None
    level = frac * sum(before) / len(before)
    for t, h in series:
        if t > restart_at and h >= level:
            return round(t - restart_at, 1)
    return None


async def fault_run(
    rate: float = 24.0,
    seconds: float = 120.0,
    kill_at: float = 40.0,
    restart_at: float = 60.0,
    sample_s: float = 5.0,
) -> dict:
    workload = "system-prompts"
    kv = KV_CAPACITY[workload]
    wl = build(workload, int(rate * seconds * 1.2) + 50)
    log_dir = Path("bench/.logs") / f"fault-{int(time.time())}"
    events: list[tuple[float, str]] = []
    series: list[tuple[float, float]] = []
    async with Fleet(log_dir) as fleet:
        port = free_port()  # the restarted server comes back on the same one
        url = await fleet.start_redis(port=port)
        sim_urls = await start_sims(fleet, 8, kv, "llama-3.1-70b-h100", 1.0)
        extra = ["--store", "redis", "--redis-url", url, "--model-key", "bench/fault"]
        routers = [
            await fleet.start_router(
                f"router{k}", sim_urls, policy="prefix", kv_capacity=kv, extra=extra
            )
            for k in range(3)
        ]
        await reset(sim_urls)
        t0 = time.perf_counter()

        async def sampler() -> None:
            last = (0, 0)
            while True:
                await asyncio.sleep(sample_s)
                stats = await fetch_stats(sim_urls)
                p = sum(s["prompt_tokens"] for s in stats)
                c = sum(s["cached_tokens"] for s in stats)
                if p > last[0]:
                    t = time.perf_counter() - t0
                    series.append((round(t, 1), round((c - last[1]) / (p - last[0]), 4)))
                last = (p, c)

        async def injector() -> None:
            await asyncio.sleep(kill_at)
            await fleet.stop(fleet.proc("redis"), "kill")
            events.append((round(time.perf_counter() - t0, 1), "redis killed"))
            await asyncio.sleep(restart_at - kill_at)
            await fleet.start_redis("redis-restarted", port)
            events.append((round(time.perf_counter() - t0, 1), "redis back (empty)"))

        side = [asyncio.create_task(sampler()), asyncio.create_task(injector())]
        log = await run_load(wl, [r.url for r in routers], MODEL, rate, seconds)
        for t in side:
            t.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await t
    errors = [r for r in log.results if not r.ok]
    return {
        "workload": workload,
        "replicas": 8,
        "router_replicas": 3,
        "rate": rate,
        "seconds": seconds,
        "kill_at_s": kill_at,
        "restart_at_s": restart_at,
        "requests_sent": len(log.sent),
        "failed_requests": len(errors),
        "events": events,
        "hit_rate_series": series,
        "recovery_s": recovery_seconds(series, kill_at, restart_at),
    }


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = [t for t, _h in result["hit_rate_series"]]
    ys = [h for _t, h in result["hit_rate_series"]]
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.plot(xs, ys, marker="o", ms=3, label="engine hit rate (per window)")
    ax.axvspan(result["kill_at_s"], result["restart_at_s"], color="red", alpha=0.12)
    ax.text(result["kill_at_s"] + 0.5, 0.05, "redis down", color="red")
    ax.set_xlabel("seconds into the run")
    ax.set_ylabel("hit rate")
    ax.set_ylim(0, 1)
    ax.set_title(
        f"3 routers, Redis killed and restarted empty: {result['failed_requests']} failed "
        f"requests, recovery {result['recovery_s']} s"
    )
    ax.title.set_fontsize(9)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(rate: float, seconds: float) -> dict:
    import json

    result = asyncio.run(fault_run(rate, seconds))
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "redis-kill.json").write_text(json.dumps(result, indent=2) + "\n")
    plot(result, RESULTS / "redis-kill.png")
    return result
