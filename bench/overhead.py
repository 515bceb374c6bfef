"""Router overhead: the same small requests directly to one zero-latency simulator and through
one router; the difference is what the router adds. Also the most requests/s one router
forwards (closed loop), its memory, and (ours) that of a table holding 1,000,000 entries. The
runner takes the setups in turn, round after round, in front of ONE simulator: an A/B of two
router settings (`--setups prefix 'prefix,key=value' --repeat 3`) shares the host's drift."""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from .harness import engines
from .harness.fleet import Fleet, memory_of
from .harness.stats import ms, percentile
from .provenance import now_utc
from .runner import MODEL, Run, start_setup
from .scenarios import Scenario

# A request that never finishes must not hang a run (an answer of the zero sim takes ~1 ms).
TIMEOUT = aiohttp.ClientTimeout(total=30)
WARM_S = 2.0
CLIENTS = 64
MAX_SECONDS = 10.0
SEED = 2
# The table's memory, in a running prefix-router that requests filled: its imports and pools
# count too. 2,048-token prompts (system-prompts' size), a capacity nothing evicts from.
RSS_ENTRIES = 1_000_000
RSS_PROMPT_BLOCKS = 128
RSS_CAPACITY_TOKENS = 50_000_000


@dataclass(frozen=True)
class Request:
    """Where the requests go and each one's body, drawn from a seeded generator."""

    path: str
    body: Callable[[random.Random], bytes]


def _small(rng: random.Random) -> bytes:
    # Non-streaming completions without a `stream` field: every router here takes it as is,
    # so every router is sent the very same bytes.
    prompt = "route me please " * rng.randint(4, 16)
    return json.dumps({"model": MODEL, "prompt": prompt, "max_tokens": 1}).encode()


# Token-aligned blocks (issue 22): a chat request of about 2,000 tokens of the tiny tokenizer,
# a 1,800-token system prompt every request shares and about 200 tokens of its own, as a
# system-prompts tenant sends; the router renders the template and tokenizes it, the
# simulator does the same.
SYSTEM = "route me please " * 300


def _chat_2k(rng: random.Random) -> bytes:
    user = " ".join(f"word{rng.randrange(10**6)}" for _ in range(30))
    return json.dumps({"model": MODEL, "max_tokens": 1, "messages": [
        {"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]}).encode()


SMALL = Request("/v1/completions", _small)
CHAT_2K = Request("/v1/chat/completions", _chat_2k)


@dataclass
class Sample:
    """Latencies (s) of the requests answered 200; the others counted, a few reasons kept."""

    latencies: list[float] = field(default_factory=list)
    errors: int = 0
    first_errors: list[str] = field(default_factory=list)

    async def post(self, s: aiohttp.ClientSession, url: str, body: bytes,
                   path: str = SMALL.path) -> bool:
        """One request; its latency kept if it was answered 200, else its failure counted."""
        t0, why = time.perf_counter(), ""
        try:
            async with s.post(url + path, data=body,
                              headers={"Content-Type": "application/json"}) as r:
                text = await r.read()
                if r.status != 200:
                    why = f"HTTP {r.status}: {text[:200].decode(errors='replace')}"
        except (aiohttp.ClientError, TimeoutError) as e:
            why = f"{type(e).__name__}: {e}"[:200]
        if why:
            self.errors += 1
            self.first_errors = sorted({*self.first_errors, why})[:3]
        else:
            self.latencies.append(time.perf_counter() - t0)
        return not why


def _session() -> aiohttp.ClientSession:
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=TIMEOUT)


async def open_loop(url: str, rate: float, seconds: float, seed: int = 1,
                    req: Request = SMALL) -> Sample:
    """Poisson arrivals at `rate` for `seconds`; one `seed` sends the same bodies at the same
    offsets whatever `url` is."""
    rng, out, tasks = random.Random(seed), Sample(), []
    async with _session() as s:
        start = t = time.perf_counter()
        while t - start < seconds:
            t += rng.expovariate(rate)
            if (d := t - time.perf_counter()) > 0:
                await asyncio.sleep(d)
            tasks.append(asyncio.create_task(out.post(s, url, req.body(rng), req.path)))
        await asyncio.gather(*tasks)
    return out


async def closed_loop(url: str, concurrency: int, seconds: float,
                      req: Request = SMALL) -> tuple[float, Sample]:
    """(requests/s answered 200, the failures): `concurrency` clients, each sending its next
    request when its last is answered; client k's bodies come from seed k."""
    out = Sample()
    stop = time.perf_counter() + seconds
    async with _session() as s:

        async def worker(k: int) -> None:
            rng = random.Random(k)
            while time.perf_counter() < stop:
                if not await out.post(s, url, req.body(rng), req.path):
                    # a router refusing at once would have this loop spin on the CPU it needs
                    await asyncio.sleep(0.01)

        t0 = time.perf_counter()
        await asyncio.gather(*(worker(k) for k in range(concurrency)))
        return len(out.latencies) / (time.perf_counter() - t0), out


async def added(sim: str, router: str, rate: float, seconds: float,
                req: Request = SMALL) -> dict[str, Any]:
    """The open loop direct, then the same through `router` (direct right before it, so a
    drift of the host between setups cancels out), then the closed loop through `router`."""
    await open_loop(sim, rate, WARM_S, req=req)  # connection pools and code paths, both ways
    await open_loop(router, rate, WARM_S, req=req)
    direct = await open_loop(sim, rate, seconds, seed=SEED, req=req)
    routed = await open_loop(router, rate, seconds, seed=SEED, req=req)
    max_rps, max_fail = await closed_loop(router, CLIENTS, MAX_SECONDS, req)
    d50, d99, r50, r99 = (percentile(x.latencies, q) for x in (direct, routed) for q in (50, 99))
    if d50 is None or d99 is None or r50 is None or r99 is None:
        raise RuntimeError(f"no request answered: {routed.first_errors or direct.first_errors}")
    return {
        "requests": len(routed.latencies), "errors": routed.errors + max_fail.errors,
        "direct_errors": direct.errors, "direct_p50_ms": ms(d50), "direct_p99_ms": ms(d99),
        "routed_p50_ms": ms(r50), "routed_p99_ms": ms(r99),
        # a difference of percentiles, not a percentile of differences: one body's direct and
        # routed latencies are `seconds` apart, under other noise, not a pair to subtract
        "added_p50_ms": ms(r50 - d50), "added_p99_ms": ms(r99 - d99),
        "max_rps": round(max_rps, 1),
        "first_errors": routed.first_errors or max_fail.first_errors,
    }


async def fill_table(router: str, entries: int, clients: int = 16) -> int:
    """Send unique 2,048-token prompts through `router` until its table holds `entries`
    (block, backend) entries, as its own /metrics counts them. Returns that count."""
    rng, out, gate = random.Random(7), Sample(), asyncio.Semaphore(clients)

    async def one(s: aiohttp.ClientSession) -> None:
        # random hex: no two prompts share a block, every block is new
        prompt = rng.randbytes(RSS_PROMPT_BLOCKS * 16 * 2).hex()
        async with gate:
            await out.post(s, router, json.dumps(
                {"model": MODEL, "prompt": prompt, "max_tokens": 1}).encode())

    async with _session() as s:
        have = await engines.table_entries(s, router)
        while have < entries:
            need = min((entries - have) // RSS_PROMPT_BLOCKS + 1, 2_000)
            await asyncio.gather(*(one(s) for _ in range(need)))
            last, have = have, await engines.table_entries(s, router)
            if out.errors or have <= last:
                raise RuntimeError(f"the table did not fill: {out.first_errors}, {have} entries")
            print(f"    table entries {have:,}", flush=True)
    return have


async def measure(sc: Scenario, fleet: Fleet, sims: list[str], run: Run, log_dir: Path,
                  **_: Any) -> list[dict[str, Any]]:
    """One setup in front of the simulator: what it adds, its memory; in the first round, for
    our prefix policy on its own table, a router of the same setup filled to RSS_ENTRIES."""
    [sim], s = sims, run.setup
    req = CHAT_2K if sc.kv_events else SMALL  # simulators in token mode: token-aligned blocks
    await engines.reset([sim])  # each setup meets the simulator in the same (empty) state
    direct_max, _ = await closed_loop(sim, CLIENTS, MAX_SECONDS, req)
    first = len(fleet.procs)
    try:
        started = await start_setup(fleet, sc, s, [sim], 1_000_000, log_dir)
        router = started.routers[0]
        at_start = memory_of(router.process.pid)["rss_mb"]
        figs = await added(sim, router.url, run.rates[0], sc.seconds, req)
        figs.update(memory_of(router.process.pid), rss_mb_at_start=at_start,
                    direct_max_rps=round(direct_max, 1), clients=CLIENTS,
                    max_seconds=MAX_SECONDS, measured_at=now_utc())
        if started.redis:
            figs["redis_rss_mb"] = memory_of(started.redis.process.pid)["rss_mb"]
        if s.router == "prefix" and s.store == "local" and run.round == 1:
            own = await start_setup(fleet, sc, s, [sim], RSS_CAPACITY_TOKENS, log_dir)
            await open_loop(own.targets[0], 100.0, 1.0)  # its pools, as a serving router's
            figs["rss_mb_empty_table"] = memory_of(own.routers[0].process.pid)["rss_mb"]
            figs["table_entries"] = await fill_table(own.targets[0], RSS_ENTRIES)
            figs["rss_mb_1m_entries"] = memory_of(own.routers[0].process.pid)["rss_mb"]
        return [figs]
    finally:
        for p in fleet.procs[first:]:  # also what a failed start left running
            await fleet.stop(p)
