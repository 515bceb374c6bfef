"""`python -m bench lifecycle [--quick] [--json FILE]`: the fleet's life under steady load
(issue 38), one event after another, each measured over the window after it against the one
before it.

8 simulators (llama-3.1-70b-h100 profile, real time, cached tokens reported, no KV events)
behind 3 of our routers on one Redis (file discovery, `index: corrected`), the workload
system-prompts at a steady rate round-robin over the routers (as a Service spreads it). The
routers publish each engine's value (fleet_value.py); the operator's own ranking turns them
into pod deletion costs every 15 s within its patch budget (bench/harness/replicaset.py), and
the ReplicaSet controller's choice reads those costs. Then, in turn:
  scale-down     8 -> 6: the two engines the controller deletes leave (out of the backends
                 file: the routers hand their prefixes on), finish their requests, stop
  rolling update every engine replaced by a new, empty one with the operator's strategy
                 (render.py ENGINE_ROLLOUT), the old ones in the controller's order
  reset          the busiest engine's prefix cache emptied behind its address; the time to
                 the first router's drop of its entries, and to the hit rate back within
                 `tolerance` of the window before (over `recovery_span_s`)
  router         one router SIGKILLed (out of the targets first) and a new one started on
                 the same Redis; its hit rate over its first window against the old ones'
A second fleet runs the same load to the scale-down without the parts: no deletion costs
(the controller's own choice among alike pods, a seeded draw) and `handoff: false`.
Hit rates are the engines' own counters (every process, the stopped ones' last counts kept),
TTFT the client's, of the requests sent in the window.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import tempfile
import time
from collections.abc import Callable, Coroutine
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from prefix_operator.config import OperatorConfig
from prefix_operator.render import ENGINE_ROLLOUT

from .harness.deployment import Engines, published_values
from .harness.fleet import Fleet, Proc
from .harness.loadgen import Result, run_load
from .harness.replicaset import CostKeeper, victims
from .harness.stats import ratio
from .harness.timeline import Sample, first_after, recovery_s, series, versus, window
from .harness.workloads import system_prompts
from .provenance import now_utc, stamp
from .report import fmt, md_table, pyplot, save_figure
from .reset_detect import REASONS, busiest, drops, empty
from .runner import MODEL
from .scenarios import PROFILE
from .warm_router import counters

MODEL_KEY = "bench/lifecycle"
OUT = Path("bench/results/lifecycle/scenario")
EVENTS = ("scale_down", "rolling_update", "reset", "router")


@dataclass(frozen=True)
class Settings:
    engines: int = 8
    scale_to: int = 6
    routers: int = 3
    kv_capacity_tokens: int = 24_000  # as bench rollout: the fleet holds 1.5x the prompts
    rate: float = 6.0
    warm_s: float = 120.0  # load before the first reference window
    steady_s: float = 60.0  # the reference window before each event
    after_s: float = 60.0  # the window after each event
    sample_s: float = 1.0  # the engines' counters read this often
    plot_step_s: float = 5.0
    recovery_span_s: float = 10.0
    tolerance: float = 0.02
    drain_timeout_s: float = 30.0
    seed: int = 5


QUICK = {"warm_s": 60.0, "steady_s": 40.0, "after_s": 40.0}


class Clock:
    def __init__(self) -> None:
        self.t0 = time.perf_counter()

    def now(self) -> float:
        return time.perf_counter() - self.t0

    async def until(self, t: float) -> None:
        await asyncio.sleep(max(0.0, t - self.now()))


def spawn(coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
    return asyncio.create_task(coro)


async def every(period: float, clock: Clock, fn: Callable[[], Coroutine[Any, Any, None]],
                first: int = 0) -> None:
    """`fn` at each multiple of `period` from the clock's start (from the `first`th), until
    cancelled."""
    k = first
    while True:
        await clock.until(k * period)
        await fn()
        k += 1


async def run(s: Settings, parts: bool, log_dir: Path) -> dict[str, Any]:
    """One fleet's timeline. `parts`: every part on, every event; otherwise only the
    scale-down, without deletion costs and without the handoff."""
    rng = random.Random(s.seed)
    cfg = OperatorConfig()
    async with Fleet(log_dir) as fleet, aiohttp.ClientSession() as http:
        redis_url = await fleet.start_redis()

        async def start_sim(name: str) -> Proc:
            return await fleet.start_sim(name, model=MODEL, kv_capacity=s.kv_capacity_tokens,
                                         profile=PROFILE, time_scale=1.0,
                                         extra=["--enable-prompt-tokens-details"])

        engines = Engines(log_dir / "backends", start_sim, fleet.stop, s.drain_timeout_s)
        await engines.add([f"e{i}" for i in range(s.engines)])
        settings = log_dir / "router.yaml"
        settings.write_text(yaml.safe_dump({"cached_tokens_reported": True, "handoff": parts}))

        async def start_router(name: str) -> Proc:
            return await fleet.start_router(
                name, engines.backends, policy="prefix", kv_capacity=s.kv_capacity_tokens,
                extra=["--config", str(settings), "--store", "redis", "--redis-url",
                       redis_url, "--model-key", MODEL_KEY])

        routers = list(await asyncio.gather(*(start_router(f"router{i}")
                                              for i in range(s.routers))))
        targets = [r.url for r in routers]
        planned = s.warm_s + 4 * (s.steady_s + s.after_s) + 120  # the rollout's own time
        workload = system_prompts(int(s.rate * planned * 1.3) + 50, seed=s.seed)
        stop = asyncio.Event()
        clock = Clock()
        engines.t0 = clock.t0
        engines.events.clear()
        load = asyncio.create_task(run_load(workload, targets, MODEL, s.rate, planned,
                                            seed=s.seed, progress=False, stop=stop))
        samples: list[Sample] = []
        keeper = CostKeeper(cfg)

        async def sample() -> None:
            t = clock.now()
            samples.append((round(t, 3), *await engines.totals()))

        async def keep_costs() -> None:
            keeper.refresh(engines.urls, await published_values(redis_url, MODEL_KEY),
                           time.monotonic())

        tasks = [spawn(every(s.sample_s, clock, sample))]
        if parts:
            # the operator's timer: its first run one period in
            tasks.append(spawn(every(cfg.figures_seconds, clock, keep_costs, first=1)))
        events: dict[str, dict[str, Any]] = {}
        try:
            at = s.warm_s + s.steady_s
            await clock.until(at)
            events["scale_down"] = await scale_down(s, engines, keeper.costs if parts else {},
                                                    redis_url, rng, clock)
            if parts:
                at = events["scale_down"]["t"] + s.after_s + s.steady_s
                await clock.until(at)
                events["rolling_update"] = await rolling_update(engines, keeper, rng, clock)
                at = max(at + s.after_s, clock.now()) + s.steady_s
                await clock.until(at)
                events["reset"] = await reset(s, fleet, http, engines, routers, clock)
                at += s.after_s + s.steady_s
                await clock.until(at)
                events["router"] = await replace_router(s, fleet, routers, targets,
                                                        start_router, clock)
            else:
                await clock.until(events["scale_down"]["t"] + s.after_s)
            await sample()
        finally:
            stop.set()
            for t in tasks:
                t.cancel()
            done = await asyncio.gather(*tasks, return_exceptions=True)
        log = await load
        for x in done:  # a sampler that failed leaves a timeline with a hole: say so
            if isinstance(x, Exception):
                raise x
    return figures(s, samples, log.results, clock.t0, events, engines.events, keeper.patches,
                   parts)


async def scale_down(s: Settings, engines: Engines, costs: dict[str, int], redis_url: str,
                     rng: random.Random, clock: Clock) -> dict[str, Any]:
    values = await published_values(redis_url, MODEL_KEY)
    urls = engines.urls
    going = victims(urls, costs, s.engines - s.scale_to, rng)
    hottest = sorted(urls, key=lambda u: (-values.get(u, 0.0), u))
    t = clock.now()
    await engines.remove([p for p in engines.members if p.url in going])
    return {"t": round(t, 2), "removed": going,
            # 1 = the engine whose loss costs most (what the routers published then)
            "removed_value_ranks": [hottest.index(u) + 1 for u in going],
            "values": {u: round(values.get(u, 0.0), 1) for u in urls},
            "costs": {u: costs.get(u) for u in urls}}


async def rolling_update(engines: Engines, keeper: CostKeeper, rng: random.Random,
                         clock: Clock) -> dict[str, Any]:
    async def pick(old: list[Proc]) -> Proc:
        (url,) = victims([p.url for p in old], keeper.costs, 1, rng)
        return next(p for p in old if p.url == url)

    t = clock.now()
    await engines.roll(ENGINE_ROLLOUT["maxSurge"], ENGINE_ROLLOUT["maxUnavailable"], pick)
    return {"t": round(t, 2), "took_s": round(clock.now() - t, 2), **ENGINE_ROLLOUT}


async def reset(s: Settings, fleet: Fleet, http: aiohttp.ClientSession, engines: Engines,
                routers: list[Proc], clock: Clock) -> dict[str, Any]:
    """The busiest engine's cache reset; each router's first drop of its entries."""
    target = await busiest(http, engines.members)
    before = {r.name: await drops(http, r.metrics, target.url) for r in routers}
    t = clock.now()
    await empty(fleet, http, target, "reset")
    found: dict[str, tuple[float, str]] = {}
    while len(found) < len(routers) and clock.now() < t + s.after_s:
        for r in routers:
            if r.name in found:
                continue
            now = await drops(http, r.metrics, target.url)
            fired = [why for why in (*REASONS, "ejected") if now[why] > before[r.name][why]]
            if fired:
                found[r.name] = (clock.now(), fired[0])
        await asyncio.sleep(0.05)
    return {"t": round(t, 2), "engine": target.url,
            "detected": {name: {"t": round(at, 2), "by": why}
                         for name, (at, why) in found.items()}}


async def replace_router(s: Settings, fleet: Fleet, routers: list[Proc], targets: list[str],
                         start_router: Callable[[str], Coroutine[Any, Any, Proc]],
                         clock: Clock) -> dict[str, Any]:
    """The first router out of the targets and killed; a new one in once ready; the new
    one's and the old ones' reported hit rates over the new one's first window."""
    gone = routers.pop(0)
    t = clock.now()
    targets.remove(gone.url)
    await fleet.stop(gone, "kill")
    new = await start_router("router-new")
    ready = clock.now()
    before = {p.name: await counters(p.metrics) for p in (new, *routers)}
    targets.append(new.url)
    await clock.until(ready + s.after_s)
    after = {p.name: await counters(p.metrics) for p in (new, *routers)}
    routers.append(new)

    def hit(names: list[str]) -> float | None:
        cached = sum(after[n][0] - before[n][0] for n in names)
        prompt = sum(after[n][1] - before[n][1] for n in names)
        return ratio(cached, prompt)

    olds = [n for n in before if n != new.name]
    return {"t": round(t, 2), "killed": gone.name, "new_ready_s": round(ready - t, 2),
            "window": [round(ready, 2), round(ready + s.after_s, 2)],
            "new_hit_rate": hit([new.name]), "old_hit_rate": hit(olds),
            "per_router_hit_rate": {n: hit([n]) for n in before}}


def figures(s: Settings, samples: list[Sample], results: list[Result], t0: float,
            events: dict[str, dict[str, Any]], changes: list[dict[str, Any]], patches: int,
            parts: bool) -> dict[str, Any]:
    """Each event's window before and after it, its ratios, and the timeline."""
    out: dict[str, Any] = {}
    for name, ev in events.items():
        t = ev["t"]
        before = window(samples, results, t0, t - s.steady_s, t)
        after = window(samples, results, t0, t, t + s.after_s)
        out[name] = {**ev, "before": before, "after": after, **versus(after, before)}
    if "reset" in out:
        r = out["reset"]
        r["detect_s"] = first_after([d["t"] for d in r["detected"].values()], r["t"])
        r["recovery_s"] = recovery_s(samples, r["t"], r["before"]["hit_rate"] - s.tolerance,
                                     s.recovery_span_s, r["t"] + s.after_s)
    if "router" in out:
        r = out["router"]
        r["new_router_hit_ratio"] = ratio(r["new_hit_rate"], r["old_hit_rate"], 3)
        # the killed router's requests in flight: cut by the kill
        r["errors_cut"] = sum(not x.ok for x in results
                              if r["t"] - 30 <= x.sent_at - t0 < r["t"] + 1)
    duration = samples[-1][0] if samples else 0.0
    return {"parts": parts, "events": out, "changes": changes,
            "deletion_cost_patches": patches,
            "deletion_cost_patches_per_minute": round(patches / duration * 60, 2)
            if duration and parts else None,
            "requests": len(results), "errors": sum(not r.ok for r in results),
            "first_errors": sorted({r.error for r in results if not r.ok})[:3],
            "series": series(samples, results, t0, s.plot_step_s), "samples": samples}


def summary(on: dict[str, Any], off: dict[str, Any]) -> dict[str, Any]:
    ev, sd_off = on["events"], off["events"]["scale_down"]
    return {
        "scale_down_hit_ratio": ev["scale_down"]["hit_ratio"],
        "scale_down_hit_ratio_without": sd_off["hit_ratio"],
        "reset_detect_s": ev["reset"]["detect_s"],
        "reset_recovery_s": ev["reset"]["recovery_s"],
        "new_router_hit_ratio": ev["router"]["new_router_hit_ratio"],
        "errors": on["errors"] + off["errors"],
        "errors_cut_by_router_kill": ev["router"]["errors_cut"],
        "rolling_update_hit_ratio": ev["rolling_update"]["hit_ratio"],
        "ttft_ratios": {name: {k: ev[name][k] for k in ("ttft_p50_ratio", "ttft_p99_ratio")}
                        for name in EVENTS},
        "scale_down_ttft_ratios_without": {k: sd_off[k] for k in ("ttft_p50_ratio",
                                                                  "ttft_p99_ratio")},
    }


def table(r: dict[str, Any]) -> list[str]:
    on, off = r["runs"]["with"]["events"], r["runs"]["without"]["events"]
    rows = [(name.replace("_", " "), fmt(e["before"]["hit_rate"]), fmt(e["after"]["hit_rate"]),
             fmt(e["hit_ratio"]), fmt(e["ttft_p50_ratio"]), fmt(e["ttft_p99_ratio"]),
             str(e["after"]["errors"])) for name, e in on.items()]
    e = off["scale_down"]
    rows.insert(1, ("scale down, without (the ReplicaSet's own choice, no handoff)",
                    fmt(e["before"]["hit_rate"]), fmt(e["after"]["hit_rate"]),
                    fmt(e["hit_ratio"]), fmt(e["ttft_p50_ratio"]), fmt(e["ttft_p99_ratio"]),
                    str(e["after"]["errors"])))
    return md_table(("event", "hit rate before", "after", "ratio", "TTFT p50 ratio",
                     "TTFT p99 ratio", "errors after"), rows)


def report(r: dict[str, Any], path: Path) -> None:
    s, m = r["settings"], r["summary"]
    on = r["runs"]["with"]["events"]
    sd, sd_off = on["scale_down"], r["runs"]["without"]["events"]["scale_down"]
    goals = [
        ("scale-down hit rate / steady (goal >= 0.95)", m["scale_down_hit_ratio"]),
        ("... without deletion costs and handoff", m["scale_down_hit_ratio_without"]),
        ("engines removed, by value rank (1 = hottest), with / without",
         f"{sd['removed_value_ranks']} / {sd_off['removed_value_ranks']}"),
        ("reset detected after (s, goal <= 5)", m["reset_detect_s"]),
        (f"reset: hit rate back within {s['tolerance']} after (s, goal <= 30)",
         m["reset_recovery_s"]),
        ("new router's hit rate / an old one's (goal >= 0.97)", m["new_router_hit_ratio"]),
        ("rolling update hit rate / steady", m["rolling_update_hit_ratio"]),
        ("errors (of them cut in flight by the router kill)",
         f"{m['errors']} ({m['errors_cut_by_router_kill']})"),
        ("deletion-cost patches a minute", r["runs"]["with"]["deletion_cost_patches_per_minute"]),
    ]
    path.write_text("\n".join([
        f"# The fleet's life under steady load ({r['variant']})", "",
        f"Written by `{r['command']}` on {r['date_utc']}, {r['machine']}, code {r['version']}. "
        f"{s['engines']} simulators ({PROFILE}, {s['kv_capacity_tokens']} KV tokens each), "
        f"{s['routers']} routers on one Redis, system-prompts at {s['rate']:g} req/s; each "
        f"event's window after is {s['after_s']:g} s, against the {s['steady_s']:g} s before "
        f"it; the reset's recovery over {s['recovery_span_s']:g} s windows. bench/lifecycle.py "
        "says what runs.", "",
        f"![hit rate and TTFT over time, the events marked]({path.stem}.png)", "",
        *md_table(("figure", "value"), [(k, fmt(v)) for k, v in goals]), "",
        *table(r), ""]))


def plot(r: dict[str, Any], path: Path) -> None:
    plt = pyplot()
    on, off = r["runs"]["with"], r["runs"]["without"]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 7), sharex=True, height_ratios=[3, 2])
    for run, label, style in ((off, "scale-down without deletion costs and handoff",
                               {"color": "0.6"}),
                              (on, "every part on", {"color": "tab:blue"})):
        xs = [w for w in run["series"] if w["hit_rate"] is not None]
        top.plot([w["t"] for w in xs], [w["hit_rate"] for w in xs], label=label, **style)
    xs = on["series"]
    for key, color in (("ttft_p50_ms", "tab:green"), ("ttft_p99_ms", "tab:red")):
        pts = [w for w in xs if w[key] is not None]
        bottom.plot([w["t"] for w in pts], [w[key] for w in pts], color=color,
                    label=key.replace("_ms", "").replace("_", " ") + " (every part on)")
    after = r["settings"]["after_s"]
    for name, ev in on["events"].items():
        for ax in (top, bottom):
            ax.axvline(ev["t"], color="k", ls="--", lw=1)
            ax.axvspan(ev["t"], ev["t"] + after, color="0.92", zorder=0)
        top.text(ev["t"] + 1, 0.98, name.replace("_", " "), fontsize=8, rotation=90,
                 va="top", transform=top.get_xaxis_transform())
    top.set(ylabel=f"hit rate ({r['settings']['plot_step_s']:g} s windows)")
    bottom.set(ylabel="TTFT (ms)", yscale="log", xlabel="seconds from the load's start "
               "(grey: each event's window after)")
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="lower left")
    save_figure(plt, fig, path)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("lifecycle", help="scale-down, rolling update, cache reset and router "
                       "replacement under steady load (issue 38)")  # fmt: skip
    p.add_argument("--quick", action="store_true",
                   help=f"shorter windows ({', '.join(f'{k} {v:g}' for k, v in QUICK.items())})")
    p.add_argument("--out", default=str(OUT), help="results folder (JSON, plot, report)")
    p.add_argument("--json", type=Path, help="also write the summary here")
    p.add_argument("--seed", type=int, default=Settings.seed)
    for name in ("warm_s", "steady_s", "after_s"):
        p.add_argument("--" + name.replace("_", "-"), type=float, dest=name,
                       help=f"seconds (over --quick's and the default {getattr(Settings, name):g})")


def main(args: argparse.Namespace, command: str) -> None:
    given = {k: getattr(args, k) for k in ("warm_s", "steady_s", "after_s")
             if getattr(args, k) is not None}
    s = replace(Settings(seed=args.seed), **{**(QUICK if args.quick else {}), **given})
    provenance = stamp(command)  # of the code that runs, whatever is committed meanwhile
    variant = "quick" if args.quick else "full"
    logs = Path(tempfile.mkdtemp(prefix="lifecycle-"))
    print(f"lifecycle ({variant}): logs in {logs}", flush=True)
    runs = {}
    for name, parts in (("with", True), ("without", False)):
        runs[name] = asyncio.run(run(s, parts, logs / name))
        print(f"  {name}: " + ", ".join(
            f"{k} x{e['hit_ratio']}" for k, e in runs[name]["events"].items()), flush=True)
    r = {**provenance, "date_utc": now_utc(), "variant": variant, "settings": asdict(s),
         "summary": summary(runs["with"], runs["without"]), "runs": runs}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = "lifecycle" if variant == "full" else "lifecycle-quick"
    (out / f"{stem}.json").write_text(json.dumps(r, indent=1) + "\n")
    plot(r, out / f"{stem}.png")
    report(r, out / f"{stem}.md")
    brief = {**provenance, "date_utc": r["date_utc"], "variant": variant,
             "settings": asdict(s), **r["summary"]}
    print(json.dumps(brief, indent=1))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(brief, indent=1) + "\n")
    print(f"wrote {out / stem}.json, .png, .md", flush=True)
