"""The ownership table: which backends hold which prefix blocks, as far as the router can tell.

Pure data structure (no I/O, the clock is passed in). Each backend gets a bit; the index maps a
block hash to the bitmask of its owners, so matching a whole chain is a walk of dict lookups and
integer ANDs with no allocation per block. Each backend also keeps its blocks in LRU order
(holding.py); that order drives two evictions that keep the table honest about what an engine
can still hold:
- capacity: once a backend's estimated cached tokens exceed its KV capacity, its least recently
  used blocks go first (as the engine's own LRU would evict them);
- TTL: blocks not used for `ttl` seconds are forgotten.
Within one request the deepest block is touched first, so a chain is evicted tail first, the
order in which engines free a sequence's blocks.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from .holding import Holding


class OwnershipTable:
    __slots__ = (
        "_all_mask",
        "_by_slot",
        "_capacity_blocks",
        "_capacity_tokens",
        "_entries",
        "_free_bits",
        "_held",
        "_index",
        "_max_entries",
        "_max_owners",
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
        self._capacity_tokens = capacity_tokens
        self._capacity_blocks = capacity_tokens // block_tokens if capacity_tokens > 0 else 0
        self._ttl = ttl
        self._max_entries = max_entries
        self._max_owners = max_owners
        self._index: dict[int, int] = {}  # block -> bitmask of its owners
        self._held: dict[str, Holding] = {}
        self._by_slot: list[Holding | None] = []
        self._free_bits: list[int] = []
        self._all_mask = 0
        self._entries = 0

    # -- membership -------------------------------------------------------------------------
    def _holding(self, backend: str) -> Holding:
        """The backend's holding, given a free bit if it has none yet."""
        holding = self._held.get(backend)
        if holding is not None:
            return holding
        if self._free_bits:
            holding = Holding(backend, self._free_bits.pop())
            self._by_slot[holding.slot] = holding
        else:
            holding = Holding(backend, len(self._by_slot))
            self._by_slot.append(holding)
        self._held[backend] = holding
        self._all_mask |= 1 << holding.slot
        return holding

    def drop_backend(self, backend: str) -> int:
        """Forget everything a backend owned (it left, or was ejected). Returns blocks dropped."""
        holding = self._held.pop(backend, None)
        if holding is None:
            return 0
        self._clear(holding.lru, holding.slot)
        dropped = len(holding.lru)
        self._entries -= dropped
        self._by_slot[holding.slot] = None
        self._all_mask &= ~(1 << holding.slot)
        self._free_bits.append(holding.slot)
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

    def _capacity(self, holding: Holding) -> int:
        """Blocks the backend may hold (0: no limit)."""
        return holding.capacity or self._capacity_blocks

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
            # blocks past the TTL are not held
            cutoff = now - self._ttl
            for name, d in list(result.items()):
                d = self._held[name].depth(hashes, d, cutoff, now)
                if d:
                    result[name] = d
                else:
                    del result[name]
        return result

    def _credit(self, mask: int, depth: int, result: dict[str, int]) -> None:
        by_slot = self._by_slot
        while mask:
            low = mask & -mask
            holding = by_slot[low.bit_length() - 1]
            if holding is not None:
                result[holding.name] = depth
            mask ^= low

    def owned_blocks(self, backend: str) -> int:
        holding = self._held.get(backend)
        return len(holding.lru) if holding is not None else 0

    def fill(self, backend: str) -> float:
        """The share of the backend's capacity its blocks take (0 with no capacity set)."""
        holding = self._held.get(backend)
        if holding is None or not self._capacity(holding):
            return 0.0
        return len(holding.lru) / self._capacity(holding)

    def tail_age(self, backend: str, now: float) -> float:
        """Seconds since the least recently used block of a full backend was last used
        (infinity: it has room, or no capacity is set)."""
        holding = self._held.get(backend)
        if holding is None:
            return float("inf")
        return holding.tail_age(self._capacity(holding), now)

    def coldest(self, backend: str) -> float | None:
        """When the backend's least recently used block was last used (None: it holds none)."""
        holding = self._held.get(backend)
        return holding.coldest() if holding is not None else None

    def holdings(self) -> dict[str, list[tuple[int, float]]]:
        """Per backend, its blocks and their last use, least recently used first (for
        debugging, and for tests that check a table is left exactly as it was)."""
        return {name: list(holding.lru.items()) for name, holding in self._held.items()}

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
        holding = self._holding(backend)
        bit = 1 << holding.slot
        lru = holding.lru
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
        self._trim(holding)
        if self._entries > self._max_entries:
            self._evict_largest(self._entries - self._max_entries)

    def touch(self, hashes: Sequence[int], backend: str, now: float) -> None:
        """`backend` used the blocks of this chain it holds: they are its most recent (and
        none is added)."""
        holding = self._held.get(backend)
        if holding is None:
            return
        lru = holding.lru
        for h in reversed(hashes):  # deepest first, as in record
            if h in lru:
                lru[h] = now
                lru.move_to_end(h)

    def truncate(self, hashes: Sequence[int], backend: str, keep: int) -> int:
        """`backend` holds only the first `keep` blocks of this chain (an engine reported
        fewer cached tokens, or evicted them). Returns the entries removed."""
        holding = self._held.get(backend)
        if holding is None:
            return 0
        lru = holding.lru
        gone = [h for h in hashes[max(keep, 0) :] if lru.pop(h, None) is not None]
        self._clear(gone, holding.slot)
        self._entries -= len(gone)
        return len(gone)

    def _evict(self, holding: Holding, count: int) -> None:
        gone = holding.pop_oldest(count)
        self._clear(gone, holding.slot)
        self._entries -= len(gone)

    def _trim(self, holding: Holding) -> None:
        """Evict the backend's oldest blocks past its capacity."""
        cap = self._capacity(holding)
        if cap and len(holding.lru) > cap:
            self._evict(holding, len(holding.lru) - cap)

    def _evict_largest(self, count: int) -> None:
        while count > 0:
            largest = max(
                (holding for holding in self._by_slot if holding is not None and holding.lru),
                key=lambda holding: len(holding.lru),
                default=None,
            )
            if largest is None:
                return
            n = min(count, max(1, len(largest.lru) // 8))
            self._evict(largest, n)
            count -= n

    def resize(self, block_tokens: float) -> None:
        """A block holds this many engine tokens now (sizing.py learned it)."""
        if self._capacity_tokens > 0:
            self._capacity_blocks = max(1, int(self._capacity_tokens / block_tokens))

    def limit(self, backend: str, capacity_blocks: int) -> None:
        """What `backend`'s engine was learned to hold: at most `capacity_blocks` (0: the
        configured capacity)."""
        holding = self._holding(backend)
        holding.capacity = capacity_blocks
        self._trim(holding)

    def expire(self, now: float) -> int:
        """Drop entries unused for longer than the TTL. Returns how many went."""
        gone = 0
        cutoff = now - self._ttl
        for holding in self._held.values():
            n = holding.stale(cutoff)
            if n:
                self._evict(holding, n)
                gone += n
        return gone
