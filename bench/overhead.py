"""Router overhead: the same small requests to one zero-latency simulator, directly and through
one router; the difference is what the router adds. Also the most requests/s it forwards
(closed loop), its memory and (ours) that of a table of 1,000,000 entries. Setups take turns
in front of ONE simulator, round after round, so an A/B of settings shares the host's drift."""

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

WARM_S, CLIENTS, MAX_SECONDS, SEED = 2.0, 64, 10.0, 2
# The table's memory in a running router filled by requests (imports and pools count too):
# 2,048-token prompts (system-prompts' size), a capacity nothing evicts from.
RSS_ENTRIES, RSS_PROMPT_BLOCKS, RSS_CAPACITY_TOKENS = 1_000_000, 128, 50_000_000
Body = Callable[[random.Random], bytes]


def small(rng: random.Random) -> bytes:
    # no `stream` field: every router takes it as is, so every router gets the same bytes
    prompt = "route me please " * rng.randint(4, 16)
    return json.dumps({"model": MODEL, "prompt": prompt, "max_tokens": 1}).encode()


def chat_2k(rng: random.Random) -> bytes:
    """~2,000 tiny-tokenizer tokens: a shared 1,800-token system prompt and ~200 of its own."""
    user = " ".join(f"word{rng.randrange(10**6)}" for _ in range(30))
    return json.dumps({"model": MODEL, "max_tokens": 1, "messages": [
        {"role": "system", "content": "route me please " * 300},
        {"role": "user", "content": user}]}).encode()


PATHS = {small: "/v1/completions", chat_2k: "/v1/chat/completions"}


@dataclass
class Sample:
    """Latencies (s) of the requests answered 200; the others counted, a few reasons kept."""

    latencies: list[float] = field(default_factory=list)
    errors: int = 0
    first_errors: list[str] = field(default_factory=list)

    async def post(self, s: aiohttp.ClientSession, url: str, body: bytes,
                   path: str = "/v1/completions") -> bool:
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
    # a request that never finishes must not hang a run (the zero sim answers in ~1 ms)
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                 timeout=aiohttp.ClientTimeout(total=30))


async def open_loop(url: str, rate: float, seconds: float, seed: int = 1,
                    body: Body = small) -> Sample:
    """Poisson arrivals; one `seed` sends the same bodies at the same offsets to any `url`."""
    rng, out, tasks = random.Random(seed), Sample(), []
    async with _session() as s:
        start = t = time.perf_counter()
        while t - start < seconds:
            t += rng.expovariate(rate)
            if (d := t - time.perf_counter()) > 0:
                await asyncio.sleep(d)
            tasks.append(asyncio.create_task(out.post(s, url, body(rng), PATHS[body])))
        await asyncio.gather(*tasks)
    return out


async def closed_loop(url: str, body: Body = small) -> tuple[float, Sample]:
    """(requests/s answered 200, the failures) of CLIENTS clients, each sending its next
    request when its last is answered; client k's bodies come from seed k."""
    out, stop = Sample(), time.perf_counter() + MAX_SECONDS
    async with _session() as s:

        async def worker(k: int) -> None:
            rng = random.Random(k)
            while time.perf_counter() < stop:
                if not await out.post(s, url, body(rng), PATHS[body]):
                    await asyncio.sleep(0.01)  # a router refusing at once must not spin

        t0 = time.perf_counter()
        await asyncio.gather(*(worker(k) for k in range(CLIENTS)))
        return len(out.latencies) / (time.perf_counter() - t0), out


async def added(sim: str, router: str, rate: float, seconds: float,
                body: Body = small) -> dict[str, Any]:
    """The open loop direct, then the same through `router` (right after, so a drift of the
    host cancels out), then the closed loop through `router`."""
    for url in (sim, router):  # connection pools and code paths, both ways
        await open_loop(url, rate, WARM_S, body=body)
    direct, routed = [await open_loop(u, rate, seconds, SEED, body) for u in (sim, router)]
    max_rps, max_fail = await closed_loop(router, body)
    d50, d99, r50, r99 = (percentile(x.latencies, q) for x in (direct, routed) for q in (50, 99))
    if d50 is None or d99 is None or r50 is None or r99 is None:
        raise RuntimeError(f"no request answered: {routed.first_errors or direct.first_errors}")
    # a difference of percentiles: one body's direct and routed latencies are `seconds` apart,
    # under other noise, not a pair to subtract
    return {"requests": len(routed.latencies), "errors": routed.errors + max_fail.errors,
            "direct_errors": direct.errors, "direct_p50_ms": ms(d50), "direct_p99_ms": ms(d99),
            "routed_p50_ms": ms(r50), "routed_p99_ms": ms(r99), "added_p50_ms": ms(r50 - d50),
            "added_p99_ms": ms(r99 - d99), "max_rps": round(max_rps, 1),
            "first_errors": routed.first_errors or max_fail.first_errors}


async def fill_table(router: str, metrics: str, entries: int, clients: int = 16) -> int:
    """Unique 2,048-token prompts through `router` until its table holds `entries` (block,
    backend) entries, as its /metrics page (`metrics`) counts them; returns that count."""
    rng, out, gate = random.Random(7), Sample(), asyncio.Semaphore(clients)

    async def one(s: aiohttp.ClientSession) -> None:
        prompt = rng.randbytes(RSS_PROMPT_BLOCKS * 16 * 2).hex()  # every block new
        async with gate:
            await out.post(s, router, json.dumps(
                {"model": MODEL, "prompt": prompt, "max_tokens": 1}).encode())

    async with _session() as s:
        have = await engines.table_entries(s, metrics)
        while have < entries:
            need = min((entries - have) // RSS_PROMPT_BLOCKS + 1, 2_000)
            await asyncio.gather(*(one(s) for _ in range(need)))
            last, have = have, await engines.table_entries(s, metrics)
            if out.errors or have <= last:
                raise RuntimeError(f"the table did not fill: {out.first_errors}, {have} entries")
            print(f"    table entries {have:,}", flush=True)
    return have


async def measure(sc: Scenario, fleet: Fleet, sims: list[str], run: Run, log_dir: Path,
                  **_: Any) -> list[dict[str, Any]]:
    """One setup in front of the simulator: what it adds, its memory; in the first round, for
    our prefix policy on its own table, a router of the same setup filled to RSS_ENTRIES."""
    [sim], s = sims, run.setup
    body = chat_2k if sc.kv_events else small  # token mode: token-aligned blocks
    await engines.reset([sim])  # each setup meets the simulator empty
    direct_max, _ = await closed_loop(sim, body)
    first = len(fleet.procs)
    try:
        started = await start_setup(fleet, sc, s, [sim], 1_000_000, log_dir)
        pid = started.routers[0].process.pid
        at_start = memory_of(pid)["rss_mb"]
        figs = await added(sim, started.targets[0], run.rates[0], sc.seconds, body)
        figs.update(memory_of(pid), rss_mb_at_start=at_start, clients=CLIENTS,
                    direct_max_rps=round(direct_max, 1), max_seconds=MAX_SECONDS,
                    measured_at=now_utc())
        if started.redis:
            figs["redis_rss_mb"] = memory_of(started.redis.process.pid)["rss_mb"]
        if s.router == "prefix" and s.store == "local" and run.round == 1:
            own = await start_setup(fleet, sc, s, [sim], RSS_CAPACITY_TOKENS, log_dir)
            await open_loop(own.targets[0], 100.0, 1.0)  # its pools, as a serving router's
            figs["rss_mb_empty_table"] = memory_of(own.routers[0].process.pid)["rss_mb"]
            figs["table_entries"] = await fill_table(own.targets[0], own.routers[0].metrics,
                                                 RSS_ENTRIES)
            figs["rss_mb_1m_entries"] = memory_of(own.routers[0].process.pid)["rss_mb"]
        return [figs]
    finally:
        for p in fleet.procs[first:]:  # also what a failed start left running
            await fleet.stop(p)
