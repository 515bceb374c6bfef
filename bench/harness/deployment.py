"""Engines that come and go as a Deployment's controllers make them, on one machine: simulators
behind routers on file discovery. An engine leaves by going out of the backends file (its
endpoint gone: the routers stop placing there and hand its prefixes on), then finishes its
requests in flight and stops; one joins by starting and going into the file. Every process's
counters count, a stopped one's last counts kept, so the fleet's hit rate is whole over any
window (bench rollout, bench lifecycle)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from prefix_operator.cachestore import read_engine_values
from prefix_operator.figures import engine_values

from .engines import fetch_stats
from .fleet import Proc

# the routers' file discovery re-reads the file each second (router discovery.py), and a drain
# seen before that could stop an engine a router still sends to
DISCOVERY_POLL_S = 1.5
StartSim = Callable[[str], Awaitable[Proc]]  # a new simulator of the given name
Pick = Callable[[list[Proc]], Awaitable[Proc]]  # which of the old engines goes next


def write_backends(path: Path, urls: list[str]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(u + "\n" for u in urls))
    tmp.replace(path)  # whole, never half a list


async def published_values(redis_url: str, model_key: str) -> dict[str, float]:
    """Per engine URL, what the routers publish only it holds, summed as the operator sums
    them (operator figures.engine_values: the fresh routers' values add up)."""
    return engine_values(await read_engine_values(redis_url, None, model_key, 2.0),
                         now=time.time())


async def drain(url: str, timeout: float) -> None:
    """Until the engine runs and queues nothing (its requests in flight finished)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        (s,) = await fetch_stats([url])
        if not s["running"] and not s["waiting"]:
            return
        await asyncio.sleep(0.2)


class Engines:
    """The model's engines: `members` are the routers' endpoints (the backends file); every
    process alive is counted until it stops."""

    def __init__(self, backends: Path, start: StartSim, stop: Callable[[Proc], Awaitable[None]],
                 drain_timeout_s: float = 30.0) -> None:
        self.backends = backends
        self._start = start
        self._stop = stop
        self._drain_timeout = drain_timeout_s
        self.members: list[Proc] = []
        self._alive: list[Proc] = []
        self._done: dict[str, tuple[int, int]] = {}  # stopped: (prompt, cached tokens)
        self._lock = asyncio.Lock()  # a count and a stop never interleave
        self.events: list[dict[str, Any]] = []  # (t, event, engine), t from `t0`
        self.t0 = time.perf_counter()

    def note(self, event: str, url: str) -> None:
        self.events.append({"t": round(time.perf_counter() - self.t0, 2), "event": event,
                            "engine": url})

    @property
    def urls(self) -> list[str]:
        return [p.url for p in self.members]

    async def add(self, names: list[str]) -> list[Proc]:
        """New engines, started together, then in the file once each answers."""
        new = list(await asyncio.gather(*(self._start(n) for n in names)))
        self._alive += new
        self.members += new
        for p in new:
            self.note("join", p.url)
        write_backends(self.backends, self.urls)
        return new

    async def remove(self, going: list[Proc]) -> None:
        """Out of the file at once, then, once the routers have read it, each drained,
        counted and stopped."""
        for p in going:
            self.members.remove(p)
            self.note("leave", p.url)
        write_backends(self.backends, self.urls)
        await asyncio.sleep(DISCOVERY_POLL_S)  # as a pod's preStop pause: no new requests
        for p in going:
            await drain(p.url, self._drain_timeout)
            async with self._lock:
                (s,) = await fetch_stats([p.url])
                self._done[p.url] = (int(s["prompt_tokens"]), int(s["cached_tokens"]))
                self._alive.remove(p)
                await self._stop(p)

    async def totals(self) -> tuple[int, int]:
        """(prompt, cached) tokens of every engine process so far."""
        async with self._lock:
            stats = await fetch_stats([p.url for p in self._alive])
        p = sum(int(s["prompt_tokens"]) for s in stats) + sum(v[0] for v in self._done.values())
        c = sum(int(s["cached_tokens"]) for s in stats) + sum(v[1] for v in self._done.values())
        return p, c

    async def roll(self, surge: int, unavailable: int, pick: Pick, prefix: str = "new") -> None:
        """Every member replaced as the Deployment controller does for (maxSurge,
        maxUnavailable): per step, `unavailable` old engines leave, `surge + unavailable`
        new ones join, then `surge` more old ones leave; `pick` chooses which old one."""
        old = list(self.members)
        n = 0

        async def leave(count: int) -> None:
            going = []
            for _ in range(min(count, len(old))):
                chosen = await pick(old)
                old.remove(chosen)
                going.append(chosen)
            await self.remove(going)

        while old:
            await leave(unavailable)
            count = min(surge + unavailable, len(old) + unavailable)
            await self.add([f"{prefix}{n + i}" for i in range(count)])
            n += count
            await leave(surge)
