"""Router overhead: the same small requests sent directly to a zero-latency simulator and
through one router process; the difference is what the router adds.

Also: the most requests/s one router process forwards (closed loop, 64 concurrent clients),
and the resident memory of a router process.

`python -m bench overhead` measures our router (and the RSS of a table with 1,000,000
ownership entries); `python -m bench overhead-all` measures ours and each anchor router
(bench/anchors.py) the same way, one after the other in front of ONE simulator, and writes
one JSON per router and the table of bench/results/overhead/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from .anchors import ANCHORS, install, start_anchor
from .compare import ANCHOR_NAMES, SETUP_S, _git_version, _write, router_info
from .compare import skip_reason as anchor_skip_reason
from .fleet import Fleet, Proc
from .overhead_table import write_readme
from .provenance import machine, now_utc
from .run import reset
from .stats import ms, percentile

MODEL = "sim-zero"
# A request that never finishes must not hang a run (an answer of the zero sim takes ~1 ms).
TIMEOUT = aiohttp.ClientTimeout(total=30)
WARM_S = 2.0
CLIENTS = 64
MAX_SECONDS = 10.0


def _body(rng: random.Random) -> bytes:
    # Non-streaming completions without a `stream` field: every router here takes it as is
    # (the overhead-all smoke checked), so every router is sent the very same bytes.
    prompt = "route me please " * rng.randint(4, 16)
    return json.dumps({"model": MODEL, "prompt": prompt, "max_tokens": 1}).encode()


@dataclass
class Sample:
    """Latencies (s) of the requests answered 200; the others counted, a few reasons kept."""

    latencies: list[float] = field(default_factory=list)
    errors: int = 0
    first_errors: list[str] = field(default_factory=list)

    def fail(self, reason: str) -> None:
        self.errors += 1
        if reason not in self.first_errors and len(self.first_errors) < 3:
            self.first_errors.append(reason)


async def _post(s: aiohttp.ClientSession, url: str, body: bytes, out: Sample) -> bool:
    try:
        async with s.post(
            url + "/v1/completions", data=body, headers={"Content-Type": "application/json"}
        ) as r:
            text = await r.read()
            if r.status != 200:
                out.fail(f"HTTP {r.status}: {text[:200].decode(errors='replace')}")
                return False
    except (aiohttp.ClientError, TimeoutError) as e:
        out.fail(f"{type(e).__name__}: {e}"[:200])
        return False
    return True


def _session() -> aiohttp.ClientSession:
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=TIMEOUT)


async def open_loop(url: str, rate: float, seconds: float, seed: int = 1) -> Sample:
    """Poisson arrivals at `rate` for `seconds`; one `seed` sends the same bodies at the same
    offsets whatever `url` is."""
    rng = random.Random(seed)
    out = Sample()
    async with _session() as s:

        async def one(body: bytes) -> None:
            t0 = time.perf_counter()
            if await _post(s, url, body, out):
                out.latencies.append(time.perf_counter() - t0)

        tasks = []
        start = time.perf_counter()
        t = start
        while t - start < seconds:
            t += rng.expovariate(rate)
            d = t - time.perf_counter()
            if d > 0:
                await asyncio.sleep(d)
            tasks.append(asyncio.create_task(one(_body(rng))))
        await asyncio.gather(*tasks)
    if out.errors:
        print(f"    {out.errors} errors: {out.first_errors}", flush=True)
    return out


async def closed_loop(url: str, concurrency: int, seconds: float) -> tuple[float, Sample]:
    """(requests/s answered 200, the failures): `concurrency` clients, each sending its next
    request when its last is answered; client k's bodies come from seed k."""
    done = 0
    out = Sample()
    stop = time.perf_counter() + seconds
    async with _session() as s:

        async def worker(k: int) -> None:
            nonlocal done
            rng = random.Random(k)
            while time.perf_counter() < stop:
                if await _post(s, url, _body(rng), out):
                    done += 1
                else:
                    # a router refusing at once would have this loop spin on the CPU it needs
                    await asyncio.sleep(0.01)

        t0 = time.perf_counter()
        await asyncio.gather(*(worker(k) for k in range(concurrency)))
        return done / (time.perf_counter() - t0), out


# A router process's table memory, measured in a running prefix-router that requests filled:
# the router's imports (aiohttp, pydantic, prometheus-client, redis) and its pools count too,
# which a table filled in a bare interpreter (as this measured before 2026-12-05) left out.
RSS_PROMPT_BLOCKS = 128  # a 2,048-token prompt: the system-prompts workload's size
RSS_CAPACITY_TOKENS = 50_000_000  # far above 1M blocks: the capacity model evicts nothing


def _unique_prompt(rng: random.Random) -> str:
    # 4 bytes a token (the router's bytes_per_token), 16 tokens a block; random hex so no
    # two prompts share a block and every block is a new entry
    return rng.randbytes(RSS_PROMPT_BLOCKS * 16 * 2).hex()


async def _table_entries(session: aiohttp.ClientSession, router: str) -> int:
    async with session.get(router + "/metrics") as r:
        text = await r.text()
    for line in text.splitlines():
        if line.startswith("prefix_router_table_entries "):
            return int(float(line.split()[1]))
    raise RuntimeError("the router's /metrics has no prefix_router_table_entries")


async def fill_router_table(router: str, entries: int, clients: int = 16) -> int:
    """Send unique 2,048-token prompts through `router` until its table holds `entries`
    (block, backend) entries, as its own /metrics counts them. Returns that count."""
    rng = random.Random(7)
    out = Sample()
    sem = asyncio.Semaphore(clients)
    async with _session() as s:

        async def one(body: bytes) -> None:
            async with sem:
                await _post(s, router, body, out)

        have = await _table_entries(s, router)
        while have < entries:
            need = (entries - have) // RSS_PROMPT_BLOCKS + 1
            batch = [
                json.dumps({"model": MODEL, "prompt": _unique_prompt(rng), "max_tokens": 1})
                .encode()
                for _ in range(min(need, 2_000))
            ]
            await asyncio.gather(*(one(b) for b in batch))
            if out.errors:
                raise RuntimeError(f"filling the table failed: {out.first_errors}")
            have = await _table_entries(s, router)
            print(f"  table entries {have:,}", flush=True)
    return have


async def rss_with_entries(fleet: Fleet, sim: str, entries: int) -> tuple[int, float, float]:
    """(entries, RSS MB of a router process holding them, RSS MB of it before): a router of
    its own, so the latency runs' requests are not in its table."""
    router = await fleet.start_router(
        "router-rss", [sim], policy="prefix", kv_capacity=RSS_CAPACITY_TOKENS
    )
    assert router.process is not None
    await open_loop(router.url, 100.0, 1.0)  # its pools and code paths, as a serving router
    empty = memory_of(router.process.pid)["rss_mb"]
    have = await fill_router_table(router.url, entries)
    return have, memory_of(router.process.pid)["rss_mb"], empty


# ----------------------------------------------------------------------------------------------
# A router process's memory, from /proc.


def parse_status(text: str) -> dict[str, int]:
    """The `Vm*` lines of /proc/<pid>/status, in kB."""
    out = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key.startswith("Vm") and rest.strip().endswith("kB"):
            out[key] = int(rest.split()[0])
    return out


def process_tree(pid: int) -> list[int]:
    """`pid` and its descendants. The anchors route in their Python launcher's own process
    (the Rust router is an extension module), but a launcher that forked would hide the
    router's memory from a look at the one pid."""
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        # comm may hold spaces and parentheses; the fields after the last ")" cannot
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(d.name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out


def memory_of(pid: int) -> dict[str, Any]:
    """VmRSS and VmHWM (peak RSS) of the process tree at `pid`, in MB. Over several processes
    the peak is the sum of their peaks: an upper bound of the tree's."""
    rss = hwm = 0
    pids = []
    for p in process_tree(pid):
        try:
            vm = parse_status(Path(f"/proc/{p}/status").read_text())
        except OSError:
            continue  # exited meanwhile
        pids.append(p)
        rss += vm.get("VmRSS", 0)
        hwm += vm.get("VmHWM", 0)
    return {"rss_mb": round(rss / 1024, 1), "peak_rss_mb": round(hwm / 1024, 1), "pids": pids}


# ----------------------------------------------------------------------------------------------
# What both commands measure.


async def start_zero_sim(fleet: Fleet) -> Proc:
    return await fleet.start_sim(
        "sim-zero", model=MODEL, kv_capacity=1_000_000, profile="zero", time_scale=1.0
    )


async def start_ours(
    fleet: Fleet, sim: str, store: str, name: str = "router"
) -> tuple[Proc, Proc | None]:
    """(our router with policy prefix in front of `sim`, its redis-server or None). With store
    "redis" a real redis-server on loopback, as in a pod next to Redis."""
    extra: list[str] = []
    redis = None
    if store == "redis":
        url = await fleet.start_redis(f"{name}-redis")
        redis = fleet.procs[-1]
        extra = ["--store", "redis", "--redis-url", url, "--model-key", "bench/overhead"]
    router = await fleet.start_router(
        name, [sim], policy="prefix", kv_capacity=1_000_000, extra=extra
    )
    return router, redis


async def added(
    sim: str,
    router: str,
    rate: float,
    seconds: float,
    seed: int = 2,
    clients: int = CLIENTS,
    max_seconds: float = MAX_SECONDS,
) -> dict[str, Any]:
    """The open loop direct, then the same through `router` (direct right before it, so a
    drift of the host between routers cancels out), then the closed loop through `router`."""
    # warm both paths (connection pools, code paths) before measuring
    await open_loop(sim, rate, WARM_S)
    await open_loop(router, rate, WARM_S)
    print(f"  direct: {rate:g} req/s for {seconds:g}s", flush=True)
    direct = await open_loop(sim, rate, seconds, seed=seed)
    print(f"  via router: {rate:g} req/s for {seconds:g}s", flush=True)
    routed = await open_loop(router, rate, seconds, seed=seed)
    print(f"  max req/s through the router ({clients} clients, {max_seconds:g}s)", flush=True)
    max_rps, max_fail = await closed_loop(router, clients, max_seconds)
    d50, d99 = percentile(direct.latencies, 50), percentile(direct.latencies, 99)
    r50, r99 = percentile(routed.latencies, 50), percentile(routed.latencies, 99)
    return {
        "requests": len(routed.latencies),
        "errors": routed.errors,
        "direct_errors": direct.errors,
        "direct_p50_ms": ms(d50),
        "direct_p99_ms": ms(d99),
        "routed_p50_ms": ms(r50),
        "routed_p99_ms": ms(r99),
        # a difference of percentiles, not a percentile of differences: one body's direct and
        # routed latencies are `seconds` apart, under other noise, not a pair to subtract
        "added_p50_ms": None if r50 is None or d50 is None else ms(r50 - d50),
        "added_p99_ms": None if r99 is None or d99 is None else ms(r99 - d99),
        "max_rps": round(max_rps, 1),
        "max_errors": max_fail.errors,
        "first_errors": routed.first_errors or max_fail.first_errors,
    }


async def measure(
    rate: float, seconds: float, log_dir: str = "bench/.logs", store: str = "local"
) -> dict:
    """`python -m bench overhead`: our router, and the RSS of a 1,000,000-entry table."""
    async with Fleet(Path(log_dir) / f"overhead-{int(time.time())}") as fleet:
        sim = await start_zero_sim(fleet)
        router, _ = await start_ours(fleet, sim.url, store)
        figs = await added(sim.url, router.url, rate, seconds)
        direct_max, _ = await closed_loop(sim.url, CLIENTS, MAX_SECONDS)
        print("  a router's RSS with 1,000,000 table entries", flush=True)
        entries, rss, rss_empty = await rss_with_entries(fleet, sim.url, 1_000_000)
    if figs["added_p50_ms"] is None or figs["added_p99_ms"] is None:
        raise RuntimeError(f"no request answered: {figs['first_errors']}")
    keep = ("requests", "direct_p50_ms", "direct_p99_ms", "routed_p50_ms", "routed_p99_ms")
    return {
        "store": store,
        "rate": rate,
        "seconds": seconds,
        **{k: figs[k] for k in keep},
        "added_p50_ms": figs["added_p50_ms"],
        "added_p99_ms": figs["added_p99_ms"],
        "max_rps": figs["max_rps"],
        "direct_max_rps": round(direct_max, 1),
        "table_entries": entries,
        "rss_mb_1m_entries": rss,
        "rss_mb_empty_table": rss_empty,
    }


# ----------------------------------------------------------------------------------------------
# `python -m bench overhead-all`: ours and every anchor, in turn, in front of one simulator.

RESULTS = Path("bench/results/overhead")
OURS_REDIS = "prefix-redis"  # one router process on a redis-server (compare runs 3)
ROUTERS = ("prefix", OURS_REDIS, *ANCHOR_NAMES)


def skip_reason(router: str, have_redis: bool) -> str | None:
    """Why `router` cannot run here, or None."""
    if router == OURS_REDIS and not have_redis:
        return "redis-server not found (make redis, or bash hack/ensure-redis.sh)"
    return anchor_skip_reason(router, have_redis)


def describe(router: str, ours_version: str) -> dict[str, Any]:
    """kind, version and settings of `router`, as bench compare records them."""
    if router != OURS_REDIS:
        return router_info(router, ours_version)
    info = router_info("prefix", ours_version)
    info["settings"] = [*info["settings"], "--store", "redis", "(one redis-server on loopback)"]
    return info


def planned_seconds(routers: Sequence[str], seconds: float, max_seconds: float) -> float:
    """Wall time of a run, roughly: the simulator's own max req/s, then per router its start,
    two warm-ups, direct and routed open loops and the closed loop."""
    per = [
        SETUP_S.get(r, SETUP_S["prefix"]) + 2 * WARM_S + 2 * seconds + max_seconds + 0.5
        for r in routers
    ]
    return 3.0 + max_seconds + sum(per)


async def _one(
    fleet: Fleet,
    sim: str,
    router: str,
    rate: float,
    seconds: float,
    seed: int,
    clients: int,
    max_seconds: float,
) -> dict[str, Any]:
    """Start `router` in front of `sim`, measure it, read its memory, stop it."""
    await reset([sim])  # each router meets the simulator in the same (empty) state
    first = len(fleet.procs)
    try:
        redis = None
        if router in ANCHORS:
            proc = await start_anchor(fleet, ANCHORS[router], [sim])
        else:
            store = "redis" if router == OURS_REDIS else "local"
            proc, redis = await start_ours(fleet, sim, store, name=router)
        at_start = memory_of(proc.process.pid)
        figs = await added(sim, proc.url, rate, seconds, seed, clients, max_seconds)
        mem = memory_of(proc.process.pid)
        out = {
            **figs,
            "rss_mb": mem["rss_mb"],
            "peak_rss_mb": mem["peak_rss_mb"],
            "processes": len(mem["pids"]),
            "rss_mb_at_start": at_start["rss_mb"],
        }
        if redis is not None:
            out["redis_rss_mb"] = memory_of(redis.process.pid)["rss_mb"]
        return out
    finally:
        # also what a failed start left running: it would take CPU from the next router
        for p in fleet.procs[first:]:
            await fleet.stop(p)


async def run_all(
    routers: Sequence[str],
    rate: float,
    seconds: float,
    seed: int,
    clients: int,
    max_seconds: float,
    out: Path,
    command: str,
) -> list[dict[str, Any]]:
    """Every router in `routers`, one JSON each under `out` (the reason instead of figures
    when one cannot run)."""
    host = machine()
    ours_version = _git_version()
    have_redis = shutil.which("redis-server") is not None
    rows = []
    started = time.monotonic()
    async with Fleet(Path("bench/.logs") / f"overhead-all-{int(time.time())}") as fleet:
        sim = await start_zero_sim(fleet)
        await open_loop(sim.url, rate, WARM_S)
        print(
            f"== the simulator alone: max req/s ({clients} clients, {max_seconds:g}s)",
            flush=True,
        )
        direct_max, _ = await closed_loop(sim.url, clients, max_seconds)
        for router in routers:
            print(f"== {router} (t={time.monotonic() - started:.0f}s)", flush=True)
            row: dict[str, Any] = {
                "router": router,
                **describe(router, ours_version),
                "rate": rate,
                "seconds": seconds,
                "seed": seed,
                "clients": clients,
                "max_seconds": max_seconds,
                "direct_max_rps": round(direct_max, 1),
            }
            reason = skip_reason(router, have_redis)
            if reason is None:
                try:
                    row.update(
                        await _one(
                            fleet, sim.url, router, rate, seconds, seed, clients, max_seconds
                        )
                    )
                except RuntimeError as e:
                    reason = f"did not start: {str(e)[-500:]}"
            if reason is None and row.get("added_p50_ms") is None:
                reason = f"no request answered: {row.get('first_errors')}"
            if reason is not None:
                row["error"] = reason
                print(f"   not measured: {reason[:300]}", flush=True)
            else:
                print(
                    f"   added p50 {row['added_p50_ms']} ms p99 {row['added_p99_ms']} ms, max "
                    f"{row['max_rps']} req/s, RSS {row['rss_mb']} MB (peak "
                    f"{row['peak_rss_mb']}), errors {row['errors']} + {row['max_errors']}",
                    flush=True,
                )
            row.update(
                command=command,
                machine=host,
                measured_at=now_utc(),
            )
            _write(out / f"{router}.json", row)
            rows.append(row)
    print(f"done in {time.monotonic() - started:.0f} s", flush=True)
    return rows


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--routers", nargs="+", choices=ROUTERS, help="a subset (default: all)")
    p.add_argument("--rate", type=float, default=500, help="open-loop requests per second")
    p.add_argument("--seconds", type=float, default=20, help="of each open loop")
    p.add_argument("--clients", type=int, default=CLIENTS, help="of the closed loop")
    p.add_argument("--max-seconds", type=float, default=MAX_SECONDS, help="of the closed loop")
    p.add_argument("--seed", type=int, default=2, help="of the open loop's arrivals and bodies")
    p.add_argument("--out", type=Path, default=RESULTS, help="JSON files and README.md")
    p.add_argument("--install", action="store_true", help="install missing anchors first")
    p.add_argument("--report", action="store_true", help="only rebuild README.md from the JSON")


def command_line(args: argparse.Namespace) -> str:
    """The command that repeats this run (the options that differ from their defaults)."""
    cmd = ".venv/bin/python -m bench overhead-all"
    if args.routers:
        cmd += " --routers " + " ".join(args.routers)
    for flag, value, default in (
        ("--rate", args.rate, 500),
        ("--seconds", args.seconds, 20),
        ("--clients", args.clients, CLIENTS),
        ("--max-seconds", args.max_seconds, MAX_SECONDS),
        ("--seed", args.seed, 2),
    ):
        if value != default:
            cmd += f" {flag} {value:g}"
    if args.out != RESULTS:
        cmd += f" --out {args.out}"
    return cmd


def main_all(args: argparse.Namespace) -> None:
    routers = tuple(r for r in ROUTERS if not args.routers or r in args.routers)
    if not args.report:
        if args.install:
            for name in sorted({ANCHORS[r].package for r in routers if r in ANCHORS}):
                print(name, install(name), flush=True)
        est = planned_seconds(routers, args.seconds, args.max_seconds)
        print(f"{len(routers)} routers, about {est / 60:.1f} minutes", flush=True)
        asyncio.run(
            run_all(
                routers,
                args.rate,
                args.seconds,
                args.seed,
                args.clients,
                args.max_seconds,
                args.out,
                command_line(args),
            )
        )
    print(f"wrote {write_readme(args.out, ROUTERS)}")
