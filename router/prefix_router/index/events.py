"""The index the engines' KV events feed (events/feed.py): what each engine holds, kept until it
says a block is gone, with no configured capacity and no TTL. Pure.

What the events do not say is how full an engine is, and the eviction scorer needs it (a full
backend's coldest block is what a new prefix there would push out). An engine evicts only
when its KV pool is full, and its cached blocks leave only by eviction, so once it has evicted
it stays full: from then on a new prefix there costs its coldest block. The most blocks it
held when evicting are its capacity (occupancy), learned per engine, a fleet of mixed sizes
included, without being told. A block's last use is its store, refreshed by each request the
router sends there that matched it (`touch`), so the tail is what the engine's own LRU would
evict next.
"""

from __future__ import annotations

import time
from collections.abc import Callable

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
        self._full_at: dict[str, int] = {}  # backend -> blocks it held when it evicted

    def held(self, backend: str) -> int:
        """Blocks the engine holds, over every model (its LoRAs share one pool)."""
        return sum(t.owned_blocks(backend) for t in self._tables.values())

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
