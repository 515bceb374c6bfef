"""Sick engines and a lost Redis under ordinary load: an engine hung while its /health still
answers, an engine killed, Redis killed and started again. Each fault waits on what the router
reports (/readyz), never on a fixed time, and each is undone before the next.

Which requests a fault may fail is known from the tap (tap.py): those a hung engine took
(held) and those in flight on the engine when it was killed (cut). Any other failure is the
router's.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from .cases import CHAT, Ctx
from .watch import Background

TIMEOUT = aiohttp.ClientTimeout(total=60)


@dataclass
class LoadResult:
    rid: int
    phase: str
    stream: bool
    status: int | str
    error_event: bool = False  # a stream that ended with an error event
    whole: bool = False  # a complete answer ([DONE], or a JSON body with choices)


@dataclass
class Load(Background):
    """Open-loop ordinary requests (half streamed) at `rate` a second, each with its id in
    its prompt for the tap to see. `stop()`: no new requests; those sent are waited for (each
    ends within the timeouts)."""

    ctx: Ctx
    url: str
    rate: float = 8.0
    phase: str = "before"
    results: list[LoadResult] = field(default_factory=list)
    first_rid: int = 1_000_000
    _inflight: set[asyncio.Task[None]] = field(default_factory=set)

    async def one(self, s: aiohttp.ClientSession, rid: int) -> None:
        # four shared system prompts, each half streamed: whichever engine owns one gets both
        stream = (rid // 4) % 2 == 0
        system = f"You are assistant number {rid % 4}. " * 40
        body = {"model": self.ctx.model, "max_tokens": 16, "stream": stream, "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": f"{self.ctx.marker} rid-{rid} what now?"}]}
        res = LoadResult(rid, self.phase, stream, "error")
        try:
            async with s.post(self.url + CHAT, json=body) as r:
                data = await r.read()
                res.status = r.status
            if stream:
                res.error_event = b'"error"' in data
                res.whole = data.rstrip().endswith(b"data: [DONE]") and not res.error_event
            elif r.status == 200:
                res.whole = bool(json.loads(data).get("choices"))
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
            res.status = type(exc).__name__
        self.results.append(res)

    async def _loop(self) -> None:
        async with aiohttp.ClientSession(timeout=TIMEOUT,
                                         connector=aiohttp.TCPConnector(limit=0)) as s:
            rid = self.first_rid
            t0 = time.monotonic()
            try:
                while True:
                    rid += 1
                    t = asyncio.create_task(self.one(s, rid))
                    self._inflight.add(t)
                    t.add_done_callback(self._inflight.discard)
                    await asyncio.sleep(max(0.0, t0 + (rid - self.first_rid) / self.rate
                                            - time.monotonic()))
            finally:
                if self._inflight:
                    await asyncio.wait(self._inflight)


async def readyz(s: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    try:
        async with s.get(url + "/readyz", timeout=aiohttp.ClientTimeout(total=5)) as r:
            return await r.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, OSError, ValueError):
        return {}


async def wait_for(check: Callable[[], Awaitable[bool]], timeout: float, what: str,
                   interval: float = 0.1) -> float:
    """Seconds until `check` holds; raises if it does not within `timeout`."""
    t0 = time.monotonic()
    while not await check():
        if time.monotonic() - t0 > timeout:
            raise TimeoutError(f"{what}: not within {timeout:g}s")
        await asyncio.sleep(interval)
    return round(time.monotonic() - t0, 2)


def judge_load(results: list[LoadResult], allowed: set[int]) -> dict[str, Any]:
    """Every request of the load, by phase: answered whole, failed where a fault allowed it
    (`allowed`: ids the tap saw held by a hung engine or cut by a killed one), or failed
    otherwise (the router's failure)."""
    phases: dict[str, dict[str, Any]] = {}
    for r in results:
        p = phases.setdefault(r.phase, {"sent": 0, "whole": 0, "allowed_failures": 0,
                                        "failures": 0, "five_xx": 0, "statuses": {},
                                        "failed": []})
        p["sent"] += 1
        key = str(r.status) + (" + error event" if r.error_event else "")
        p["statuses"][key] = p["statuses"].get(key, 0) + 1
        if r.status == 200 and r.whole:
            p["whole"] += 1
        elif r.rid in allowed:
            p["allowed_failures"] += 1
        else:
            p["failures"] += 1
            p["five_xx"] += 1 if isinstance(r.status, int) and r.status >= 500 else 0
            if len(p["failed"]) < 10:
                p["failed"].append({"rid": r.rid, "stream": r.stream, "status": key})
    return phases


def busiest(records: list[dict[str, Any]], since: int) -> int:
    """The backend that took the most of the load's requests (ids above `since`)."""
    counts = [sum(1 for rid in b["seen"] if rid > since) for b in records]
    return counts.index(max(counts))


async def hung_engine(load: Load, s: aiohttp.ClientSession, url: str, control: str,
                      healthy: int, served: Callable[[], int], hung_for: int = 40
                      ) -> dict[str, Any]:
    """Hang the engine the load reaches most (its /health still answers) for `hung_for` more
    requests after the router first ejects it (a probe that succeeds may take it back: how
    many requests does it still catch?), then let it answer again and wait until the router
    takes it back."""
    await wait_for(lambda: _ready(served() >= 20), 60, "20 requests of the load")
    backend = busiest(await tap_records(s, control), load.first_rid)
    load.phase = "engine hung"
    async with s.post(f"{control}/hang/{backend}") as r:
        r.raise_for_status()
    ejected = await wait_for(lambda: _healthy_is(s, url, healthy - 1), 60,
                             "the hung engine ejected")
    held_at_eject = len((await tap_records(s, control))[backend]["held"])
    start = served()
    await wait_for(lambda: _ready(served() - start >= hung_for), 120,
                   f"{hung_for} more requests answered while the engine hung")
    async with s.post(f"{control}/unhang/{backend}") as r:
        r.raise_for_status()
    load.phase = "engine recovered"
    back = await wait_for(lambda: _healthy_is(s, url, healthy), 60, "the engine taken back")
    held = len((await tap_records(s, control))[backend]["held"])
    return {"backend": backend, "seconds_to_eject": ejected, "seconds_to_readmit": back,
            "held_before_ejection": held_at_eject, "held_after_ejection": held - held_at_eject}


async def killed_engine(load: Load, s: aiohttp.ClientSession, url: str, healthy: int,
                        kill: Callable[[], Awaitable[None]],
                        restart: Callable[[], Awaitable[None]]) -> dict[str, Any]:
    load.phase = "engine killed"
    t0 = time.monotonic()
    await kill()
    ejected = await wait_for(lambda: _healthy_is(s, url, healthy - 1), 60,
                             "the killed engine ejected")
    load.phase = "engine restarted"
    await restart()
    back = await wait_for(lambda: _healthy_is(s, url, healthy), 60, "the engine taken back")
    return {"seconds_to_eject": ejected, "seconds_to_readmit": back,
            "seconds_total": round(time.monotonic() - t0, 2)}


async def redis_outage(load: Load, s: aiohttp.ClientSession, url: str,
                       kill: Callable[[], Awaitable[None]],
                       restart: Callable[[], Awaitable[None]],
                       served: Callable[[], int], while_down: int = 20) -> dict[str, Any]:
    """Redis killed: the router routes on local state (degraded) and fails nothing; Redis
    back (empty): the router reconnects."""
    load.phase = "redis down"
    await kill()
    degraded = await wait_for(lambda: _store_is(s, url, "degraded"), 60, "the store degraded")
    start = served()
    await wait_for(lambda: _ready(served() - start >= while_down), 60,
                   f"{while_down} requests answered while Redis was down")
    load.phase = "redis back"
    await restart()
    back = await wait_for(lambda: _store_is(s, url, "ok"), 60, "the store back")
    return {"seconds_to_degraded": degraded, "seconds_to_reconnect": back}


async def tap_records(s: aiohttp.ClientSession, control: str) -> list[dict[str, Any]]:
    async with s.get(f"{control}/records", timeout=aiohttp.ClientTimeout(total=10)) as r:
        return await r.json()


async def _ready(v: bool) -> bool:
    return v


async def _healthy_is(s: aiohttp.ClientSession, url: str, n: int) -> bool:
    return (await readyz(s, url)).get("healthy_backends") == n


async def _store_is(s: aiohttp.ClientSession, url: str, state: str) -> bool:
    return (await readyz(s, url)).get("store") == state
