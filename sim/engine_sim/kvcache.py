"""A paged KV cache with prefix caching, at block granularity (pure, no I/O).

A sequence is a byte string (4 bytes per token, see tokenizer.py). Block i covers tokens
[i*B, (i+1)*B); its hash chains the parent's: h_i = xxh3_64(bytes of block i, seed=h_{i-1}),
so a hash names the whole prefix, as vLLM's block hashes do. Only full blocks are cached.

Blocks in use by running requests are reference-counted and never evicted. Unreferenced cached
blocks sit in an LRU list and are evicted oldest first; when a request ends its blocks are
released tail first, so a chain's last blocks are evicted before its first ones.
"""

from __future__ import annotations

from collections import OrderedDict

import xxhash

from .tokenizer import BYTES_PER_TOKEN

_xxh = xxhash.xxh3_64_intdigest


def block_hashes(seq: bytes, block_size: int, limit: int | None = None) -> list[int]:
    step = block_size * BYTES_PER_TOKEN
    n = len(seq) // step
    if limit is not None:
        n = min(n, limit)
    out = []
    h = 0
    for pos in range(0, n * step, step):
        h = _xxh(seq[pos : pos + step], h)
        out.append(h)
    return out


class PrefixCache:
    def __init__(self, capacity_tokens: int, block_size: int = 16) -> None:
        if capacity_tokens < block_size:
            raise ValueError("capacity must hold at least one block")
        self.block_size = block_size
        self.capacity_blocks = capacity_tokens // block_size
        self._ref: dict[int, int] = {}  # cached block hash -> reference count
        self._free: OrderedDict[int, None] = OrderedDict()  # unreferenced cached blocks, LRU first
        self._private = 0  # blocks held by running requests that are not (yet) cached

    # -- queries ----------------------------------------------------------------------------
    def used_blocks(self) -> int:
        return len(self._ref) + self._private

    def usage_fraction(self) -> float:
        """Blocks in use by running requests / capacity (vLLM's kv_cache_usage_perc)."""
        return self._active() / self.capacity_blocks

    def cached_blocks(self) -> int:
        return len(self._ref)

    def match(self, hashes: list[int], prompt_tokens: int) -> int:
        """Leading blocks of `hashes` in the cache, capped so at least one token is computed."""
        cap = (prompt_tokens - 1) // self.block_size
        n = 0
        ref = self._ref
        for h in hashes[:cap]:
            if h not in ref:
                break
            n += 1
        return n

    # -- running requests -------------------------------------------------------------------
    def _active(self) -> int:
        return len(self._ref) - len(self._free) + self._private

    def can_allocate(self, hashes: list[int], total_blocks: int) -> bool:
        """Whether the blocks this request needs fit, evicting only unreferenced blocks."""
        ref = self._ref
        need = sum(1 for h in hashes if not ref.get(h)) + max(0, total_blocks - len(hashes))
        return self._active() + need <= self.capacity_blocks

    def _make_room(self, need: int) -> None:
        free = self._free
        ref = self._ref
        while self.used_blocks() + need > self.capacity_blocks and free:
            h, _ = free.popitem(last=False)
            del ref[h]

    def allocate(self, hashes: list[int], total_blocks: int) -> None:
        """Hold the prompt's full blocks (shared, cached) and private blocks for the rest."""
        ref = self._ref
        free = self._free
        for h in hashes:
            c = ref.get(h)
            if c is None:
                ref[h] = 1
            else:
                if c == 0:
                    del free[h]
                ref[h] = c + 1
        self._private += max(0, total_blocks - len(hashes))
        self._make_room(0)

    def grow(self, blocks: int) -> None:
        """A running sequence needs more private blocks. Unreferenced cached blocks make room;
        when none are left the cache over-commits briefly (vLLM would preempt a sequence)."""
        self._private += blocks
        self._make_room(0)

    def release(
        self, hashes: list[int], total_blocks: int, final_hashes: list[int] | None = None
    ) -> None:
        """A request ended. Its prompt blocks are unreferenced; with `final_hashes` (the hashes
        of prompt + output), the output's full blocks become cached too, as vLLM caches
        generated blocks, so a conversation's next turn hits on the answer."""
        ref = self._ref
        free = self._free
        # The output's blocks were private; they turn into cached blocks (no new room needed).
        self._private -= max(0, total_blocks - len(hashes))
        chain = list(hashes)
        for h in final_hashes[len(hashes) :] if final_hashes else ():
            if h not in ref:
                ref[h] = 1  # released just below, with the prompt's blocks
            else:
                ref[h] += 1
            chain.append(h)
        # Deepest first to the LRU end, so the chain's tail is evicted before its head.
        for h in reversed(chain):
            c = ref[h] - 1
            ref[h] = c
            if c == 0:
                free[h] = None
                free.move_to_end(h)
        if self.used_blocks() > self.capacity_blocks:
            self._make_room(0)

    # -- offline use ------------------------------------------------------------------------
    def access(self, seq: bytes, output: bytes = b"") -> int:
        """One-shot use by an idealised sequential engine: returns the cached tokens of the
        prompt `seq`, then holds every full block of `seq + output` (most recent, the chain's
        head last), as the engine caches a finished request's generated blocks too; then evicts
        LRU blocks, as release() does. No reference kept."""
        tokens = -(-len(seq) // BYTES_PER_TOKEN)
        # the prompt's blocks lead the chain, and match() stops before its last token
        hashes = block_hashes(seq + output, self.block_size)
        hit = self.match(hashes, tokens)
        ref = self._ref
        free = self._free
        for h in reversed(hashes):
            c = ref.get(h)
            if c is None:
                ref[h] = 0
                free[h] = None
            elif c == 0:
                free.move_to_end(h)
        self._make_room(0)
        return hit * self.block_size
