"""What the fleet says about itself: the simulators' own counters (GET /stats, where every hit
rate comes from), our routers' /metrics, redis-server's command count."""

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import redis.asyncio as aioredis

from .promtext import sample_sum

Stats = Callable[[list[str]], Awaitable[list[dict[str, Any]]]]


async def fetch_stats(urls: list[str]) -> list[dict[str, Any]]:
    """Each simulator's /stats (llama.fetch_stats gives llama-servers' in the same shape)."""
    async with aiohttp.ClientSession() as s:
        async def one(url: str) -> dict[str, Any]:
            async with s.get(url + "/stats") as r:
                return await r.json()
        return list(await asyncio.gather(*(one(u) for u in urls)))


async def snapshot(urls: list[str], stats: Stats = fetch_stats) -> dict[str, Any]:
    """The engines' counters at one instant (their TTFT samples and timings since reset)."""
    return {"t": time.perf_counter(), "stats": await stats(urls)}


async def reset(urls: list[str]) -> None:
    async with aiohttp.ClientSession() as s:
        await asyncio.gather(*(s.post(u + "/reset") for u in urls))


async def settle(urls: list[str], stats: Stats = fetch_stats, timeout: float = 60.0) -> bool:
    """Until no engine runs or queues a request, then the simulators reset (llama-servers start
    fresh each run). True when every cache and counter is empty (a busy engine keeps its cache)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(s["running"] or s["waiting"] for s in await stats(urls)):
            break
        await asyncio.sleep(0.2)
    if stats is fetch_stats:
        await reset(urls)
    return all(s.get("cached_blocks", 0) == 0 and s["requests"] == 0 for s in await stats(urls))


async def router_figures(urls: list[str]) -> dict[str, Any]:
    """Our routers' samples (`counters`, keyed as /metrics writes them: name{labels}) and their
    routing decisions by reason, summed over router replicas ({} without: an anchor). `urls`:
    their /metrics pages."""
    decisions: dict[str, float] = {}
    counters: dict[str, float] = {}
    async with aiohttp.ClientSession() as s:
        for u in urls:
            async with s.get(u) as r:
                text = await r.text() if r.status == 200 else ""
            for line in text.splitlines():
                if not line or line.startswith("#"):
                    continue
                name, _, value = line.rpartition(" ")
                counters[name] = counters.get(name, 0.0) + float(value)
                if name.startswith("prefix_router_routing_decisions_total{"):
                    reason = name.split('decision="', 1)[1].split('"', 1)[0]
                    decisions[reason] = decisions.get(reason, 0.0) + float(value)
    return {"decisions": decisions, "counters": counters}


async def table_entries(session: aiohttp.ClientSession, metrics: str) -> int:
    """The (block, backend) entries in a router's index, from its /metrics page `metrics`."""
    async with session.get(metrics) as r:
        return int(sample_sum(await r.text(), "prefix_router_table_entries"))


async def redis_calls(url: str | None) -> int:
    """Commands Redis has executed (INFO commandstats), summed over commands; 0 without one."""
    if not url:
        return 0
    async with aioredis.from_url(url) as r:
        return sum(int(v["calls"]) for v in (await r.info("commandstats")).values())
