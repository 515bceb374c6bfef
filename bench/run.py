"""One benchmark run: N simulators, a router (or several replicas), a load generator.

Every hit-rate figure comes from the simulators' own counters (GET /stats), never from the
router. The simulators' KV capacity is chosen per workload so that one replica holds at most a
quarter of the working set while the whole fleet holds all of it: routing has to matter. A run
whose replica count breaks that says so (capacity_warning) and runs anyway.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import aiohttp
import redis.asyncio as aioredis

from engine_sim.profiles import PROFILES

from .fleet import Fleet, cpu_seconds
from .loadgen import Result, run_load
from .oracle import oracle_hit_rate
from .stats import imbalance, ms, percentile, percentiles_ms
from .workloads import (
    LiveTurn,
    Workload,
    build,
    largest_request,
    live_peak,
    persona_tokens,
    session_starts,
    working_set,
)

MODEL = "sim-llama-3.1-70b"
PROFILE = "llama-3.1-70b-h100"

# Per-replica KV capacity (tokens) of the single-turn workloads, about 0.19 of their working
# set (workloads.py), so 6 or more replicas hold all of it: system-prompts / hotspot: 128k
# tokens -> 24k (0.19; 8 replicas hold 192k). customers: 1.8M -> 340k (0.19; 8 hold 2.72M).
# unique: nothing to share, so no capacity makes routing matter to the hit rate -> 32k.
# multi-turn is not here: its working set grows with the rate (kv_capacity()).
KV_CAPACITY = {
    "system-prompts": 24_000,
    "hotspot": 24_000,
    "customers": 340_000,
    "unique": 32_000,
}

# multi-turn's capacity per replica as a share of its modelled working set. That model is a
# lower bound (working_set(): turns at the unloaded decode step, 15 ms a token); turns measured
# at 24 req/s took 18-22 ms a token (e2e p50 2.9-3.5 s for a mean of 160 tokens, with 48k a
# replica, bench/results/compare/full), a working set about 1.2-1.5x the bound. 0.22 keeps one
# replica under a quarter of the bound, so of the real working set too, and 8 replicas hold
# 1.76x the bound. A run also measures the working set it sent (measured_working_set) and
# warns if that breaks the rule.
MULTI_TURN_KV_SHARE = 0.22


def run_count(rate: float, seconds: float) -> int:
    """Sessions a run builds: 20% over what `rate` for `seconds` sends, and 50 more."""
    return int(rate * seconds * 1.2) + 50


def run_working_set(
    wl: Workload, rate: float, seconds: float, profile: str = PROFILE, time_scale: float = 1.0,
    seed: int = 7,
) -> int:
    """The working set of `wl` sent at `rate` for `seconds` as run_load sends it, its turns
    lasting the profile's decode step a token."""
    step = PROFILES[profile].step_base_s * time_scale
    return working_set(wl, session_starts(wl, rate, seconds, seed), step)


def kv_capacity(wl: Workload, working_set_tokens: int, block_size: int = 16) -> int:
    """Per-replica KV capacity (tokens) for `wl`. Not a function of the replica count: a
    replica's memory is what it is, and a fleet too small to hold the working set is warned
    about (capacity_warning), not given bigger replicas."""
    if wl.name in KV_CAPACITY:
        return KV_CAPACITY[wl.name]
    # at least the largest request: the simulator refuses one it cannot hold
    kv = max(round(MULTI_TURN_KV_SHARE * working_set_tokens), largest_request(wl))
    return -(-kv // block_size) * block_size


def measured_working_set(wl: Workload, results: Sequence[Result]) -> int | None:
    """A multi-turn run's working set as it was sent: live_peak() over the turns' real send
    times, each turn holding the prompt and answer tokens its engine reported. The schedule
    run_working_set() models has no queueing, so this one is the check on it. None for a
    workload of single-turn sessions (its working set does not depend on timing)."""
    if all(len(s.turns) <= 1 for s in wl.sessions):
        return None
    last: dict[int, int] = {}
    for r in results:
        last[r.session] = max(last.get(r.session, -1), r.turn)
    turns: list[LiveTurn] = []
    for r in results:
        s = wl.sessions[r.session]
        shared = persona_tokens(s)
        # a failed turn reported nothing: its blocks were freed and its conversation ends
        tokens = 0 if r.prompt_tokens is None else r.prompt_tokens + r.output_tokens - shared
        turns.append((r.sent_at, r.session, s.system or "", shared, tokens,
                      r.turn == last[r.session]))
    return live_peak(turns)


def capacity_warning(kv: int, working_set_tokens: int, replicas: int) -> str | None:
    """Why a run breaks the rule that one replica holds at most a quarter of the working set
    and the fleet all of it; None if it keeps it. A workload with nothing to share (working
    set 0) keeps it trivially: no routing raises its hit rate above 0."""
    if working_set_tokens <= 0:
        return None
    problems = []
    if 4 * kv > working_set_tokens:
        problems.append(f"one replica holds {kv / working_set_tokens:.2f} of it (> 0.25)")
    if kv * replicas < working_set_tokens:
        problems.append(f"{replicas} replicas hold {kv * replicas / working_set_tokens:.2f} "
                        "of it (< 1)")
    if not problems:
        return None
    return (f"KV capacity {kv:,} tokens per replica, working set {working_set_tokens:,} tokens: "
            + " and ".join(problems) + "; routing may not matter as the benchmark intends")


@dataclass
class RunConfig:
    workload: str
    router: str = "prefix"
    replicas: int = 8
    rate: float = 10.0
    seconds: float = 60.0
    router_replicas: int = 1
    store: str = "local"
    profile: str = PROFILE
    time_scale: float = 1.0
    kv_capacity: int | None = None
    max_num_seqs: int = 256
    seed: int = 7
    log_dir: str = "bench/.logs"
    router_args: tuple[str, ...] = ()
    redis_url: str | None = None
    # JSON Lines of every request (send time, TTFT, e2e, cached/prompt tokens, routed to)
    requests_out: str | None = None


async def fetch_stats(urls: list[str]) -> list[dict]:
    async with aiohttp.ClientSession() as s:

        async def one(u: str) -> dict:
            async with s.get(u + "/stats") as r:
                return await r.json()

        return list(await asyncio.gather(*(one(u) for u in urls)))


# Counters behind the router's predicted-vs-reported hit rate (index drift).
_DRIFT = (
    'prefix_router_store_round_trips{kind="request"}',
    'prefix_router_store_round_trips{kind="timer"}',
    "prefix_router_store_slow_lookups",
    "prefix_router_predicted_cached_tokens_total",
    "prefix_router_reported_cached_tokens_total",
    "prefix_router_reported_prompt_tokens_total",
    "prefix_router_prompt_tokens_total",
)


async def fetch_router_figures(
    router_urls: list[str],
) -> tuple[dict[str, float], dict[str, float]]:
    """(routing decisions by reason, drift counters), summed over router replicas' /metrics."""
    decisions: dict[str, float] = {}
    counters: dict[str, float] = {}
    async with aiohttp.ClientSession() as s:
        for u in router_urls:
            async with s.get(u + "/metrics") as r:
                text = await r.text()
            for line in text.splitlines():
                if line.startswith("prefix_router_routing_decisions_total{"):
                    reason = line.split('decision="', 1)[1].split('"', 1)[0]
                    decisions[reason] = decisions.get(reason, 0.0) + float(line.rsplit(" ", 1)[1])
                    continue
                name = line.split(" ", 1)[0]
                if name in _DRIFT:
                    counters[name] = counters.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return decisions, counters


def drift(counters: dict[str, float]) -> dict[str, float | None]:
    """The router's predicted hit rate next to what the engines reported (index drift)."""
    pred = counters.get("prefix_router_predicted_cached_tokens_total", 0.0)
    rep = counters.get("prefix_router_reported_cached_tokens_total", 0.0)
    rep_prompt = counters.get("prefix_router_reported_prompt_tokens_total", 0.0)
    prompt = counters.get("prefix_router_prompt_tokens_total", 0.0)
    return {
        "router_predicted_hit_rate": round(pred / prompt, 4) if prompt else None,
        "engine_reported_hit_rate": round(rep / rep_prompt, 4) if rep_prompt else None,
    }


async def redis_calls(url: str) -> int:
    """Commands Redis has executed (INFO commandstats), summed over commands."""
    r = aioredis.from_url(url)
    try:
        info = await r.info("commandstats")
    finally:
        await r.aclose()
    return sum(int(v["calls"]) for v in info.values())


def store_traffic(
    cfg: RunConfig, after: dict[str, float], before: dict[str, float], calls: int, sent: int
) -> dict[str, float]:
    """Round trips (counted by the routers) and commands (counted by Redis) per request.

    Round trips come in two kinds: those requests cause (lookups, write-back flushes) and the
    timer-driven load and figures exchanges. Redis's command count includes both, and every
    command run inside the Lua scripts.
    """
    if cfg.store != "redis" or not sent:
        return {}

    def delta(kind: str) -> float:
        key = f'prefix_router_store_round_trips{{kind="{kind}"}}'
        return after.get(key, 0.0) - before.get(key, 0.0)

    return {
        "redis_round_trips_per_request": round(delta("request") / sent, 3),
        "redis_timer_round_trips_per_request": round(delta("timer") / sent, 3),
        "redis_commands_per_request": round(calls / sent, 3),
        # lookups over the per-request budget, routed on the router's own local table
        "redis_slow_lookup_share": round(
            (after.get("prefix_router_store_slow_lookups", 0.0)
             - before.get("prefix_router_store_slow_lookups", 0.0)) / sent, 4),
    }


async def start_sims(
    fleet: Fleet, n: int, kv: int, profile: str, time_scale: float, max_num_seqs: int = 256
) -> list[str]:
    """`n` simulated replicas started at once; their URLs."""
    sims = await asyncio.gather(
        *(
            fleet.start_sim(
                f"sim{i}",
                model=MODEL,
                kv_capacity=kv,
                profile=profile,
                time_scale=time_scale,
                max_num_seqs=max_num_seqs,
            )
            for i in range(n)
        )
    )
    return [p.url for p in sims]


async def reset(urls: list[str]) -> None:
    async with aiohttp.ClientSession() as s:
        await asyncio.gather(*(s.post(u + "/reset") for u in urls))


async def run(cfg: RunConfig) -> dict:
    wl = build(cfg.workload, run_count(cfg.rate, cfg.seconds))
    ws = run_working_set(wl, cfg.rate, cfg.seconds, cfg.profile, cfg.time_scale, cfg.seed)
    kv = cfg.kv_capacity or kv_capacity(wl, ws)
    warning = capacity_warning(kv, ws, cfg.replicas)
    if warning:
        print(f"warning: {warning}", file=sys.stderr, flush=True)
    log_dir = Path(cfg.log_dir) / f"{cfg.workload}-{cfg.router}-{int(time.time())}"
    async with Fleet(log_dir) as fleet:
        sim_urls = await start_sims(
            fleet, cfg.replicas, kv, cfg.profile, cfg.time_scale, cfg.max_num_seqs
        )
        extra = list(cfg.router_args)
        url = ""
        if cfg.store == "redis":
            url = cfg.redis_url
            if not url:
                url = await fleet.start_redis()
            extra += ["--store", "redis", "--redis-url", url, "--model-key", "bench/model"]
        routers = []
        for k in range(cfg.router_replicas):
            routers.append(
                await fleet.start_router(
                    f"router{k}", sim_urls, policy=cfg.router, kv_capacity=kv, extra=extra
                )
            )
        targets = [r.url for r in routers]
        await reset(sim_urls)
        cpu_before = [cpu_seconds(r.process.pid) for r in routers]
        _d, before = await fetch_router_figures(targets)
        calls_before = await redis_calls(url) if cfg.store == "redis" else 0
        log = await run_load(
            wl, targets, MODEL, cfg.rate, cfg.seconds, seed=cfg.seed,
            tag_requests=True,
        )
        router_cpu = sum(cpu_seconds(r.process.pid) for r in routers) - sum(cpu_before)
        stats = await fetch_stats(sim_urls)
        decisions, counters = await fetch_router_figures(targets)
        calls = await redis_calls(url) - calls_before if cfg.store == "redis" else 0
    timed = timings_by_id(stats)
    if cfg.requests_out:
        write_requests(log.results, log.started, timed, cfg.requests_out)
    measured = measured_working_set(wl, log.results)
    measured_warning = None if measured is None else capacity_warning(kv, measured, cfg.replicas)
    if measured_warning:
        print(f"warning: as sent: {measured_warning}", file=sys.stderr, flush=True)
    ok = [r for r in log.results if r.ok]
    ttfts = [r.ttft for r in ok if r.ttft is not None]
    e2es = [r.e2e for r in ok if r.e2e is not None]
    prompt = sum(s["prompt_tokens"] for s in stats)
    cached = sum(s["cached_tokens"] for s in stats)
    served = [s["requests"] for s in stats]
    engine_ttfts = [t for s in stats for t in s.get("ttft_s", ())]
    wall = log.finished - log.started
    out_tokens = sum(r.output_tokens for r in ok)
    result = {
        "workload": cfg.workload,
        "router": cfg.router,
        "replicas": cfg.replicas,
        "router_replicas": cfg.router_replicas,
        "store": cfg.store,
        "rate": cfg.rate,
        "seconds": cfg.seconds,
        "profile": cfg.profile,
        "time_scale": cfg.time_scale,
        "kv_capacity_tokens": kv,
        "working_set_tokens": ws,
        **({"capacity_warning": warning} if warning else {}),
        **({"working_set_measured_tokens": measured} if measured is not None else {}),
        **({"capacity_warning_measured": measured_warning} if measured_warning else {}),
        "requests_sent": len(log.sent),
        "requests_ok": len(ok),
        "errors": len(log.sent) - len(ok),
        # later turns of conversations that stopped at a failed turn (or were cut at the drain
        # timeout): never sent, so not in `errors`
        "unsent": log.planned - len(log.sent),
        "engine_hit_rate": round(cached / prompt, 4) if prompt else 0.0,
        "oracle_hit_rate": round(
            oracle_hit_rate(log.sent, kv * cfg.replicas, answers=log.answers), 4
        ),
        **percentiles_ms(ttfts),
        # The engines' own arrival-to-first-token: the client's TTFT less the router, the
        # network stack and the streaming path.
        "engine_ttft_p50_ms": ms(percentile(engine_ttfts, 50)),
        "engine_ttft_p99_ms": ms(percentile(engine_ttfts, 99)),
        # Each TTFT in pieces (every request carries an x-request-id the simulators time):
        # medians of to-the-engine, the simulator's parse, the engine, its write, and back.
        "ttft_split_p50_ms": split_p50s(log.results, timed),
        "e2e_p50_ms": ms(percentile(e2es, 50)),
        "e2e_p99_ms": ms(percentile(e2es, 99)),
        "throughput_rps": round(len(ok) / wall, 3) if wall else 0.0,
        "output_tokens_per_s": round(out_tokens / wall, 1) if wall else 0.0,
        "imbalance": round(imbalance(served) or 0.0, 3),
        "per_replica_requests": served,
        # CPU the router process(es) used while the load ran, per request sent
        "router_cpu_ms_per_request": round(1000 * router_cpu / len(log.sent), 3)
        if log.sent
        else None,
        **drift(counters),
        **store_traffic(cfg, counters, before, calls, len(log.sent)),
        "decisions": decisions,
        "per_replica_hit_rate": [
            round(s["cached_tokens"] / s["prompt_tokens"], 3) if s["prompt_tokens"] else 0.0
            for s in stats
        ],
    }
    return result


SPLIT = ("to_engine", "engine_parse", "engine_ttft", "engine_write", "back")


def ttft_split(r: Result, timed: dict[str, Sequence[Any]]) -> dict[str, float] | None:
    """A request's TTFT in pieces (ms), where the simulator timed it (the clocks are one,
    CLOCK_MONOTONIC): `to_engine` from the client's send to the simulator's handler (client,
    network, router), `engine_parse` the simulator's own parsing before the engine has it,
    `engine_ttft` the engine's arrival to first token, `engine_write` first token to its chunk
    written, `back` the rest: from that write to the client's first content (router,
    network, client)."""
    t = timed.get(r.request_id)
    if t is None or r.ttft is None:
        return None
    _tag, received, arrived, first, written = t
    return {
        "to_engine": 1000 * (received - r.sent_at),
        "engine_parse": 1000 * (arrived - received),
        "engine_ttft": 1000 * (first - arrived),
        "engine_write": 1000 * (written - first),
        "back": 1000 * (r.sent_at + r.ttft - written),
    }


def timings_by_id(stats: list[dict]) -> dict[str, Sequence[Any]]:
    return {t[0]: t for s in stats for t in s.get("timings", ())}


def split_p50s(
    results: list[Result], timed: dict[str, Sequence[Any]]
) -> dict[str, float | None]:
    """Median of each piece of the TTFT over the requests the simulators timed."""
    parts: dict[str, list[float]] = {k: [] for k in SPLIT}
    for r in results:
        split = ttft_split(r, timed)
        if split is not None:
            for k, v in split.items():
                parts[k].append(v)
    out: dict[str, float | None] = {}
    for k, values in parts.items():
        p = percentile(values, 50)
        out[k] = None if p is None else round(p, 3)
    return out


def write_requests(
    results: list[Result], started: float, timed: dict[str, Sequence[Any]], path: str
) -> None:
    """One JSON object per request, in the order they finished, with its TTFT split where
    the simulator timed it (`<piece>_ms`, see ttft_split)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with Path(path).open("w") as f:
        for r in results:
            row = asdict(r)
            row["sent_at"] = round(r.sent_at - started, 6)
            row["sent_perf"] = r.sent_at  # perf_counter: to join with other processes' clocks
            split = ttft_split(r, timed)
            for k, v in (split or {}).items():
                row[f"{k}_ms"] = round(v, 3)
            f.write(json.dumps(row) + "\n")


def write_json(result: dict, path: str | None) -> None:
    text = json.dumps(result, indent=2)
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(text + "\n")
    print(text)
