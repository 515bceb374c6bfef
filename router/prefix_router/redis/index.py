"""The prefix index every router replica of a model shares, in Redis.

A lookup is one script call for the whole chain, and its reply also carries the other
routers' load; queued writes ride on it. Its answer is reused for `near_cache_ttl_ms` (the
bounded staleness); the router's own writes since are merged in (writeback.py). A lookup
slower than its budget routes that request on a local table kept in step with every record
and every shared answer; its late reply still fills the near-cache, and the next request asks
Redis again (slow is not down). The budget is `timeout_factor` x the typical lookup time,
within [`timeout_ms`, `timeout_max_ms`] (the latter until a reply has been timed): "slow"
means slow for this deployment.
Occupancy and tail age: capacity.py.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Any

from redis.exceptions import MaxConnectionsError

from ..config import RouterSettings
from ..contract import StoreKeys
from ..index.local import LocalIndex
from .capacity import Capacity
from .link import FAILURES, RedisLink
from .peers import Peers
from .scripts import chain_hex
from .writeback import Staged, WriteBack

# Lookups past their budget whose reply has not come yet, above which Redis is not asked
# (each would hold a connection) until they finish or time out.
MAX_LATE_LOOKUPS = 16
# Lookups waiting on Redis at once, above which a request routes on local state: a flood of
# requests must not take every connection of the pool (100) from the store's other jobs.
MAX_ASKING = 64
# On a busy host the budget's timer and a reply already in the socket are ready in the same
# loop iteration, and the timer wins: a few more iterations let such a reply through.
GRACE_ITERATIONS = 4
MAX_NEAR = 20_000

Reply = list[list[Any]]


async def _last(replies: Any) -> Any:
    return (await replies)[-1]


class SharedIndex:
    def __init__(
        self,
        s: RouterSettings,
        link: RedisLink,
        keys: StoreKeys,
        writes: WriteBack,
        peers: Peers,
        capacity: Capacity,
        local: LocalIndex,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        st = s.store
        self._link = link
        self._keys = keys
        self._writes = writes
        self._peers = peers
        self._local = local  # every record and shared answer: the table a slow lookup uses
        self._clock = clock
        self._wall = wall
        self._floor = st.timeout_ms / 1000.0
        self._cap = max(st.timeout_max_ms, st.timeout_ms) / 1000.0
        self._factor = st.timeout_factor
        # Before any reply nothing is slow short of the cap: a router's first lookups open
        # its connections, and at the floor they routed on an empty local table, so routers
        # that started together each placed the fleet's first prompts anew.
        self.budget = self._cap
        self._typical = 0.0  # moving average of lookup times (s), replies in time or late
        self._near_ttl = st.near_cache_ttl_ms / 1000.0
        self._near: dict[tuple[str, int, int], tuple[float, dict[str, int]]] = {}
        self._late = 0
        self._asking = 0
        self.round_trips = 0
        self.slow_lookups = 0
        self.models: set[str] = set()
        self.capacity = capacity

    # -- reads ------------------------------------------------------------------------------
    async def lookup(self, model: str, hashes: Sequence[int]) -> dict[str, int]:
        if not hashes:
            return {}
        self.models.add(model)
        if self._link.down:
            return self._local.match(model, hashes)
        now = self._clock()
        key = (model, hashes[-1], len(hashes))
        near = self._near.get(key)
        if near is not None and now - near[0] < self._near_ttl:
            shared = near[1]
        else:
            got = await self._ask(model, hashes, key, now)
            if got is None:
                return self._local.match(model, hashes)
            shared = got
        mine = self._writes.own_match(model, hashes, self._near_ttl)
        if not mine:
            return shared
        merged = dict(shared)
        for b, d in mine.items():
            if d > merged.get(b, 0):
                merged[b] = d
        return merged

    async def _ask(
        self, model: str, hashes: Sequence[int], key: tuple[str, int, int], now: float
    ) -> dict[str, int] | None:
        """Redis's answer, or None to route on the local table (slow, or down)."""
        if self._late >= MAX_LATE_LOOKUPS or self._asking >= MAX_ASKING:
            self.slow_lookups += 1
            return None
        link = self._link
        args = (
            *self._peers.lookup_args(), self._keys.owners_prefix(model), chain_hex(hashes),
            self._keys.holds_prefix(model), self._writes.holds.oldest(),
        )
        staged: Staged | None = None
        try:
            if self._writes.outgoing():
                # queued writes ride on this round trip, ahead of the lookup
                pipe = link.pipeline()
                staged = self._writes.stage(pipe, self._wall())
                link.evalsha(pipe, "lookup", *args)
                call = asyncio.ensure_future(_last(pipe.execute()))
            else:
                call = asyncio.ensure_future(link.evalsha(link.redis, "lookup", *args))
        except KeyError as exc:  # scripts not loaded: Redis was down at start
            self._writes.unstage(staged)
            link.fail(exc)
            return None
        self.round_trips += 1
        self._asking += 1
        sent = time.perf_counter()
        call.add_done_callback(lambda _c: self._done_asking(time.perf_counter() - sent))
        done, _ = await asyncio.wait((call,), timeout=self.budget)
        if not done:
            for _ in range(GRACE_ITERATIONS):
                await asyncio.sleep(0)
                if call.done():
                    break
        if not call.done():
            # Slow is not down: the reply still fills the near-cache when it comes. Cancelling
            # would throw the connection away mid-reply.
            self.slow_lookups += 1
            self._late += 1
            call.add_done_callback(lambda c: self._late_reply(c, key, staged, hashes))
            return None
        exc = call.exception()
        if exc is not None:
            if not isinstance(exc, FAILURES):
                raise exc
            self._writes.unstage(staged)
            if isinstance(exc, MaxConnectionsError):
                self.slow_lookups += 1  # every connection busy: slow, not down
            else:
                link.fail(exc)
            return None
        return self._take_reply(call.result(), key, now, hashes)

    def _done_asking(self, seconds: float) -> None:
        self._asking -= 1
        self._timed(seconds)

    def _timed(self, seconds: float) -> None:
        t = self._typical
        self._typical = seconds if t == 0.0 else t + 0.05 * (seconds - t)
        self.budget = min(max(self._factor * self._typical, self._floor), self._cap)

    def _take_reply(
        self, reply: Reply, key: tuple[str, int, int], at: float, hashes: Sequence[int]
    ) -> dict[str, int]:
        flat, load = reply
        shared: dict[str, int] = {}
        model = key[0]
        for i in range(0, len(flat), 2):
            shared[str(flat[i])] = int(flat[i + 1])
        self._peers.take_remote(load)
        if shared:
            # what the shared table knows of this chain goes into the local one too, so a
            # slow lookup routes on nearly the shared picture, not on this router's share
            local = self._local.match(model, hashes)
            for b, d in shared.items():
                if local.get(b, 0) < d:
                    self._local.record(model, hashes[:d], b)
        if len(self._near) > MAX_NEAR:
            self._near.clear()
        self._near[key] = (at, shared)
        return shared

    def _late_reply(
        self, call: asyncio.Future[Reply], key: tuple[str, int, int], staged: Staged | None,
        hashes: Sequence[int],
    ) -> None:
        self._late -= 1
        if call.cancelled():
            self._writes.unstage(staged)
            return
        exc = call.exception()
        if exc is not None:
            self._writes.unstage(staged)
            if isinstance(exc, FAILURES) and not isinstance(exc, MaxConnectionsError):
                self._link.fail(exc)
            return
        self._take_reply(call.result(), key, self._clock(), hashes)

    def learn(self, model: str, backend: str, predicted: int, held: int) -> bool:
        if not self.capacity.learn(model, backend, predicted, held):
            return False
        self._local.learn(model, backend, predicted, held)
        self._near.clear()
        return True

    def resize(self, block_tokens: float) -> None:
        self.capacity.resize(block_tokens)
        self._local.resize(block_tokens)

    def occupancy(self, model: str, backend: str) -> float:
        return self.capacity.occupancy(model, backend)

    def tail_age(self, model: str, backend: str) -> float:
        return self.capacity.tail_age(model, backend)

    def entries(self) -> int:
        return self._local.entries()

    @property
    def degraded(self) -> bool:
        return self._link.down

    # -- writes -----------------------------------------------------------------------------
    def record(
        self, model: str, hashes: Sequence[int], backend: str, *, news: bool = False,
        known: int = 0,
    ) -> None:
        if not hashes:
            return
        self.models.add(model)
        self._local.record(model, hashes, backend)
        self._writes.record(model, hashes, backend, news, known)
        if news:
            self._writes.kick()

    def touch(self, model: str, hashes: Sequence[int], backend: str) -> None:
        # the shared table's uses are its records; the local one follows them
        self._local.touch(model, hashes, backend)

    def truncate(self, model: str, hashes: Sequence[int], backend: str, keep: int) -> None:
        if keep >= len(hashes):
            return
        self._local.truncate(model, hashes, backend, keep)
        self._writes.truncate(model, hashes, backend, keep)
        self._near.clear()
        self._writes.kick()

    def drop_backend(self, backend: str) -> None:
        self.capacity.drop(backend)
        self._local.drop_backend(backend)
        self._writes.drop(backend)
        self._near.clear()

    def expire(self) -> int:
        self._writes.recent.expire()
        return self._local.expire()

    def reconnected(self) -> None:
        """Redis is back: answers cached before it went away are no longer trusted."""
        self._near.clear()

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        self._writes.closed = True
        if not self._link.down:
            try:
                await self._writes.flush()
            except FAILURES:
                pass
