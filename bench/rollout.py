"""`python -m bench.rollout`: what a rolling update of the engines costs the hit rate and TTFT,
for each Deployment strategy (maxSurge, maxUnavailable) and order of the old pods' removal.

Steady load (system-prompts) on 8 simulators behind our router (file discovery, a Redis store
so it publishes its engine values as in a cluster), then every engine replaced by a new, empty
one as the Deployment controller would: per step, `unavailable` old engines leave first, then
`surge + unavailable` new ones start and join once healthy, then `surge` more old ones leave.
An old engine leaves by going out of the backends file (the router stops placing there and
hands its prefixes on), then finishes its requests in flight and stops. Which old engine goes
next: `default` (the ReplicaSet's own choice: its pods are alike, so a seeded draw), or
`coldest` (lowest published engine value first: what pod-deletion-cost makes the controller
do). Hit rates come from the engines' own counters (every process, the replaced ones' last
counts included), TTFT from the client.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shlex
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .harness.deployment import Engines, published_values
from .harness.fleet import Fleet, Proc
from .harness.loadgen import run_load
from .harness.stats import ratio
from .harness.timeline import requests
from .harness.workloads import system_prompts
from .provenance import now_utc, stamp
from .report import fmt, md_table
from .runner import MODEL
from .scenarios import PROFILE

REPO = Path(__file__).resolve().parents[1]
MODEL_KEY = "bench/rollout"


@dataclass(frozen=True)
class Strategy:
    name: str
    surge: int
    unavailable: int
    order: str  # default | coldest


STRATEGIES = {
    s.name: s for s in (
        Strategy("surge1-unavail0-default", 1, 0, "default"),  # the operator's before
        Strategy("surge0-unavail1-default", 0, 1, "default"),
        Strategy("surge2-unavail0-default", 2, 0, "default"),
        Strategy("surge1-unavail0-coldest", 1, 0, "coldest"),
        Strategy("surge0-unavail1-coldest", 0, 1, "coldest"),
    )
}


@dataclass(frozen=True)
class Settings:
    engines: int = 8
    kv_capacity_tokens: int = 24_000
    rate: float = 6.0
    warm_s: float = 60.0  # load before the steady window
    steady_s: float = 60.0  # the reference window
    window_s: float = 150.0  # from the rollout's start: the figures "during" it
    drain_timeout_s: float = 30.0
    seed: int = 5


async def one(st: Strategy, s: Settings, log_dir: Path) -> dict[str, Any]:
    rng = random.Random(s.seed)
    async with Fleet(log_dir / st.name) as fleet:
        redis_url = await fleet.start_redis()

        async def start(name: str) -> Proc:
            return await fleet.start_sim(name, model=MODEL, kv_capacity=s.kv_capacity_tokens,
                                         profile=PROFILE, time_scale=1.0)

        engines = Engines(log_dir / st.name / "backends", start, fleet.stop, s.drain_timeout_s)
        await engines.add([f"old{i}" for i in range(s.engines)])
        router = await fleet.start_router(
            "router", engines.backends, policy="prefix", kv_capacity=s.kv_capacity_tokens,
            extra=["--store", "redis", "--redis-url", redis_url, "--model-key", MODEL_KEY])
        seconds = s.warm_s + s.steady_s + s.window_s + 30
        workload = system_prompts(int(s.rate * seconds * 1.5) + 50, seed=s.seed)
        t0 = engines.t0 = time.perf_counter()
        engines.events.clear()
        load = asyncio.create_task(run_load(workload, [router.url], MODEL, s.rate, seconds,
                                            seed=s.seed, progress=False))
        marks: dict[str, tuple[float, tuple[int, int]]] = {}

        async def mark(name: str, at: float) -> None:
            await asyncio.sleep(max(0.0, t0 + at - time.perf_counter()))
            marks[name] = (time.perf_counter(), await engines.totals())

        async def pick(old: list[Proc]) -> Proc:
            if st.order == "coldest":
                values = await published_values(redis_url, MODEL_KEY)
                return min(old, key=lambda p: (values.get(p.url, 0.0), p.url))
            return old[rng.randrange(len(old))]

        await mark("steady_start", s.warm_s)
        await mark("steady_end", s.warm_s + s.steady_s)
        began = time.perf_counter()
        await engines.roll(st.surge, st.unavailable, pick)
        took = time.perf_counter() - began
        await mark("window_end", s.warm_s + s.steady_s + s.window_s)
        log = await load

    def hit(a: str, b: str) -> float | None:
        (pa, ca), (pb, cb) = marks[a][1], marks[b][1]
        return ratio(cb - ca, pb - pa)

    steady = {"hit_rate": hit("steady_start", "steady_end"),
              **requests(log.results, 0.0, marks["steady_start"][0], marks["steady_end"][0])}
    during = {"hit_rate": hit("steady_end", "window_end"),
              **requests(log.results, 0.0, marks["steady_end"][0], marks["window_end"][0])}
    return {"strategy": asdict(st), "rollout_s": round(took, 1), "steady": steady,
            "during": during,
            "hit_ratio": ratio(during["hit_rate"], steady["hit_rate"], 3),
            "ttft_p50_ratio": ratio(during["ttft_p50_ms"], steady["ttft_p50_ms"], 3),
            "ttft_p99_ratio": ratio(during["ttft_p99_ms"], steady["ttft_p99_ms"], 3),
            "errors": sum(not r.ok for r in log.results), "events": engines.events}


def report(r: dict[str, Any], out: Path) -> None:
    rows = [(x["strategy"]["name"], fmt(x["steady"]["hit_rate"]), fmt(x["during"]["hit_rate"]),
             fmt(x["hit_ratio"]), fmt(x["steady"]["ttft_p50_ms"]), fmt(x["during"]["ttft_p50_ms"]),
             fmt(x["steady"]["ttft_p99_ms"]), fmt(x["during"]["ttft_p99_ms"]),
             fmt(x["rollout_s"]), str(x["errors"])) for x in r["runs"]]
    s = r["settings"]
    (out / "rollout.md").write_text("\n".join([
        "# A rolling update of the engines: hit rate and TTFT by strategy", "",
        f"Written by `{r['command']}` on {r['date_utc']}, {r['machine']}, code {r['version']}. "
        f"{s['engines']} simulators ({PROFILE}, {s['kv_capacity_tokens']} KV tokens each), "
        f"system-prompts at {s['rate']} req/s through one router (file discovery, Redis "
        f"store); steady = the {s['steady_s']:g} s before the rollout, during = the "
        f"{s['window_s']:g} s from its start. bench/rollout.py says what runs.", "",
        *md_table(("strategy", "hit steady", "hit during", "ratio", "TTFT p50 steady (ms)",
                   "p50 during", "p99 steady", "p99 during", "rollout (s)", "errors"), rows),
        ""]))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.rollout", description=__doc__)
    p.add_argument("--strategies", nargs="+", default=list(STRATEGIES), choices=STRATEGIES)
    p.add_argument("--quick", action="store_true", help="shorter windows")
    p.add_argument("--out", default="bench/results/lifecycle")
    args = p.parse_args(argv)
    s = Settings(warm_s=40.0, steady_s=40.0, window_s=120.0) if args.quick else Settings()
    command = "python -m bench.rollout " + shlex.join(argv if argv is not None else sys.argv[1:])
    provenance = stamp(command)  # of the code that runs, whatever is committed meanwhile
    log_dir = REPO / "bench" / ".logs" / f"rollout-{int(time.time())}"
    log_dir.mkdir(parents=True)
    print(f"rollout: logs in {log_dir}", flush=True)
    runs = []
    for name in args.strategies:
        runs.append(asyncio.run(one(STRATEGIES[name], s, log_dir)))
        x = runs[-1]
        print(f"  {name}: hit {x['steady']['hit_rate']} -> {x['during']['hit_rate']} "
              f"(x{x['hit_ratio']}), p50 x{x['ttft_p50_ratio']}, p99 x{x['ttft_p99_ratio']}, "
              f"{x['rollout_s']} s, {x['errors']} errors", flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    r = {**provenance, "date_utc": now_utc(), "settings": asdict(s), "runs": runs}
    (out / "rollout.json").write_text(json.dumps(r, indent=1) + "\n")
    report(r, out)


if __name__ == "__main__":
    main()
