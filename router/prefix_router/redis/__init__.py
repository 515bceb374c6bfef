"""The shared store: one prefix index, load picture and set of figures for every router
replica of a model, in one Redis. Key layout: contract.py.

Split by job, each with its own period (settings.store) and an injectable clock, so a test
drives time by calling a job's tick instead of sleeping:
  index.py      the shared index (lookups, near-cache, budget)
  capacity.py   each backend's capacity and cache fill, shared and learned
  writeback.py  the write-back queue (records, truncations, drops, working-set hashes)
  peers.py      this router's load for the others, theirs read back
  figures.py    the figures for the operator and the autoscaler
  link.py       the connection, down/up, reconnection
The scripts touch keys computed from a prefix, so this needs a single Redis (or a cluster
with every key of a model in one hash slot), not a sharded cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
import uuid
from collections.abc import Awaitable, Callable

from ..config import RouterSettings
from ..contract import StoreKeys
from ..index.local import LocalIndex
from ..load import LoadTracker
from ..store import Store, StoreStats
from .capacity import Capacity
from .figures import FiguresPublisher
from .holds import SharedHolds
from .index import SharedIndex
from .link import FAILURES, RedisLink
from .peers import Peers
from .writeback import WriteBack

log = logging.getLogger("prefix_router.redis")


class SharedStore(Store):
    def __init__(
        self,
        s: RouterSettings,
        load: LoadTracker,
        router_id: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        st = s.store
        self.settings = s
        self.router_id = (
            router_id or st.router_id or f"{socket.gethostname()}-{uuid.uuid4().hex[:6]}"
        )
        self.keys = StoreKeys(s.model_key)
        self.link = RedisLink(st, clock)
        self.peers = Peers(self.link, self.keys, self.router_id, load, st.load_lease_s, wall)
        self.capacity = Capacity(s, self.link, self.keys, wall)
        # A hold counts while its prefill could last (a stream's first-token budget). None
        # is queued while Redis is away: it would be stale when written, and the queue unbounded.
        holds = SharedHolds(
            self.keys, self.router_id, s.first_token_budget_s, wall, lambda: not self.link.down
        )
        self.writes = WriteBack(
            s, self.keys, self.link, self.peers, self.capacity, holds, clock, wall
        )
        self.figures = FiguresPublisher(
            self.link, self.keys, self.router_id, load, s.block_size, clock, wall
        )
        # built by the index modes that keep a shared table (index/factory.py): with the
        # engines' events every router builds the same index from them, and the store carries
        # the load, the figures and the working set alone
        self.shared: SharedIndex | None = None
        self._holds = holds
        self._clock = clock
        self._wall = wall
        self.observe = self.figures.observe
        self.figures.engine_values = lambda: self.engine_values() if self.engine_values else {}
        load.on_edge = self._edge
        self.timer_round_trips = 0
        self._tasks: list[asyncio.Task[None]] = []
        self._closed = False

    def _edge(self) -> None:
        # Left to the flush tick, a send reached the others up to 5 ms late, and three
        # routers on `unique` queued more at the engines (bench/results/compare/redis-send-ab/).
        # An end carries the answer's record: the client sends the conversation's next turn
        # at once, often to another router (bench/results/compare/redis-edge-ab/).
        if self.peers.others:
            self.writes.kick()

    def table(self, local: LocalIndex) -> SharedIndex:
        """The table every router replica shares, with `local` kept in step for lookups
        that Redis cannot answer in time (one per store: built on the first call)."""
        if self.shared is not None:
            return self.shared
        self.shared = SharedIndex(
            self.settings, self.link, self.keys, self.writes, self.peers, self.capacity, local,
            self._clock, self._wall,
        )
        self.holds = self._holds  # the others' lookups read this router's holds
        return self.shared

    def requested(self, model: str, hashes: list[int]) -> None:
        self.writes.add_working_set(hashes)

    async def remember_response(self, id_hash: int, backend: str, ttl_s: float) -> None:
        if self.link.down:
            return  # the other routers ask this one's engines in vain: a 404, not a hang
        try:
            limit = self.settings.store.timeout_max_ms / 1000.0
            key = self.keys.response(id_hash)
            await asyncio.wait_for(self.link.redis.set(key, backend, ex=max(1, int(ttl_s))), limit)
        except TimeoutError:
            return  # slow is not down: this router still knows it
        except FAILURES as exc:
            self.link.fail(exc)

    async def response_holder(self, id_hash: int) -> str | None:
        if self.link.down:
            return None
        try:
            limit = self.settings.store.timeout_max_ms / 1000.0
            got = await asyncio.wait_for(self.link.redis.get(self.keys.response(id_hash)), limit)
        except TimeoutError:
            return None
        except FAILURES as exc:
            self.link.fail(exc)
            return None
        return got.decode() if isinstance(got, bytes) else got

    def watch_states(self, read: Callable[[], tuple[int, int, int]]) -> None:
        self.figures.states = read

    def show_demand(self, read: Callable[[], tuple[int, float]]) -> None:
        self.figures.demand = read

    def stats(self) -> StoreStats:
        shared = self.shared
        return StoreStats(
            degraded=self.link.down,
            round_trips=(shared.round_trips if shared else 0) + self.writes.flushes,
            timer_round_trips=self.timer_round_trips,
            slow_lookups=shared.slow_lookups if shared else 0,
            budget_s=shared.budget if shared else 0.0,
            working_set_tokens=self.figures.working_set_tokens,
        )

    async def heartbeat(self) -> None:
        """The heartbeat job: the lease, the others' load, the shared capacity model."""
        if self.link.down:
            return
        await self.peers.heartbeat()
        if self.shared is not None:
            await self.capacity.read(self.shared.models)
        self.timer_round_trips += 2

    async def publish(self) -> None:
        await self.figures.publish()
        self.timer_round_trips += 1

    async def start(self) -> None:
        """Each job on its timer (tests call the jobs themselves instead)."""
        await self.link.start()
        st = self.settings.store
        self._tasks = [
            self._every("redis-flush", st.flush_period_ms / 1000.0, self.writes.tick),
            self._every("redis-heartbeat", st.heartbeat_period_s, self.heartbeat),
            self._every("redis-figures", st.figures_period_s, self.publish),
            self._every("redis-reconnect", st.reconnect_period_s, self.reconnect),
        ]

    async def reconnect(self) -> None:
        """The reconnection job: one try while Redis is away."""
        if await self.link.reconnect() and self.shared is not None:
            self.shared.reconnected()

    def _every(
        self, name: str, period: float, tick: Callable[[], Awaitable[None]]
    ) -> asyncio.Task[None]:
        async def loop() -> None:
            while not self._closed:
                await asyncio.sleep(period)
                if self._closed:
                    return
                try:
                    await tick()
                except FAILURES as exc:
                    self.link.fail(exc)

        return asyncio.create_task(loop(), name=name)

    async def close(self) -> None:
        # The loops also stop on the flag and are awaited with a deadline: redis-py has been
        # seen to swallow a CancelledError that lands inside pipeline.execute() and return
        # the reply instead, so a bare cancel-and-await could wait forever.
        self._closed = True
        for t in self._tasks:
            t.cancel()
        if self._tasks:
            _done, stuck = await asyncio.wait(self._tasks, timeout=2.0)
            for t in stuck:
                log.warning("background task %s did not stop within 2 s", t.get_name())
        if self.shared is not None:
            with contextlib.suppress(*FAILURES):
                await self.shared.close()
        await self.link.close()
