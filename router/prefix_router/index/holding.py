"""What one backend holds in an ownership table (table.py): its blocks in LRU order with their
last use, and the capacity its engine was learned to have (learning.py). Pure."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

# A backend counts as full at this share of its capacity: a request adds its unique blocks on
# top of what it matched.
FULL = 0.95


class Holding:
    __slots__ = ("capacity", "lru", "name", "slot")

    def __init__(self, name: str, slot: int) -> None:
        self.name = name
        self.slot = slot  # its bit in the table's owner masks
        self.lru: OrderedDict[int, float] = OrderedDict()  # block -> last use, oldest first
        self.capacity = 0  # blocks its engine was learned to hold (0: the table's setting)

    def depth(self, hashes: Sequence[int], depth: int, cutoff: float, now: float) -> int:
        """How many of the first `depth` blocks of `hashes` it still holds: none last used at
        or before `cutoff`, and deeper blocks are never used more recently, so the depth
        shrinks from the end."""
        lru = self.lru
        while depth and lru.get(hashes[depth - 1], now) <= cutoff:
            depth -= 1
        return depth

    def stale(self, cutoff: float) -> int:
        """How many of its least recently used blocks were last used at or before `cutoff`."""
        n = 0
        for t in self.lru.values():
            if t > cutoff:
                break
            n += 1
        return n

    def pop_oldest(self, count: int) -> list[int]:
        popitem = self.lru.popitem
        return [popitem(last=False)[0] for _ in range(min(count, len(self.lru)))]

    def coldest(self) -> float | None:
        """When its least recently used block was last used (None: it holds none)."""
        return next(iter(self.lru.values())) if self.lru else None

    def tail_age(self, capacity: int, now: float) -> float:
        """Seconds since its least recently used block was last used, once it is full
        (infinity with room left, or no capacity): what a new prefix placed there would evict
        is about this cold, and a backend whose tail is young is thrashing."""
        coldest = self.coldest()
        if not capacity or coldest is None or len(self.lru) < capacity * FULL:
            return float("inf")
        return max(now - coldest, 0.0)
