"""What the fleet says about itself: the simulators' own counters (GET /stats, where every hit
rate comes from), our routers' /metrics, redis-server's command count."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import redis.asyncio as aioredis

# Our router's counters the figures read (prefix_router/metrics.py): one place to follow a rename.
DECISIONS = "prefix_router_routing_decisions_total{"
TABLE_ENTRIES = "prefix_router_table_entries"
COUNTERS = (
    'prefix_router_store_round_trips{kind="request"}',
    'prefix_router_store_round_trips{kind="timer"}',
    "prefix_router_store_slow_lookups",
    "prefix_router_predicted_cached_tokens_total",
    "prefix_router_reported_cached_tokens_total",
    "prefix_router_reported_prompt_tokens_total",
    "prefix_router_prompt_tokens_total",
    # the index against what the engines reported (index/learning.py, attempt.py)
    'prefix_router_index_corrections_total{direction="over"}',
    'prefix_router_index_corrections_total{direction="under"}',
    "prefix_router_cache_prediction_error_tokens_sum",
    "prefix_router_cache_prediction_error_tokens_count",
)


Stats = Callable[[list[str]], Awaitable[list[dict[str, Any]]]]


async def fetch_stats(urls: list[str]) -> list[dict[str, Any]]:
    """Each simulator's /stats (llama.fetch_stats gives llama-servers' in the same shape)."""
    async with aiohttp.ClientSession() as s:
        return list(await asyncio.gather(*(_json(s, u + "/stats") for u in urls)))


async def _json(s: aiohttp.ClientSession, url: str) -> Any:
    async with s.get(url) as r:
        return await r.json()


async def snapshot(urls: list[str], stats: Stats = fetch_stats) -> dict[str, Any]:
    """The engines' counters at one instant (their TTFT samples and timings since reset)."""
    return {"t": time.perf_counter(), "stats": await stats(urls)}


async def reset(urls: list[str]) -> None:
    async with aiohttp.ClientSession() as s:
        await asyncio.gather(*(s.post(u + "/reset") for u in urls))


async def settle(urls: list[str], stats: Stats = fetch_stats, timeout: float = 60.0) -> bool:
    """Until no engine runs or queues a request; then the simulators are reset (caches and
    counters; llama-servers have no reset: they are started fresh for each run). True when
    every cache is empty and every counter at zero (an engine busy at reset keeps its cache)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(s["running"] or s["waiting"] for s in await stats(urls)):
            break
        await asyncio.sleep(0.2)
    if stats is fetch_stats:
        await reset(urls)
    return all(s.get("cached_blocks", 0) == 0 and s["requests"] == 0 for s in await stats(urls))


async def router_figures(urls: list[str]) -> dict[str, Any]:
    """Our routers' routing decisions by reason and COUNTERS, summed over router replicas'
    /metrics ({} for a router without them: an anchor)."""
    decisions: dict[str, float] = {}
    counters: dict[str, float] = {}
    async with aiohttp.ClientSession() as s:
        for u in urls:
            async with s.get(u + "/metrics") as r:
                text = await r.text() if r.status == 200 else ""
            for line in text.splitlines():
                if line.startswith(DECISIONS):
                    reason = line.split('decision="', 1)[1].split('"', 1)[0]
                    decisions[reason] = decisions.get(reason, 0.0) + float(line.rsplit(" ", 1)[1])
                elif (name := line.split(" ", 1)[0]) in COUNTERS:
                    counters[name] = counters.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return {"decisions": decisions, "counters": counters}


async def table_entries(session: aiohttp.ClientSession, router: str) -> int:
    async with session.get(router + "/metrics") as r:
        text = await r.text()
    for line in text.splitlines():
        if line.startswith(TABLE_ENTRIES + " "):
            return int(float(line.split()[1]))
    raise RuntimeError(f"the router's /metrics has no {TABLE_ENTRIES}")


async def redis_calls(url: str | None) -> int:
    """Commands Redis has executed (INFO commandstats), summed over commands; 0 without one."""
    if not url:
        return 0
    r = aioredis.from_url(url)
    try:
        info = await r.info("commandstats")
    finally:
        await r.aclose()
    return sum(int(v["calls"]) for v in info.values())
