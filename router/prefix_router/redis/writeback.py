"""The write-back queue: index writes waiting to go to Redis, and when they must go.

Writes wait for a round trip that goes anyway to carry them (a request then costs no round
trip of its own for its writes): the next lookup, or the flush of a change of this router's
load, which each request's send, first token and end make; with no traffic, `write_delay_ms`
at most. News goes at once: a backend newly owning a prefix, a backend gone, a long queue. A
write that fails goes back to the queue, sent again once Redis is back: nothing is lost, and
under a long outage the queue is bounded (the oldest records wait, the newest are dropped).

Until written, the router's own writes are merged into the shared answers (`own_match`), so
its next request sees them at once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..config import RouterSettings
from ..contract import WORKING_SET_BUCKET_S, WORKING_SET_WINDOW_S, StoreKeys
from ..index.local import LocalIndex
from .capacity import Capacity
from .holds import SharedHolds
from .link import FAILURES, RedisLink
from .peers import Peers
from .scripts import block_hex, chain_hex

MAX_QUEUE = 50_000  # records held while Redis is away
BATCH = 2000  # records per round trip
MAX_WORKING_SET = 20_000  # requested block hashes held before they go on their own


@dataclass(slots=True)
class Record:
    model: str
    blocks: list[int]
    backend: str
    parent: int | None  # the block before `blocks` (None: they start at the head)


@dataclass(slots=True)
class Staged:
    records: list[Record]
    truncates: list[tuple[str, str, list[int]]]
    drops: list[str]


class WriteBack:
    def __init__(
        self,
        s: RouterSettings,
        keys: StoreKeys,
        link: RedisLink,
        peers: Peers,
        capacity: Capacity,
        holds: SharedHolds,
        clock: Callable[[], float],
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._peers = peers
        self.holds = holds
        self._capacity = capacity
        self.flushes = 0  # round trips of writes alone (lookups carry the others)
        self.flushing: asyncio.Task[None] | None = None
        self.closed = False
        self._s = s
        self._keys = keys
        self._link = link
        self._clock = clock
        self._wall = wall
        self._delay = s.store.write_delay_ms / 1000.0
        self._ttl = int(max(1, s.ttl_seconds))
        self.records: list[Record] = []
        self.truncates: list[tuple[str, str, list[int]]] = []
        self.drops: list[str] = []
        self.working_set: list[int] = []
        self.queued_at = 0.0  # when the oldest queued write came
        self.news = False  # a queued write other routers should see at once
        self.recent = self._new_recent()  # own records not yet written
        self.sent: tuple[float, LocalIndex] | None = None  # the last written, and when

    def _new_recent(self) -> LocalIndex:
        return LocalIndex(self._s.block_size, 0, 3.0, 200_000, 0, clock=self._clock)

    def _touch(self) -> None:
        if not (self.records or self.working_set or self.truncates):
            self.queued_at = self._clock()

    def record(
        self, model: str, hashes: Sequence[int], backend: str, news: bool, known: int
    ) -> None:
        self.news = self.news or news
        self.recent.record(model, hashes, backend)
        if len(self.records) >= MAX_QUEUE:
            return
        self._touch()
        # the first `known` blocks were just recorded for this backend: only the rest go
        parent = hashes[known - 1] if 0 < known < len(hashes) else None
        blocks = list(hashes[known:]) if parent is not None else list(hashes)
        self.records.append(Record(model, blocks, backend, parent))

    def truncate(self, model: str, hashes: Sequence[int], backend: str, keep: int) -> None:
        self.recent.truncate(model, hashes, backend, keep)
        if self.sent is not None:
            self.sent[1].truncate(model, hashes, backend, keep)
        self._touch()
        self.truncates.append((model, backend, list(hashes[keep:])))
        self.news = True

    def drop(self, backend: str) -> None:
        self.recent.drop_backend(backend)
        if self.sent is not None:
            self.sent[1].drop_backend(backend)
        self.drops.append(backend)

    def add_working_set(self, hashes: Sequence[int]) -> None:
        self._touch()
        self.working_set.extend(hashes)

    def pending(self) -> bool:
        return bool(
            self.records or self.drops or self.truncates or self.working_set
            or self.holds.pending()
        )

    def outgoing(self) -> bool:
        """Whether a round trip has anything of this router's to carry."""
        return self.pending() or self._peers.load_changed()

    def due(self) -> bool:
        """Whether the queue must go now rather than wait for a round trip to carry it."""
        if self.drops or self.news or len(self.records) >= 1000:
            return True
        if len(self.working_set) >= MAX_WORKING_SET:
            return True
        return self.pending() and self._clock() - self.queued_at >= self._delay

    def stage(self, pipe: Any, wall_now: float) -> Staged:
        """Move the queue onto `pipe`: records, truncations, drops, working-set hashes, and
        this router's load and holds (writes follow dispatches: the others see them fresh)."""
        self._peers.stage_load(pipe)
        self.holds.stage(pipe)
        link, keys = self._link, self._keys
        staged = Staged(self.records[:BATCH], self.truncates, self.drops)
        self.records = self.records[BATCH:]
        self.truncates, self.drops = [], []
        ws, self.working_set = self.working_set, []
        self.news = False
        if self.records:
            self.queued_at = self._clock()
        if staged.records:
            self.sent = (self._clock(), self.recent)
            self.recent = self._new_recent()
        prefix = keys.prefix
        for r in staged.records:
            link.evalsha(
                pipe, "record", prefix, r.model, r.backend, wall_now, self._ttl,
                self._capacity.of(r.backend), chain_hex(r.blocks),
                "" if r.parent is None else block_hex(r.parent),
            )
        for model, backend, blocks in staged.truncates:
            link.evalsha(pipe, "truncate", prefix, model, backend, chain_hex(blocks))
        models = {r.model for r in staged.records}
        if models:
            pipe.sadd(keys.models, *models)
            pipe.expire(keys.models, self._ttl)
        for backend in staged.drops:
            link.evalsha(pipe, "drop", prefix, backend)
        if ws:
            bucket = keys.working_set(int(wall_now // WORKING_SET_BUCKET_S))
            pipe.pfadd(bucket, *{block_hex(h) for h in ws})
            pipe.expire(bucket, WORKING_SET_WINDOW_S + 2 * WORKING_SET_BUCKET_S)
        return staged

    def unstage(self, staged: Staged | None) -> None:
        """A write that failed goes back to the head of the queue."""
        if staged is None:
            return
        self._peers.unpublish()
        if staged.records and not self.records:
            self.queued_at = self._clock()
        self.records[:0] = staged.records
        self.truncates[:0] = staged.truncates
        self.drops[:0] = staged.drops
        self.news = self.news or bool(staged.records or staged.truncates)

    def own_match(self, model: str, hashes: Sequence[int], near_ttl: float) -> dict[str, int]:
        """This router's own writes not yet in every shared answer."""
        mine = self.recent.match(model, hashes)
        sent = self.sent
        if sent is not None and self._clock() - sent[0] < near_ttl:
            for b, d in sent[1].match(model, hashes).items():
                if d > mine.get(b, 0):
                    mine[b] = d
        return mine

    def kick(self) -> None:
        """Write now rather than at the next flush: a new owner, or a request just sent (its
        load and hold), is news for the other routers, who would otherwise place the same
        kind of request on the backend this one just filled (both see it as the least
        loaded); so is a request's end, with its answer's record for the next turn."""
        if self._link.down or self.closed or (self.flushing and not self.flushing.done()):
            return
        try:
            self.flushing = asyncio.get_running_loop().create_task(self.flush())
        except RuntimeError:  # no loop (a synchronous caller): the flush timer carries it
            pass

    async def flush(self) -> None:
        """Send every queued write, with this router's load and holds. Whatever makes a round
        trip go, every write rides on it: a conversation's next turn, recorded as its answer
        ends, reaches the other routers with the load change that follows, before the client
        sends that turn to one of them."""
        if self._link.down or not self.outgoing():
            return
        pipe = self._link.pipeline()
        staged = self.stage(pipe, self._wall())
        if not len(pipe):
            return  # the load's version moved, its figures did not
        try:
            await pipe.execute()
            self.flushes += 1
        except FAILURES as exc:
            self.unstage(staged)
            self._link.fail(exc)

    async def tick(self) -> None:
        """The flush timer: writes that must go now, a change of this router's load, or
        holds waiting make a round trip (and the writes that could wait ride on it)."""
        if self.due() or self._peers.load_changed() or self.holds.pending():
            await self.flush()
