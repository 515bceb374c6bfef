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
        "_cap",
        "_capacity_blocks",
        "_capacity_tokens",
        "_entries",
        "_free_bits",
        "_index",
        "_keep",
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
        self._block_tokens: float = block_tokens
        self._capacity_tokens = capacity_tokens
        self._capacity_blocks = capacity_tokens // block_tokens if capacity_tokens > 0 else 0
        self._ttl = ttl
        self._max_entries = max_entries
        self._max_owners = max_owners
        self._index: dict[int, int] = {}
        self._lru: list[OrderedDict[int, float] | None] = []
        # per slot, learned from what its engine reports (learning.py): a capacity in blocks
        # (0: the configured one) and how long an unused block stays (infinity: the TTL)
        self._cap: list[int] = []
        self._keep: list[float] = []
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
            self._cap[slot] = 0
            self._keep[slot] = float("inf")
        else:
            slot = len(self._lru)
            self._lru.append(OrderedDict())
            self._names.append(backend)
            self._cap.append(0)
            self._keep.append(float("inf"))
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
        self._clear(lru, slot)
        dropped = len(lru)
        self._entries -= dropped
        self._lru[slot] = None
        self._names[slot] = None
        self._all_mask &= ~(1 << slot)
        self._free_bits.append(slot)
        return dropped

    def _clear(self, hashes: Iterable[int], slot: int) -> None:
        """Take `slot`'s bit off these blocks (their LRU entries are the caller's to drop)."""
        clear = ~(1 << slot)
        index = self._index
        for h in hashes:
            mask = index.get(h, 0) & clear
            if mask:
                index[h] = mask
            else:
                index.pop(h, None)

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
            # blocks past the TTL, or past what the engine is known to keep, are not held:
            # deeper blocks are never used more recently, so the depth shrinks from the end
            for name, d in list(result.items()):
                slot = self._slot[name]
                lru = self._lru[slot]
                assert lru is not None
                cutoff = now - min(self._ttl, self._keep[slot])
                while d and lru.get(hashes[d - 1], now) <= cutoff:
                    d -= 1
                if d:
                    result[name] = d
                else:
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

    def owned_blocks(self, backend: str) -> int:
        slot = self._slot.get(backend)
        if slot is None:
            return 0
        lru = self._lru[slot]
        return len(lru) if lru is not None else 0

    def last_use(self, backend: str, h: int) -> float | None:
        slot = self._slot.get(backend)
        lru = self._lru[slot] if slot is not None else None
        return lru.get(h) if lru is not None else None

    def fill(self, backend: str) -> float:
        """The share of the backend's capacity its blocks take (0 with no capacity set)."""
        slot = self._slot.get(backend)
        if slot is None or not self.capacity_of(slot):
            return 0.0
        lru = self._lru[slot]
        return len(lru) / self.capacity_of(slot) if lru else 0.0

    def capacity_of(self, slot: int) -> int:
        """Blocks the slot's backend may hold (0: no limit)."""
        return self._cap[slot] or self._capacity_blocks

    def tail_age(self, backend: str, now: float) -> float:
        """Seconds since the least recently used block of a full backend was last used.

        What a new prefix placed there would evict is about this cold: a backend whose tail is
        young is thrashing. A backend with room left evicts nothing (infinity).
        """
        slot = self._slot.get(backend)
        if slot is None or not self.capacity_of(slot):
            return float("inf")
        lru = self._lru[slot]
        # "Full" a little early: a request adds its unique blocks on top of what it matched.
        if not lru or len(lru) < self.capacity_of(slot) * 0.95:
            return float("inf")
        return max(now - next(iter(lru.values())), 0.0)

    def holdings(self) -> dict[str, list[tuple[int, float]]]:
        """Per backend, its blocks and their last use, least recently used first (for
        debugging, and for tests that check a table is left exactly as it was)."""
        return {
            name: list(lru.items())
            for name, lru in zip(self._names, self._lru, strict=True)
            if name is not None and lru is not None
        }

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
        cap = self.capacity_of(slot)
        if cap and len(lru) > cap:
            self._evict(slot, len(lru) - cap)
        if self._entries > self._max_entries:
            self._evict_largest(self._entries - self._max_entries)

    def truncate(self, hashes: Sequence[int], backend: str, keep: int) -> int:
        """`backend` holds only the first `keep` blocks of this chain (an engine reported
        fewer cached tokens, or evicted them). Returns the entries removed."""
        slot = self._slot.get(backend)
        if slot is None:
            return 0
        lru = self._lru[slot]
        assert lru is not None
        gone = [h for h in hashes[max(keep, 0) :] if lru.pop(h, None) is not None]
        self._clear(gone, slot)
        self._entries -= len(gone)
        return len(gone)

    def _evict(self, slot: int, count: int) -> None:
        lru = self._lru[slot]
        assert lru is not None
        popitem = lru.popitem
        count = min(count, len(lru))
        self._clear([popitem(last=False)[0] for _ in range(count)], slot)
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

    def resize(self, block_tokens: float) -> None:
        """A block holds this many engine tokens now (sizing.py learned it)."""
        self._block_tokens = block_tokens
        if self._capacity_tokens > 0:
            self._capacity_blocks = max(1, int(self._capacity_tokens / block_tokens))

    def limit(self, backend: str, capacity_blocks: int, keep_s: float) -> None:
        """What `backend`'s engine was learned to hold: at most `capacity_blocks` (0: the
        configured capacity), each unused block for at most `keep_s` seconds."""
        slot = self._bit(backend)
        self._cap[slot] = capacity_blocks
        self._keep[slot] = keep_s
        lru = self._lru[slot]
        cap = self.capacity_of(slot)
        if lru is not None and cap and len(lru) > cap:
            self._evict(slot, len(lru) - cap)

    def expire(self, now: float) -> int:
        """Drop entries unused for longer than the TTL, or than their engine keeps them.
        Returns how many went."""
        gone = 0
        for slot, lru in enumerate(self._lru):
            if not lru:
                continue
            cutoff = now - min(self._ttl, self._keep[slot])
            n = 0
            for t in lru.values():
                if t > cutoff:
                    break
                n += 1
            if n:
                self._evict(slot, n)
                gone += n
        return gone
