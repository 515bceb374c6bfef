"""The index of one router process: one OwnershipTable per model."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from .holding import FULL
from .learning import CapacityModel
from .table import OwnershipTable


class LocalIndex:
    def __init__(
        self,
        block_tokens: int,
        capacity_tokens: int,
        ttl: float,
        max_entries: int,
        max_owners: int = 0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._args = (block_tokens, capacity_tokens, ttl, max_entries, max_owners)
        self._tables: dict[str, OwnershipTable] = {}
        self._clock = clock
        self._block_tokens: float = block_tokens
        self.capacity = CapacityModel(capacity_tokens, block_tokens)

    def table(self, model: str) -> OwnershipTable:
        t = self._tables.get(model)
        if t is None:
            t = self._tables[model] = OwnershipTable(*self._args)
            t.resize(self._block_tokens)
            for backend in self.capacity.learned():
                t.limit(backend, self.capacity.blocks(backend))
        return t

    def match(self, model: str, hashes: Sequence[int]) -> dict[str, int]:
        t = self._tables.get(model)
        if t is None or not hashes:
            return {}
        return t.match(hashes, self._clock())

    async def lookup(self, model: str, hashes: Sequence[int]) -> dict[str, int]:
        return self.match(model, hashes)

    def record(
        self, model: str, hashes: Sequence[int], backend: str, *, news: bool = False,
        known: int = 0,
    ) -> None:
        if hashes:
            self.table(model).record(hashes, backend, self._clock())

    def touch(self, model: str, hashes: Sequence[int], backend: str) -> None:
        t = self._tables.get(model)
        if t is not None and hashes:
            t.touch(hashes, backend, self._clock())

    def truncate(self, model: str, hashes: Sequence[int], backend: str, keep: int) -> None:
        t = self._tables.get(model)
        if t is not None:
            t.truncate(hashes, backend, keep)

    def learn(self, model: str, backend: str, predicted: int, held: int) -> bool:
        """An answer's evidence of what `backend` held (learning.py); True when it moved the
        index's model of that engine."""
        full = self.occupancy(model, backend) >= FULL
        if not self.capacity.learn(backend, predicted, held, full):
            return False
        for t in self._tables.values():
            t.limit(backend, self.capacity.blocks(backend))
        return True

    def resize(self, block_tokens: float) -> None:
        """A block holds this many engine tokens now (sizing.py)."""
        self._block_tokens = block_tokens
        self.capacity.resize(block_tokens)
        for t in self._tables.values():
            t.resize(block_tokens)
            for backend in self.capacity.learned():
                t.limit(backend, self.capacity.blocks(backend))

    def occupancy(self, model: str, backend: str) -> float:
        t = self._tables.get(model)
        return t.fill(backend) if t is not None else 0.0

    def tail_age(self, model: str, backend: str) -> float:
        t = self._tables.get(model)
        return float("inf") if t is None else t.tail_age(backend, self._clock())

    def drop_backend(self, backend: str) -> None:
        self.capacity.drop(backend)
        for t in self._tables.values():
            t.drop_backend(backend)

    def expire(self) -> int:
        now = self._clock()
        return sum(t.expire(now) for t in self._tables.values())

    def entries(self) -> int:
        return sum(len(t) for t in self._tables.values())

    @property
    def degraded(self) -> bool:
        return False

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None
