"""Router overhead: the same small requests sent directly to a zero-latency simulator and
through one router process; the difference is what the router adds.

Also: the most requests/s one router process forwards (closed loop, 64 concurrent clients),
and the resident memory of a router process holding 1,000,000 ownership entries.
"""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
import sys
import time
from pathlib import Path

import aiohttp

from .fleet import Fleet
from .stats import ms, percentile

MODEL = "sim-zero"


def _body(rng: random.Random) -> bytes:
    prompt = "route me please " * rng.randint(4, 16)
    return json.dumps({"model": MODEL, "prompt": prompt, "max_tokens": 1}).encode()


async def open_loop(url: str, rate: float, seconds: float, seed: int = 1) -> list[float]:
    rng = random.Random(seed)
    lat: list[float] = []
    errors = 0
    headers = {"Content-Type": "application/json"}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:

        async def one(body: bytes) -> None:
            nonlocal errors
            t0 = time.perf_counter()
            try:
                async with s.post(url + "/v1/completions", data=body, headers=headers) as r:
                    await r.read()
                    if r.status != 200:
                        errors += 1
                        return
            except aiohttp.ClientError:
                errors += 1
                return
            lat.append(time.perf_counter() - t0)

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
    if errors:
        print(f"    {errors} errors", flush=True)
    return lat


async def closed_loop(url: str, concurrency: int, seconds: float) -> float:
    done = 0
    stop = time.perf_counter() + seconds
    headers = {"Content-Type": "application/json"}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:

        async def worker(k: int) -> None:
            nonlocal done
            rng = random.Random(k)
            while time.perf_counter() < stop:
                async with s.post(url + "/v1/completions", data=_body(rng), headers=headers) as r:
                    await r.read()
                    if r.status == 200:
                        done += 1

        t0 = time.perf_counter()
        await asyncio.gather(*(worker(k) for k in range(concurrency)))
        return done / (time.perf_counter() - t0)


_RSS_SCRIPT = r"""
import random, resource, sys, time
from prefix_router.table import OwnershipTable
n = int(sys.argv[1])
backends = [f"http://10.0.0.{i}:8000" for i in range(8)]
t = OwnershipTable(block_tokens=16, max_entries=n + 1)
rng = random.Random(0)
chain_len = 128
made = 0
now = 0.0
while made < n:
    base = rng.getrandbits(63)
    hs = [(base + i * 0x9E3779B97F4A7C15) & (2**64 - 1) for i in range(chain_len)]
    t.record(hs, backends[made // chain_len % 8], now)
    made += chain_len
    now += 0.001
def rss_mb():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
print(len(t), round(rss_mb(), 1))
"""


def rss_with_entries(n: int) -> tuple[int, float, float]:
    """(entries, RSS MB with them, RSS MB of the same interpreter with an empty table)."""
    full = subprocess.run(
        [sys.executable, "-c", _RSS_SCRIPT, str(n)], capture_output=True, text=True, check=True
    ).stdout.split()
    empty = subprocess.run(
        [sys.executable, "-c", _RSS_SCRIPT, "0"], capture_output=True, text=True, check=True
    ).stdout.split()
    return int(full[0]), float(full[1]), float(empty[1])


async def measure(
    rate: float, seconds: float, log_dir: str = "bench/.logs", store: str = "local"
) -> dict:
    async with Fleet(Path(log_dir) / f"overhead-{int(time.time())}") as fleet:
        sim = await fleet.start_sim(
            "sim-zero", model=MODEL, kv_capacity=1_000_000, profile="zero", time_scale=1.0
        )
        extra: list[str] = []
        if store == "redis":  # a real redis-server on loopback, as in a pod next to Redis
            url = await fleet.start_redis()
            extra = ["--store", "redis", "--redis-url", url, "--model-key", "bench/overhead"]
        router = await fleet.start_router(
            "router", [sim.url], policy="prefix", kv_capacity=1_000_000, extra=extra
        )
        # warm both paths (connection pools, code paths) before measuring
        await open_loop(sim.url, rate, 2)
        await open_loop(router.url, rate, 2)
        print(f"  direct: {rate} req/s for {seconds}s", flush=True)
        direct = await open_loop(sim.url, rate, seconds, seed=2)
        print(f"  via router: {rate} req/s for {seconds}s", flush=True)
        routed = await open_loop(router.url, rate, seconds, seed=2)
        print("  max req/s through one router (64 concurrent clients, 10s)", flush=True)
        max_rps = await closed_loop(router.url, 64, 10)
        direct_max = await closed_loop(sim.url, 64, 10)
    entries, rss, rss_empty = rss_with_entries(1_000_000)
    d50, d99 = percentile(direct, 50), percentile(direct, 99)
    r50, r99 = percentile(routed, 50), percentile(routed, 99)
    assert d50 is not None and d99 is not None and r50 is not None and r99 is not None
    return {
        "store": store,
        "rate": rate,
        "seconds": seconds,
        "requests": len(routed),
        "direct_p50_ms": ms(d50),
        "direct_p99_ms": ms(d99),
        "routed_p50_ms": ms(r50),
        "routed_p99_ms": ms(r99),
        "added_p50_ms": ms(r50 - d50),
        "added_p99_ms": ms(r99 - d99),
        "max_rps": round(max_rps, 1),
        "direct_max_rps": round(direct_max, 1),
        "table_entries": entries,
        "rss_mb_1m_entries": rss,
        "rss_mb_empty_table": rss_empty,
    }
