"""A paged KV cache with automatic prefix caching, modelled on vLLM V1's block pool.

The cache holds `capacity_tokens // block_size` blocks. A block holds `block_size` tokens;
only full blocks are cacheable, each under a chained hash: the hash of the block's token ids
seeded with its parent block's hash, so the same tokens after a different prefix never match.

Each block is in one of three states:
- referenced: held by one or more running sequences (ref count > 0); never evicted;
- cached and free: computed earlier, ref count 0, reusable by a later prefix match, and
  evictable; these sit in an LRU queue ordered by the time they were freed;
- anonymous: allocated to a running sequence but not (yet) full or computed; no hash.

As vLLM does, a sequence's blocks are returned to the free queue tail-first, so when last-use
times tie the end of a chain is evicted before its parents and the shared head survives.
When every block is referenced, `allocate` returns None and the request waits.
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

import xxhash

from .tokenizer import tokenize

# The parent hash of a chain's first block (vLLM seeds its chains with a NONE_HASH too).
ROOT_HASH = xxhash.xxh3_64_intdigest(b"engine-sim")


def block_hashes(
    token_ids: Sequence[int], block_size: int, parent: int = ROOT_HASH, start: int = 0
) -> list[int]:
    """Chained hashes of the full blocks of `token_ids[start * block_size:]`.

    `parent` is the hash of block `start - 1` (ROOT_HASH for the first block). Token ids are
    packed to bytes once and each block's bytes hashed in one call, no per-token Python work.
    """
    ids = array("I", token_ids[start * block_size :])
    step = block_size * ids.itemsize
    buf = ids.tobytes()
    out: list[int] = []
    for off in range(0, len(buf) - step + 1, step):
        parent = xxhash.xxh3_64_intdigest(buf[off : off + step], seed=parent)
        out.append(parent)
    return out


def max_cacheable_blocks(num_prompt_tokens: int, block_size: int) -> int:
    """How many prompt blocks a hit may cover: at least the last prompt token is recomputed.

    vLLM caps the hit at num_tokens - 1 so the model has a token to compute logits from; at
    block granularity a prompt of exactly k full blocks can hit at most k - 1 of them.
    """
    return max(0, num_prompt_tokens - 1) // block_size


@dataclass
class _Block:
    block_hash: int
    ref_count: int = 0


@dataclass
class Allocation:
    """The blocks one sequence holds: a hash for a cached block, None for an anonymous one."""

    blocks: list[int | None]
    cached_tokens: int
    freed: bool = False
    # Indexes of blocks this sequence committed to the cache (it holds a ref on each).
    owned: set[int] = field(default_factory=set)


class PrefixCache:
    def __init__(self, capacity_tokens: int, block_size: int = 16) -> None:
        if block_size < 1:
            raise ValueError("block_size must be >= 1")
        if capacity_tokens < block_size:
            raise ValueError("capacity_tokens must hold at least one block")
        self.block_size = block_size
        self.capacity_blocks = capacity_tokens // block_size
        self._blocks: dict[int, _Block] = {}
        # Cached blocks with ref count 0, oldest-freed first: the eviction order.
        self._free_cached: OrderedDict[int, None] = OrderedDict()
        self._anonymous = 0
        self.evictions = 0

    # ---- inspection -------------------------------------------------------------------

    @property
    def capacity_tokens(self) -> int:
        return self.capacity_blocks * self.block_size

    def num_cached_blocks(self) -> int:
        return len(self._blocks)

    def num_free_blocks(self) -> int:
        """Blocks an allocation could take now: never-used ones plus evictable cached ones."""
        return self._unused() + len(self._free_cached)

    def usage_fraction(self) -> float:
        """Share of blocks held by running sequences (vLLM's kv_cache_usage_perc)."""
        used = self.capacity_blocks - self.num_free_blocks()
        return used / self.capacity_blocks

    def contains(self, block_hash: int) -> bool:
        return block_hash in self._blocks

    def ref_count(self, block_hash: int) -> int:
        b = self._blocks.get(block_hash)
        return b.ref_count if b else 0

    def block_hashes(self, token_ids: Sequence[int]) -> list[int]:
        return block_hashes(token_ids, self.block_size)

    # ---- matching ---------------------------------------------------------------------

    def _hit_blocks(self, hashes: Sequence[int], num_prompt_tokens: int) -> int:
        limit = min(len(hashes), max_cacheable_blocks(num_prompt_tokens, self.block_size))
        n = 0
        while n < limit and hashes[n] in self._blocks:
            n += 1
        return n

    def match(self, token_ids: Sequence[int]) -> int:
        """Prompt tokens a request for `token_ids` would find cached now (no side effects)."""
        hashes = self.block_hashes(token_ids)
        return self._hit_blocks(hashes, len(token_ids)) * self.block_size

    def match_hashes(self, hashes: Sequence[int], num_prompt_tokens: int) -> int:
        return self._hit_blocks(hashes, num_prompt_tokens) * self.block_size

    # ---- pool primitives --------------------------------------------------------------

    def _unused(self) -> int:
        return self.capacity_blocks - len(self._blocks) - self._anonymous

    def _make_room(self, n: int) -> bool:
        """Evict LRU free cached blocks until `n` never-used blocks exist; False if impossible."""
        if self._unused() + len(self._free_cached) < n:
            return False
        while self._unused() < n:
            victim, _ = self._free_cached.popitem(last=False)
            del self._blocks[victim]
            self.evictions += 1
        return True

    def _ref(self, block_hash: int) -> None:
        b = self._blocks[block_hash]
        if b.ref_count == 0:
            self._free_cached.pop(block_hash, None)
        b.ref_count += 1

    def _unref(self, block_hash: int) -> None:
        b = self._blocks.get(block_hash)
        if b is None:
            return
        b.ref_count -= 1
        if b.ref_count == 0:
            self._free_cached[block_hash] = None  # most recently used end

    # ---- the engine's API -------------------------------------------------------------

    def allocate(
        self, prompt_hashes: Sequence[int], num_prompt_tokens: int, num_total_tokens: int
    ) -> Allocation | None:
        """Reserve blocks for a sequence of up to `num_total_tokens` tokens.

        The longest cached chain of prompt blocks (capped, see max_cacheable_blocks) is
        shared; the rest are anonymous blocks, evicting free cached blocks as needed. None
        when that cannot fit now (the request must wait); nothing is changed then.
        """
        total = -(-num_total_tokens // self.block_size)
        hit = self._hit_blocks(prompt_hashes, num_prompt_tokens)
        # Hit blocks that are free now stop being evictable once referenced.
        hit_free = sum(1 for h in prompt_hashes[:hit] if self._blocks[h].ref_count == 0)
        need = total - hit
        if self._unused() + len(self._free_cached) - hit_free < need:
            return None
        for h in prompt_hashes[:hit]:
            self._ref(h)
        if not self._make_room(need):  # cannot happen after the check above
            raise AssertionError("block accounting is inconsistent")
        self._anonymous += need
        blocks: list[int | None] = [*prompt_hashes[:hit], *([None] * need)]
        return Allocation(blocks=blocks, cached_tokens=hit * self.block_size)

    def commit(self, alloc: Allocation, index: int, block_hash: int) -> None:
        """Block `index` of `alloc` is now full and computed: make it findable under its hash.

        If another sequence already cached the same block, ours stays anonymous (a
        duplicate) and is simply released on free.
        """
        if alloc.freed or alloc.blocks[index] is not None or block_hash in self._blocks:
            return
        self._anonymous -= 1
        self._blocks[block_hash] = _Block(block_hash, ref_count=1)
        alloc.blocks[index] = block_hash
        alloc.owned.add(index)

    def free(self, alloc: Allocation) -> None:
        """Release a sequence's blocks, tail first; cached ones stay until evicted."""
        if alloc.freed:
            return
        alloc.freed = True
        for h in reversed(alloc.blocks):
            if h is None:
                self._anonymous -= 1
            else:
                self._unref(h)

    # ---- offline use ------------------------------------------------------------------

    def access(self, tokens: Sequence[int] | str | bytes) -> int:
        """One-shot use of a prompt, for oracle figures: match, insert, touch, hold nothing.

        Returns the cached prompt tokens (capped like `allocate`); every full block of the
        prompt is then cached and most recently used, tail first as a finished request
        leaves them. Blocks held by running sequences (if any) are never evicted.
        """
        ids = tokenize(tokens) if isinstance(tokens, str | bytes) else tokens
        hashes = self.block_hashes(ids)
        cached = self._hit_blocks(hashes, len(ids)) * self.block_size
        # A prompt bigger than the cache keeps only what fits, like a request that streamed
        # through: its head blocks would have been evicted by its own tail.
        held: list[int] = []
        for h in hashes:
            if h in self._blocks:
                self._ref(h)
            elif self._make_room(1):
                self._blocks[h] = _Block(h, ref_count=1)
            else:
                break
            held.append(h)
        for h in reversed(held):
            self._unref(h)
        return cached

    def reset(self) -> None:
        """Drop every free cached block (vLLM's reset_prefix_cache); held blocks stay."""
        for h in list(self._free_cached):
            del self._blocks[h]
        self._free_cached.clear()
