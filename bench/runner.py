"""The one runner: any scenario of scenarios.py, round after round, on the same requests.

Per workload the simulators start once (or per run, `fresh_fleet`); for each round, rate (or
staircase) and setup in turn: the setup's routers start, the simulators are drained and reset,
the load generator sends the workload, the counters are read, the routers stop. Every setup
sees the same requests at the same offsets, and a drift of the host falls on every setup of a
round alike. Each point's JSON is rewritten after every round: an interrupted run keeps them."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from engine_sim.chat import render_chat
from engine_sim.hf_tokenizer import TINY_TOKENIZER, ChatTokenizer

from .harness import capacity, engines, figures, llama
from .harness.anchors import ANCHORS, PACKAGES, missing, start_anchor
from .harness.fleet import Fleet, Proc, cpu_seconds, free_port
from .harness.loadgen import RunLog, run_load
from .harness.oracle import oracle_hit_rate
from .harness.stats import point_row, ratio
from .harness.workloads import Workload, build, messages_for
from .provenance import now_utc, stamp
from .scenarios import Scenario, Setup, setup, speaks_tokens

RESULTS = Path("bench/results")
LOGS = Path("bench/.logs")
MODEL = "sim-llama-3.1-70b"
SHOWN = ("engine_hit_rate", "ttft_p50_ms", "ttft_p99_ms", "errors", "imbalance", "added_p50_ms",
         "added_p99_ms", "max_rps", "rss_mb", "rss_mb_1m_entries")  # each run's progress line
Step = tuple[RunLog, Any, Any, Any, dict[str, Any]]  # log, counters before/after/end, client
# vLLM's token mode (Scenario.kv_events): our tokenizer, cached tokens reported as vLLM does
TOKEN_SIM_ARGS = ("--tokenizer", "tiny", "--enable-prompt-tokens-details")
# what a point's JSON records of its scenario: every field but the report's
NOT_RECORDED = {"name", "help", "title", "method", "out", "rules", "columns", "group_by", "plot",
                "report", "parts", "quick", "setups", "workloads", "rates", "kind"}


@functools.cache
def tiny_tokenizer() -> ChatTokenizer:
    return ChatTokenizer(TINY_TOKENIZER)


@dataclass(frozen=True)
class Run:
    """A setup meets a workload at one rate (or a staircase's), in one round."""

    workload: str
    round: int
    setup: Setup
    rates: tuple[float, ...]
    client: str = "loadgen"


def engine_stats(sc: Scenario) -> engines.Stats:
    return llama.fetch_stats if sc.engine == "llama" else engines.fetch_stats


def model_of(sc: Scenario) -> str:
    return llama.MODEL if sc.engine == "llama" else MODEL


def plan(sc: Scenario) -> list[Run]:
    """Per workload, round after round; in a round the setups in turn at each rate."""
    out = []
    for w in sc.workloads:
        rates = sc.rates_of(w)
        for rnd in range(1, sc.repeats + 1):
            for block in [rates] if sc.staircase else [(r,) for r in rates]:
                out += [Run(w, rnd, setup(s), block, c) for s in sc.setups for c in sc.clients]
    return out


def point_path(sc: Scenario, workload: str, name: str, rate: float, client: str) -> Path:
    """One JSON per (workload, setup, rate, client), named as the committed results are."""
    many = "{rate" not in sc.out and (len(sc.rates_of(workload)) > 1 or "rate" in sc.group_by)
    parts = [workload if sc.kind == "routing" else "", name.replace("/", "_"),
             f"{rate:g}" if many else "", sc.tag, "" if client == "loadgen" else client]
    return RESULTS / sc.out.format(rate=rate) / ("-".join(p for p in parts if p) + ".json")


def workload_for(sc: Scenario, name: str, rates: tuple[float, ...]) -> tuple[Workload, int, int]:
    """(the sessions a run sends, the simulators' KV capacity, the working set it is for)."""
    if sc.kind == "overhead":  # its own small requests
        return Workload(name, [], 0), sc.kv_capacity or 1_000_000, 0
    if sc.requests:
        wl = build(name, sc.requests)
        if any(len(s.turns) != 1 for s in wl.sessions):
            raise ValueError(f"{name}: a fixed count of requests needs single-turn sessions")
        ws = capacity.run_working_set(wl, rates[0], sc.requests / rates[0])
    elif sc.staircase:
        need = sum(n for _, n in capacity.slices(1.0, rates, sc.seconds))
        wl = build(name, need)
        if any(len(s.turns) > 1 for s in wl.sessions):  # ~6.5 requests a conversation
            wl = build(name, 7 * need)
        # the capacity of the top rate, as if it all ran at it
        ws = capacity.run_working_set(wl, max(rates), sc.seconds * len(rates))
    else:
        peak = rates[0] * (sc.shape.peak if sc.shape else 1.0)
        wl = build(name, capacity.run_count(peak, sc.seconds))
        ws = capacity.run_working_set(wl, rates[0], sc.seconds, sc.profile, sc.time_scale,
                                      sc.seed, sc.shape)
    kv = capacity.kv_capacity(wl, ws)
    if sc.kv_events:  # sizes are in 4-byte tokens; the simulators count the tokenizer's
        r = capacity.token_ratio(wl, tiny_tokenizer())
        kv, ws = math.ceil(kv * r / 16) * 16, round(ws * r)
    if sc.ws_share:
        kv = math.ceil(ws / (sc.ws_share * sc.replicas) / 16) * 16
    return wl, sc.kv_capacity or kv, ws


def capacities(sc: Scenario, kv: int) -> list[int]:
    """Each simulator's KV capacity: `kv`, or `kv` x its share (whole blocks)."""
    shares = sc.kv_shares or (1.0,) * sc.replicas
    if len(shares) != sc.replicas:
        raise ValueError(f"{sc.name}: {len(shares)} kv_shares for {sc.replicas} replicas")
    return [max(16, round(kv * f / 16) * 16) for f in shares]


@dataclass
class Started:
    targets: list[str] = field(default_factory=list)  # the load goes round-robin over them
    routers: list[Proc] = field(default_factory=list)
    ours: bool = True  # our router: its /metrics and CPU are read
    redis: Proc | None = None
    redis_port: int = 0


async def start_setup(fleet: Fleet, sc: Scenario, s: Setup, sims: list[str], kv: int,
                      log_dir: Path, backends_file: Path | None = None) -> Started:
    """One setup's processes; our router is driven through its CLI and config only."""
    if s.router in ANCHORS:
        p = await start_anchor(fleet, s.router, sims)
        return Started([p.url], [p], ours=False)
    out, extra = Started(), []
    if s.store == "redis":
        out.redis_port = free_port()
        url = await fleet.start_redis(f"{s.name}-redis", out.redis_port)
        out.redis = fleet.procs[-1]
        extra += ["--store", "redis", "--redis-url", url, "--model-key", "bench/model"]
    settings = json.loads(json.dumps(dict(s.settings)))
    if settings.get("index") == "events":  # where each simulator publishes
        settings.setdefault("events", {})["endpoints"] = {
            p.url: p.events for p in fleet.procs if p.url in sims and p.events}
    if settings:
        path = log_dir / f"{abs(hash(s.name))}.yaml"
        path.write_text(yaml.safe_dump(settings))
        extra += ["--config", str(path)]
    if s.settings.get("log_decisions"):  # decision lines are info; the harness's default warns
        extra += ["--log-level", "info"]
    if backends_file is not None:
        sims, extra = [], [*extra, "--discovery", "file", "--backends-file", str(backends_file)]
    for k in range(s.replicas):
        out.routers.append(await fleet.start_router(
            f"{s.name}-{k}", sims, policy=s.router, kv_capacity=kv, extra=extra,
            env=dict(s.env) or None))
        out.targets.append(out.routers[-1].url)
    return out


async def events(sc: Scenario, fleet: Fleet, sims: list[str], started: Started,
                 backends_file: Path | None, restarted: dict[str, Any]) -> None:
    """Each event at its fraction of the run: replicas join (the backends file gains them),
    Redis killed and back empty, a simulator killed and started again on its ports (its
    counters from before go to `restarted`: the new process counts from 0)."""
    t0 = time.perf_counter()

    async def restart() -> None:
        k = sc.restart[0]  # type: ignore[index]
        [restarted["before"]] = await engines.fetch_stats([sims[k]])
        t = time.perf_counter()
        await fleet.restart(next(p for p in fleet.procs if p.url == sims[k]))
        restarted["down_s"] = round(time.perf_counter() - t, 2)

    todo: list[tuple[float, str, Any]] = []
    if sc.join_at is not None and backends_file is not None:
        todo.append((sc.join_at, "replicas joined",
                     lambda: backends_file.write_text("\n".join(sims) + "\n")))
    if sc.redis_down and (redis := started.redis):
        todo += [(sc.redis_down[0], "redis killed", lambda: fleet.stop(redis, "kill")),
                 (sc.redis_down[1], "redis back, empty",
                  lambda: fleet.start_redis("redis-restarted", started.redis_port))]
    if sc.restart:
        todo.append((sc.restart[1], f"sim{sc.restart[0]} restarted", restart))
    for at, what, do in sorted(todo, key=lambda e: e[0]):
        await asyncio.sleep(max(0.0, t0 + at * sc.seconds - time.perf_counter()))
        if asyncio.iscoroutine(result := do()):
            await result
        print(f"    t={at * sc.seconds:.0f}s: {what}", flush=True)


async def timeline(sc: Scenario, sims: list[str], series: list[dict[str, Any]]) -> None:
    """Every sample_s, over the window: the hit rate, the joined replicas' share of requests."""
    t0, k = time.perf_counter(), sc.first_replicas or len(sims)
    last = await engines.snapshot(sims)
    while True:
        await asyncio.sleep(sc.sample_s)
        now = await engines.snapshot(sims)
        f = figures.step_figures(RunLog(), last, now)
        served, last = f["per_replica_requests"], now
        series.append({"t": round(now["t"] - t0, 1), "hit_rate": f["engine_hit_rate"],
                       "new_share": ratio(sum(served[k:]), sum(served)) or 0.0})


async def drive(sc: Scenario, run: Run, wl: Workload, sims: list[str],
                targets: list[str]) -> list[Step]:
    """One step, or the staircase's steps back to back, each a fresh slice of the sequence."""
    n, cuts = len(run.rates), [(0, len(wl.sessions))]
    if sc.staircase:
        cuts = capacity.slices(sum(len(s.turns) for s in wl.sessions) / len(wl.sessions), run.rates,
                      sc.seconds)
        if cuts[-1][0] + cuts[-1][1] > len(wl.sessions):
            raise ValueError(f"{wl.name}: {len(wl.sessions)} sessions, the staircase needs more")
    seconds = sc.requests / run.rates[0] * 3 + 30 if sc.requests else sc.seconds
    stats = engine_stats(sc)
    snaps, tasks = [await engines.snapshot(sims, stats)], []
    for k, (rate, (first, count)) in enumerate(zip(run.rates, cuts, strict=True)):
        part = dataclasses.replace(wl, sessions=wl.sessions[first:first + count])
        tasks.append(asyncio.create_task(run_load(
            part, targets, model_of(sc), rate, seconds, seed=sc.seed + k,
            drain_timeout=(n - 1 - k) * seconds + sc.drain_s, progress=n == 1 and not sc.requests,
            session_header="X-Session-ID" if sc.session_header else None,
            session_id_offset=first, api=sc.api, shape=sc.shape)))  # type: ignore[arg-type]
        if n > 1:
            await asyncio.sleep(max(0.0, snaps[0]["t"] + (k + 1) * seconds - time.perf_counter()))
            snaps.append(await engines.snapshot(sims, stats))
    logs = await asyncio.gather(*tasks)
    final = await engines.snapshot(sims, stats)
    return [(log, snaps[k], snaps[k + 1] if k < n - 1 else final,
             snaps[k + 1] if n > 1 else final, {}) for k, log in enumerate(logs)]


async def third_party(run: Run, wl: Workload, sims: list[str], url: str,
                      log_dir: Path) -> list[Step]:
    """inference-perf sending the load generator's requests (the chat template's rendering of
    each session's one turn); its client figures stand in for the log's."""
    from .harness.thirdparty import run_inference_perf

    prompts = [(render_chat(messages_for(s, 0, [])), s.turns[0].max_tokens) for s in wl.sessions]
    before = await engines.snapshot(sims)
    client = await run_inference_perf(url, MODEL, prompts, run.rates[0],
                                      log_dir / f"inference-perf-{run.setup.name}",
                                      timeout=len(prompts) / run.rates[0] + 300)
    return [(RunLog(), before, after := await engines.snapshot(sims), after, client)]


async def measure(sc: Scenario, fleet: Fleet, sims: list[str], run: Run, *, wl: Workload,
                  kv: int, log_dir: Path) -> list[dict[str, Any]]:
    """Start the setup, drain and reset the fleet, drive the load, read the figures (one dict
    per rate), stop the setup."""
    backends_file = log_dir / "backends" if sc.first_replicas else None
    if backends_file:
        backends_file.write_text("\n".join(sims[:sc.first_replicas]) + "\n")
    first, series, restarted = len(fleet.procs), [], {}
    try:
        started = await start_setup(fleet, sc, run.setup, sims, round(kv * sc.capacity_factor),
                                    log_dir, backends_file)
        clean = await engines.settle(sims, engine_stats(sc))
        routers = started.routers if started.ours else []
        urls = [p.metrics for p in routers]
        redis_url = f"redis://127.0.0.1:{started.redis_port}/0" if started.redis else None
        r0, calls0 = await engines.router_figures(urls), await engines.redis_calls(redis_url)
        cpu0, load = sum(cpu_seconds(p.process.pid) for p in routers), os.getloadavg()[0]
        tasks = [asyncio.create_task(events(sc, fleet, sims, started, backends_file, restarted))]
        if sc.sample_s:
            tasks.append(asyncio.create_task(timeline(sc, sims, series)))
        try:
            steps = await (third_party(run, wl, sims, started.targets[0], log_dir)
                           if run.client == "inference-perf" else
                           drive(sc, run, wl, sims, started.targets))
            await tasks[0]  # done long before the drain ends; an error in it is the run's
        finally:
            for t in tasks:
                t.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await t
        if restarted:
            k = sc.restart[0]  # type: ignore[index]
            steps = [(log, before, figures.carried(after, k, restarted["before"]),
                      figures.carried(end, k, restarted["before"]), client)
                     for log, before, after, end, client in steps]
        cpu = sum(cpu_seconds(p.process.pid) for p in routers) - cpu0
        r1, calls = await engines.router_figures(urls), await engines.redis_calls(redis_url)
    finally:
        for p in fleet.procs[first:]:  # also what a failed start left running
            await fleet.stop(p)
    step = llama.step_figures if sc.engine == "llama" else figures.step_figures
    out = []
    for log, before, after, end, client in steps:
        fig = {**step(log, before, after, end), **client, "caches_emptied_before": clean,
               "load_1m": round(load, 2), "measured_at": now_utc()}
        if restarted:
            fig["restart_down_s"] = restarted["down_s"]
        if len(steps) == 1 and log.sent and sc.engine == "sim":  # from empty caches: comparable
            fig["oracle_hit_rate"] = round(oracle_hit_rate(
                log.sent, sum(capacities(sc, kv)), answers=log.answers,
                tokenizer=tiny_tokenizer() if sc.kv_events else None, tools=log.tools), 4)
            fig["hit_over_oracle"] = ratio(fig["engine_hit_rate"], fig["oracle_hit_rate"])
            if (measured := capacity.measured_working_set(wl, log.results)) is not None:
                fig["working_set_measured_tokens"] = measured
                if warn := capacity.capacity_warning(kv, measured, sc.replicas):
                    fig["capacity_warning_measured"] = warn
        if routers and log.sent:
            fig.update(figures.router_figures(r1, r0, len(log.sent),
                                              calls - calls0 if redis_url else None))
            fig["router_cpu_ms_per_request"] = round(1000 * cpu / len(log.sent), 3)
        if series:
            figures.window_ttfts(series, log.results, log.started, sc.sample_s)
            fig["series"] = series
            if sc.join_at is not None:
                at = sc.join_at * sc.seconds
                fig["seconds_to_40pct"] = figures.time_to_share(series, at, 0.40)
                fig.update(figures.after_join(series, at, 30.0))
            if sc.redis_down:
                fig["recovery_s"] = figures.recovery_seconds(
                    series, *(f * sc.seconds for f in sc.redis_down))
        out.append(fig)
    return out


def head(sc: Scenario, run: Run, rate: float, kv: int, ws: int) -> dict[str, Any]:
    """How a point was run: its identity, setup and every scenario field set (figures follow)."""
    s, default = run.setup, Scenario("", "")
    out = {"scenario": sc.name, "workload": run.workload, "router": s.name, "rate": rate,
           "client": run.client, "seconds": sc.seconds, "replicas": sc.replicas,
           "router_replicas": s.replicas, "store": s.store, "settings": dict(s.settings),
           "router_env": dict(s.env), "kv_capacity_tokens": kv, "working_set_tokens": ws,
           "router_version": PACKAGES[ANCHORS[s.router].package].spec
           if s.router in ANCHORS else None,  # an anchor's pin; ours is the stamp's version
           "sim_args": list(TOKEN_SIM_ARGS) if sc.kv_events else None,
           "kv_capacities": capacities(sc, kv) if sc.kv_shares else None,
           "capacity_warning": None if sc.engine == "llama" else capacity.capacity_warning(
               kv, ws, sc.replicas), **(llama.describe(sc.engine_config)
                                        if sc.engine == "llama" else {})}
    for f in dataclasses.fields(sc):
        v = getattr(sc, f.name)
        if f.name not in NOT_RECORDED and f.name not in out and v != getattr(default, f.name):
            out[f.name] = dataclasses.asdict(v) | {"kind": type(v).__name__.lower()} \
                if dataclasses.is_dataclass(v) else v
    return {k: v for k, v in out.items() if v not in (None, "", {}, [])}


def _duration(d: float) -> str:
    return f"{d / 60:.0f} min" if d >= 90 else f"{d:.0f} s"


async def run_scenario(sc: Scenario, command: str, write: bool = True) -> list[dict[str, Any]]:
    """Every run of `sc`'s plan; returns (and writes, one JSON per point) its points."""
    if sc.kind == "overhead":
        from .overhead import measure as measure_run
    else:
        measure_run = measure
    runs = plan(sc)
    if not sc.kv_events and any(speaks_tokens(r.setup) for r in runs):
        sc = dataclasses.replace(sc, kv_events=True)  # every setup on the same simulators
    for s in {r.setup.router for r in runs} & set(ANCHORS):
        if why := missing(ANCHORS[s]):  # the others run; the report says what is missing
            print(f"skip {s}: {why}", flush=True)
            runs = [r for r in runs if r.setup.router != s]
    provenance, log_root = stamp(command), LOGS / f"{sc.name}-{int(time.time())}"
    rounds: dict[tuple, list[dict[str, Any]]] = {}
    points: dict[tuple, dict[str, Any]] = {}
    planned = sum(len(r.rates) * sc.seconds + 10 for r in runs)
    t_start, done = time.monotonic(), 0.0
    fleet, fleet_key, sims, built = None, None, [], {}
    try:
        for i, run in enumerate(runs, 1):
            if (run.workload, run.rates) not in built:
                built[run.workload, run.rates] = workload_for(sc, run.workload, run.rates)
            wl, kv, ws = built[run.workload, run.rates]
            if fleet is None or sc.fresh_fleet or fleet_key != (run.workload, kv):
                if fleet is not None:
                    await fleet.close()
                fleet, fleet_key = Fleet(log_root / f"{run.workload}-{i}"), (run.workload, kv)
                sims = await (llama.start_engines(fleet, sc.replicas, sc.engine_config)
                              if sc.engine == "llama" else start_sims(fleet, sc, kv))
            elapsed = time.monotonic() - t_start
            left = (planned - done) * (elapsed / done if done else 1.0)
            via = run.setup.name + ("" if run.client == "loadgen" else f" ({run.client})")
            print(f"[{i}/{len(runs)}] {sc.name}: {run.workload or 'the simulator'} via {via} at "
                  f"{', '.join(f'{r:g}' for r in run.rates)} req/s, round {run.round}/"
                  f"{sc.repeats}; {_duration(elapsed)} elapsed, about {_duration(left)} left",
                  flush=True)
            try:
                figs = await measure_run(sc, fleet, sims, run, wl=wl, kv=kv,
                                         log_dir=fleet.log_dir)
            except (RuntimeError, TimeoutError) as e:
                print(f"  {run.setup.name} failed: {str(e)[-500:]}", flush=True)
                continue
            finally:
                done += len(run.rates) * sc.seconds + 10
            for rate, fig in zip(run.rates, figs, strict=True):
                key = (run.workload, run.setup.name, rate, run.client)
                rounds.setdefault(key, []).append(fig)
                points[key] = point_row(head(sc, run, rate, kv, ws), rounds[key], provenance)
                print(f"  {rate:g} req/s: " + ", ".join(f"{k} {fig[k]}" for k in SHOWN if k in fig),
                      flush=True)
                if write:
                    path = point_path(sc, run.workload, run.setup.name, rate, run.client)
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.write_text(json.dumps(points[key], indent=2) + "\n")
    finally:
        if fleet is not None:
            await fleet.close()
    print(f"{sc.name}: {len(points)} points in {_duration(time.monotonic() - t_start)}",
          flush=True)
    return list(points.values())


async def start_sims(fleet: Fleet, sc: Scenario, kv: int) -> list[str]:
    def extra(cap: int) -> list[str]:
        cpu = ["--kv-offloading-tokens", str(round(cap * sc.cpu_tier))] if sc.cpu_tier else []
        return [*(TOKEN_SIM_ARGS if sc.kv_events else ()), *cpu]

    return [p.url for p in await asyncio.gather(*(fleet.start_sim(
        f"sim{k}", model=MODEL, kv_capacity=cap, profile=sc.profile, time_scale=sc.time_scale,
        kv_events=sc.kv_events, extra=extra(cap))
        for k, cap in enumerate(capacities(sc, kv))))]
