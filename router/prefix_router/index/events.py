"""The index the engines' KV events feed (events/feed.py): what each engine holds, kept until it
says a block is gone, with no configured capacity and no TTL. Pure.

What the events do not say is how full an engine is, and the eviction scorer needs it (a full
backend's coldest block is what a new prefix there would push out). An engine evicts only
when its KV pool is full, and its cached blocks leave only by eviction, so once it has evicted
it stays full: from then on a new prefix there costs its coldest block. Its capacity (for
occupancy) is the most blocks it has held since: learned per engine, a fleet of mixed sizes
included, without being told (a pool that evicted while running sequences took part of it
holds more cached blocks once they end). A block's last use is its store, refreshed by each
request the router sends there that matched it (`touch`), so the tail is what the engine's
own LRU would evict next.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from .local import LocalIndex


class EventsIndex(LocalIndex):
    def __init__(
        self,
        block_tokens: int,
        max_entries: int,
        max_owners: int = 0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(block_tokens, 0, float("inf"), max_entries, max_owners, clock)
        self._full_at: dict[str, int] = {}  # backend -> the most blocks held since it evicted

    def held(self, backend: str) -> int:
        """Blocks the engine holds, over every model (its LoRAs share one pool)."""
        return sum(t.owned_blocks(backend) for t in self._tables.values())

    def full_at(self, backend: str) -> int:
        """The most blocks the engine has held since it first evicted (0: it has not)."""
        return self._full_at.get(backend, 0)

    def record(
        self, model: str, hashes: Sequence[int], backend: str, *, news: bool = False,
        known: int = 0,
    ) -> None:
        super().record(model, hashes, backend)
        full = self._full_at.get(backend)
        if full is not None:
            # a pool that evicted while running sequences held some of it holds more cached
            # blocks once they end: its capacity is the most it has held
            self._full_at[backend] = max(full, self.held(backend))

    def evicting(self, backend: str) -> None:
        """The engine is evicting: it is full holding what the index has of it now."""
        self._full_at[backend] = max(self.held(backend), self._full_at.get(backend, 0))

    def occupancy(self, model: str, backend: str) -> float:
        cap = self._full_at.get(backend)
        return min(self.held(backend) / cap, 1.0) if cap else 0.0

    def tail_age(self, model: str, backend: str) -> float:
        t = self._tables.get(model)
        if backend not in self._full_at or t is None:
            return float("inf")
        coldest = t.coldest(backend)
        return float("inf") if coldest is None else max(self._clock() - coldest, 0.0)

    def drop_backend(self, backend: str) -> None:
        self._full_at.pop(backend, None)  # a restarted engine may be another size
        super().drop_backend(backend)
