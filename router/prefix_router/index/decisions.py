"""Index modes `approx` and `corrected`: the router's own decisions are what the index knows.

A request's chain is held as pending while it is in flight (pending.py), and owned by its
backend once the engine answers 2xx (attempt.py); the table (local, or shared through Redis)
models each engine as an LRU of its capacity. `corrected` also takes the cached tokens each
engine reports as evidence of what it really holds (learning.py); `approx` ignores them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from . import DEGRADED, ESTIMATED, Ownership
from .local import LocalIndex
from .pending import PendingIndex

if TYPE_CHECKING:
    from .factory import Parts


def build_approx(p: Parts) -> DecisionIndex:
    return _build(p, corrects=False)


def build_corrected(p: Parts) -> DecisionIndex:
    return _build(p, corrects=True)


def _build(p: Parts, corrects: bool) -> DecisionIndex:
    s = p.settings
    local = LocalIndex(
        s.block_size, s.kv_capacity_tokens, s.ttl_seconds, s.max_table_entries, s.max_owners,
        clock=p.clock,
    )
    table = p.store.table(local)
    pending = PendingIndex()
    # where other router replicas see this one's holds: a shared store has them once its
    # table is made (read before, they were never shown to the other routers)
    pending.shared = p.store.holds
    p.sizing.watch(table.resize)
    return DecisionIndex(table, pending, corrects)


class DecisionIndex:
    def __init__(self, table: Ownership, pending: PendingIndex, corrects: bool) -> None:
        self.table = table
        self.pending = pending  # chains sent, not yet answered
        self._corrects = corrects

    async def lookup(self, model: str, hashes: Sequence[int]) -> dict[str, int]:
        if not hashes:
            return {}
        return self.pending.merge(model, hashes, await self.table.lookup(model, hashes))

    def hold(self, model: str, hashes: Sequence[int], backend: str, news: bool) -> None:
        self.pending.hold(model, hashes, backend, share=news)

    def release(self, model: str, hashes: Sequence[int], backend: str, news: bool) -> None:
        self.pending.release(model, hashes, backend, share=news)

    def own(
        self, model: str, hashes: Sequence[int], backend: str, *, known: int = 0,
        news: bool = False,
    ) -> None:
        if hashes:
            self.table.record(model, hashes, backend, news=news and not known, known=known)

    def correct(self, model: str, backend: str, predicted: int, held: int) -> bool:
        if not self._corrects:
            return False
        self.table.learn(model, backend, predicted, held)
        return True

    def lower_tiers(
        self, model: str, hashes: Sequence[int], matched: Mapping[str, int],
        backends: Sequence[str],
    ) -> dict[str, float]:
        return {}  # the router's own decisions say nothing of an engine's lower tiers

    def occupancy(self, model: str, backend: str) -> float:
        return self.table.occupancy(model, backend)

    def tail_age(self, model: str, backend: str) -> float:
        return self.table.tail_age(model, backend)

    def drop_backend(self, backend: str) -> None:
        self.table.drop_backend(backend)

    def expire(self) -> int:
        return self.table.expire()

    def entries(self) -> int:
        return self.table.entries()

    @property
    def degraded(self) -> bool:
        return self.table.degraded

    def state(self, backend: str) -> str:
        return DEGRADED if self.table.degraded else ESTIMATED

    def warm(self) -> bool:
        return True  # a shared table is read at each lookup: nothing to load first

    async def start(self) -> None:
        await self.table.start()

    async def close(self) -> None:
        await self.table.close()
