"""The ownership table: which backends hold which prefix blocks, as far as the router can tell.

Pure data structure (no I/O, the clock is passed in). Each backend gets a bit; the index maps a
block hash to the bitmask of its owners, so matching a whole chain is a walk of dict lookups and
integer ANDs with no allocation per block. Each backend also keeps its blocks in LRU order; that
order drives two evictions that keep the table honest about what an engine can still hold:
- capacity: once a backend's estimated cached tokens exceed its KV capacity, its least recently
  used blocks go first (as the engine's own LRU would evict them);
- TTL: blocks not used for `ttl` seconds are forgotten.
Within one request the deepest block is touched first, so a chain is evicted tail first, the
order in which engines free a sequence's blocks.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence


class OwnershipTable:
    __slots__ = (
        "_all_mask",
        "_block_tokens",
        "_capacity_blocks",
        "_entries",
        "_free_bits",
        "_index",
        "_lru",
        "_max_entries",
        "_max_owners",
        "_names",
        "_slot",
        "_ttl",
    )

    def __init__(
        self,
        block_tokens: int,
        capacity_tokens: int = 0,
        ttl: float = 600.0,
        max_entries: int = 2_000_000,
        max_owners: int = 0,
    ) -> None:
        self._block_tokens = block_tokens
        self._capacity_blocks = capacity_tokens // block_tokens if capacity_tokens > 0 else 0
        self._ttl = ttl
        self._max_entries = max_entries
        self._max_owners = max_owners
        self._index: dict[int, int] = {}
        self._lru: list[OrderedDict[int, float] | None] = []
        self._names: list[str | None] = []
        self._slot: dict[str, int] = {}
        self._free_bits: list[int] = []
        self._all_mask = 0
        self._entries = 0

    # -- membership -------------------------------------------------------------------------
    def _bit(self, backend: str) -> int:
        slot = self._slot.get(backend)
        if slot is not None:
            return slot
        if self._free_bits:
            slot = self._free_bits.pop()
            self._lru[slot] = OrderedDict()
            self._names[slot] = backend
        else:
            slot = len(self._lru)
            self._lru.append(OrderedDict())
            self._names.append(backend)
        self._slot[backend] = slot
        self._all_mask |= 1 << slot
        return slot

    def drop_backend(self, backend: str) -> int:
        """Forget everything a backend owned (it left, or was ejected). Returns blocks dropped."""
        slot = self._slot.pop(backend, None)
        if slot is None:
            return 0
        lru = self._lru[slot]
        assert lru is not None
        clear = ~(1 << slot)
        index = self._index
        for h in lru:
            mask = index.get(h, 0) & clear
            if mask:
                index[h] = mask
            else:
                index.pop(h, None)
        dropped = len(lru)
        self._entries -= dropped
        self._lru[slot] = None
        self._names[slot] = None
        self._all_mask &= clear
        self._free_bits.append(slot)
        return dropped

    def backends(self) -> list[str]:
        return list(self._slot)

    # -- queries ----------------------------------------------------------------------------
    def match(self, hashes: Sequence[int], now: float | None = None) -> dict[str, int]:
        """Number of leading blocks of `hashes` each backend owns (backends with 0 left out).

        With `now`, a backend whose deepest matched block is past its TTL counts as not owning
        it (expiry proper happens in `expire`, this only keeps answers honest between sweeps).
        """
        result: dict[str, int] = {}
        alive = self._all_mask
        index = self._index
        depth = 0
        for h in hashes:
            owners = index.get(h, 0) & alive
            lost = alive ^ owners
            if lost and depth:
                self._credit(lost, depth, result)
            alive = owners
            if not alive:
                break
            depth += 1
        else:
            if alive and depth:
                self._credit(alive, depth, result)
        if now is not None and result:
            cutoff = now - self._ttl
            for name, d in list(result.items()):
                lru = self._lru[self._slot[name]]
                assert lru is not None
                if lru.get(hashes[d - 1], now) < cutoff:
                    del result[name]
        return result

    def _credit(self, mask: int, depth: int, result: dict[str, int]) -> None:
        names = self._names
        while mask:
            low = mask & -mask
            name = names[low.bit_length() - 1]
            if name is not None:
                result[name] = depth
            mask ^= low

    def owners(self, h: int) -> list[str]:
        mask = self._index.get(h, 0)
        out = []
        while mask:
            low = mask & -mask
            name = self._names[low.bit_length() - 1]
            if name is not None:
                out.append(name)
            mask ^= low
        return out

    def owned_blocks(self, backend: str) -> int:
        slot = self._slot.get(backend)
        if slot is None:
            return 0
        lru = self._lru[slot]
        return len(lru) if lru is not None else 0

    def owned_tokens(self, backend: str) -> int:
        return self.owned_blocks(backend) * self._block_tokens

    def tail_age(self, backend: str, now: float) -> float:
        """Seconds since the least recently used block of a full backend was last used.

        What a new prefix placed there would evict is about this cold: a backend whose tail is
        young is thrashing. A backend with room left evicts nothing (infinity).
        """
        if not self._capacity_blocks:
            return float("inf")
        slot = self._slot.get(backend)
        lru = self._lru[slot] if slot is not None else None
        # "Full" a little early: a request adds its unique blocks on top of what it matched.
        if not lru or len(lru) < self._capacity_blocks * 0.95:
            return float("inf")
        return max(now - next(iter(lru.values())), 0.0)

    def __len__(self) -> int:
        """(block, backend) ownership entries."""
        return self._entries

    def distinct_blocks(self) -> int:
        return len(self._index)

    # -- updates ----------------------------------------------------------------------------
    def record(self, hashes: Sequence[int], backend: str, now: float) -> None:
        """`backend` now holds every block of this chain (it will have prefilled them)."""
        if not hashes:
            return
        slot = self._bit(backend)
        bit = 1 << slot
        lru = self._lru[slot]
        assert lru is not None
        index = self._index
        max_owners = self._max_owners
        added = 0
        # Deepest first so the shallow blocks end up most recent: tails are evicted first.
        for h in reversed(hashes):
            mask = index.get(h, 0)
            if mask & bit:
                lru[h] = now
                lru.move_to_end(h)
                continue
            if max_owners and mask.bit_count() >= max_owners:
                continue
            index[h] = mask | bit
            lru[h] = now
            added += 1
        self._entries += added
        if self._capacity_blocks and len(lru) > self._capacity_blocks:
            self._evict(slot, len(lru) - self._capacity_blocks)
        if self._entries > self._max_entries:
            self._evict_largest(self._entries - self._max_entries)

    def forget(self, hashes: Iterable[int], backend: str) -> None:
        """Undo a record (the request never reached the backend)."""
        slot = self._slot.get(backend)
        if slot is None:
            return
        lru = self._lru[slot]
        assert lru is not None
        clear = ~(1 << slot)
        index = self._index
        for h in hashes:
            if lru.pop(h, None) is None:
                continue
            self._entries -= 1
            mask = index.get(h, 0) & clear
            if mask:
                index[h] = mask
            else:
                index.pop(h, None)

    def _evict(self, slot: int, count: int) -> None:
        lru = self._lru[slot]
        assert lru is not None
        clear = ~(1 << slot)
        index = self._index
        popitem = lru.popitem
        count = min(count, len(lru))
        for _ in range(count):
            h, _t = popitem(last=False)
            mask = index.get(h, 0) & clear
            if mask:
                index[h] = mask
            else:
                index.pop(h, None)
        self._entries -= count

    def _evict_largest(self, count: int) -> None:
        while count > 0:
            slot = max(
                (i for i, lru in enumerate(self._lru) if lru),
                key=lambda i: len(self._lru[i] or ()),
                default=None,
            )
            if slot is None:
                return
            lru = self._lru[slot]
            assert lru is not None
            n = min(count, max(1, len(lru) // 8))
            self._evict(slot, n)
            count -= n

    def expire(self, now: float) -> int:
        """Drop entries unused for longer than the TTL. Returns how many went."""
        cutoff = now - self._ttl
        gone = 0
        for slot, lru in enumerate(self._lru):
            if not lru:
                continue
            n = 0
            for t in lru.values():
                if t >= cutoff:
                    break
                n += 1
            if n:
                self._evict(slot, n)
                gone += n
        return gone
