"""A new router replica's first minute against a router that has run a while (issue 38, part
5): does a router that starts serve on the fleet's index?

    python -m bench.warm_router --mode redis|events [--engines 8] [--old-s 120]
        [--window-s 60] [--rate 6] [--workload system-prompts] [--json FILE]

Simulators in vLLM's token mode (KV events on, cached tokens reported). One router (`old`)
serves the workload alone for --old-s; then two more start: `new`, which shares the fleet's
index (mode redis: the shared table in Redis; mode events: it reads every engine's replay
before /readyz says ready), and `cold`, which does not (redis: a local table; events: no
replay socket, live events only). The same workload, continued, then goes round-robin over
the three for --window-s; each router's engine hit rate over that window is the cached tokens
the engines reported for its requests over their prompt tokens (the router's own
prefix_router_reported_* counters). The figures: new / old (the goal: >= 0.97) and cold / old
(what starting without the index costs).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import tempfile
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from engine_sim.hf_tokenizer import TINY_TOKENIZER

from .harness import capacity
from .harness.fleet import Fleet, Proc
from .harness.loadgen import run_load
from .harness.promtext import sample_sum
from .harness.workloads import Workload, build
from .provenance import publish
from .runner import MODEL, TOKEN_SIM_ARGS, tiny_tokenizer

PROFILE = "llama-3.1-70b-h100"


async def counters(metrics: str) -> tuple[float, float]:
    """(reported cached tokens, reported prompt tokens) of a router so far (`metrics`: its
    /metrics page)."""
    async with aiohttp.ClientSession() as s, s.get(metrics) as r:
        page = await r.text()
    return (sample_sum(page, "prefix_router_reported_cached_tokens_total"),
            sample_sum(page, "prefix_router_reported_prompt_tokens_total"))


async def start_router(fleet: Fleet, name: str, sims: list[Proc], kv: int, mode: str,
                       redis: str | None, warm: bool) -> Proc:
    settings: dict[str, Any] = {"models": [MODEL], "tokenizer": str(TINY_TOKENIZER),
                                "cached_tokens_reported": True}
    extra: list[str] = []
    if mode == "events":
        # the cold router hears live events only: no replay socket to catch up from
        ends = {p.url: p.events if warm else p.events.split(",")[0] for p in sims}
        settings.update(index="events", events={"endpoints": ends})
    elif warm:
        assert redis is not None
        extra += ["--store", "redis", "--redis-url", redis, "--model-key", "bench/model"]
    path = fleet.log_dir / f"{name}.yaml"
    fleet.log_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(settings))
    return await fleet.start_router(name, [p.url for p in sims], policy="prefix",
                                    kv_capacity=kv, extra=[*extra, "--config", str(path)])


async def run(a: argparse.Namespace) -> dict[str, Any]:
    count = capacity.run_count(a.rate, a.old_s + a.window_s) + 50
    wl = build(a.workload, count)
    r = capacity.token_ratio(wl, tiny_tokenizer())
    # the fleet holds the working set `room` times over, in the simulators' tokens
    kv = math.ceil(wl.working_set_tokens * r * a.room / a.engines / 16) * 16
    async with Fleet(Path(tempfile.mkdtemp(prefix="warm-router-"))) as fleet:
        sims = list(await asyncio.gather(*(fleet.start_sim(
            f"sim{k}", model=MODEL, kv_capacity=kv, profile=PROFILE, time_scale=1.0,
            kv_events=True, extra=list(TOKEN_SIM_ARGS)) for k in range(a.engines))))
        redis = await fleet.start_redis() if a.mode == "redis" else None
        old = await start_router(fleet, "old", sims, kv, a.mode, redis, warm=True)
        print(f"old router alone for {a.old_s:g}s at {a.rate:g} req/s", flush=True)
        first = await run_load(wl, [old.url], MODEL, a.rate, a.old_s, progress=False)
        new = await start_router(fleet, "new", sims, kv, a.mode, redis, warm=True)
        cold = await start_router(fleet, "cold", sims, kv, a.mode, redis, warm=False)
        routers = {"old": old, "new": new, "cold": cold}
        before = {k: await counters(p.metrics) for k, p in routers.items()}
        used = max((x.session for x in first.results), default=-1) + 1  # sessions started
        rest = Workload(wl.name, wl.sessions[used:], wl.working_set_tokens)
        print(f"old, new and cold round-robin for {a.window_s:g}s", flush=True)
        second = await run_load(rest, [p.url for p in routers.values()], MODEL, a.rate,
                                a.window_s, seed=8, progress=False)
        after = {k: await counters(p.metrics) for k, p in routers.items()}
    hit = {}
    for k in routers:
        cached, prompt = (after[k][i] - before[k][i] for i in (0, 1))
        hit[k] = round(cached / prompt, 4) if prompt else None
    ratio = {k: round(hit[k] / hit["old"], 3) if hit[k] is not None and hit["old"] else None
             for k in ("new", "cold")}  # fmt: skip
    return {"mode": a.mode, "engines": a.engines, "workload": a.workload, "rate": a.rate,
            "old_s": a.old_s, "window_s": a.window_s, "kv_capacity_tokens": kv,
            "room": a.room, "hit_rate": hit, "new_router_hit_ratio": ratio["new"],
            "cold_router_hit_ratio": ratio["cold"],
            "requests": len(second.results),
            "errors": sum(not x.ok for x in first.results + second.results)}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.warm_router", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=("redis", "events"), required=True)
    p.add_argument("--engines", type=int, default=8)
    p.add_argument("--old-s", type=float, default=120.0, help="the old router alone")
    p.add_argument("--window-s", type=float, default=60.0, help="the three together")
    p.add_argument("--rate", type=float, default=6.0, help="requests/s")
    p.add_argument("--workload", default="system-prompts")
    p.add_argument("--room", type=float, default=1.5,
                   help="the fleet's KV capacity over the workload's working set")
    p.add_argument("--json", type=Path, help="write the result here")
    a = p.parse_args(argv)
    publish("bench.warm_router", argv, lambda: asyncio.run(run(a)), a.json)


if __name__ == "__main__":
    main()
