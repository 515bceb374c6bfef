"""A paged KV cache with prefix caching, at block granularity (pure, no I/O).

Block i covers tokens [i*B, (i+1)*B) of a sequence; its hash chains the parent's, so a hash
names the whole prefix, as vLLM's block hashes do. Only full blocks are cached. A sequence is
either a byte string (4 bytes per token, see tokenizer.py; h_i = xxh3_64(bytes of block i,
seed=h_{i-1})) or, with a real tokenizer, token ids (TokenBlockHasher: a salted 128-bit chain
over the ids and the block's extra keys, as vLLM hashes parent, tokens and extra keys).

Blocks in use by running requests are reference-counted and never evicted. Unreferenced cached
blocks sit in an LRU list and are evicted oldest first; when a request ends its blocks are
released tail first, so a chain's last blocks are evicted before its first ones. The cache
reports evictions to `on_evict` (for KV events) and, on request, which blocks were new. With a
CPU tier (CpuTier: CPU offloading), an evicted block moves there.
"""

from __future__ import annotations

import os
from array import array
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import xxhash

from .tokenizer import BYTES_PER_TOKEN

if TYPE_CHECKING:
    from prefix_router.prompt import MultiModalPart

_xxh = xxhash.xxh3_64_intdigest
_xxh128 = xxhash.xxh3_128_intdigest


def _block_hashes(seq: bytes, block_size: int, limit: int | None, seed: int) -> list[int]:
    step = block_size * BYTES_PER_TOKEN
    n = len(seq) // step
    if limit is not None:
        n = min(n, limit)
    out = []
    h = seed
    for pos in range(0, n * step, step):
        h = _xxh(seq[pos : pos + step], h)
        out.append(h)
    return out


def mm_keys(mm: Sequence[MultiModalPart], start: int, end: int) -> list[tuple[str, int]]:
    """vLLM's multimodal extra keys of the block of tokens [start, end): (the item's hash, its
    first token's offset from the block's) for each item whose placeholder tokens the block
    overlaps, in prompt order (vllm/v1/core/kv_cache_utils.py `_gen_mm_extra_hash_keys`)."""
    return [(m.hash, m.offset - start) for m in mm
            if m.length > 0 and m.offset < end and m.offset + m.length > start]  # fmt: skip


def block_hashes(seq: bytes, block_size: int, limit: int | None = None, seed: int = 0,
                 mm: Sequence[MultiModalPart] = ()) -> list[int]:
    """The byte cache's chain (4 bytes a token); a block over a media item's tokens keyed
    with its hash, as TokenBlockHasher keys it."""
    if not mm:
        return _block_hashes(seq, block_size, limit, seed)
    step = block_size * BYTES_PER_TOKEN
    n = len(seq) // step if limit is None else min(len(seq) // step, limit)
    media = _mm_by_block(mm, block_size)
    out = []
    h = seed
    for i in range(n):
        block = seq[i * step : (i + 1) * step]
        h = _xxh(block + media[i] if i in media else block, h)
        out.append(h)
    return out


def _mm_by_block(mm: Sequence[MultiModalPart], b: int) -> dict[int, bytes]:
    """The media keys of each block of `b` tokens over an item (block index -> bytes)."""
    blocks = {i for m in mm if m.length > 0
              for i in range(m.offset // b, (m.offset + m.length - 1) // b + 1)}  # fmt: skip
    return {i: b"".join(b"\x00mm\x00" + h.encode() + b"\x00" + str(at).encode()
                        for h, at in mm_keys(mm, i * b, (i + 1) * b)) for i in blocks}


class TokenBlockHasher:
    """The engine's own block hashes over token ids: h_i = xxh3_128(h_{i-1} || ids of block i
    || extra keys), h_{-1} derived from a seed that is random in every process unless given
    (vLLM: PYTHONHASHSEED), so nothing outside may depend on the values."""

    def __init__(self, block_size: int, seed: str | None = None) -> None:
        if seed is None:
            seed = os.environ.get("PYTHONHASHSEED") or os.urandom(16).hex()
        self.block_size = block_size
        self.root = _xxh128(b"engine-sim-block-hash:" + seed.encode())

    def extend(
        self,
        hashes: list[int],
        ids: list[int],
        lora: str | None = None,
        salt: str | None = None,
        mm: Sequence[MultiModalPart] = (),
    ) -> list[int]:
        """`hashes` (a chain over a prefix of `ids`) extended to every full block of `ids`;
        a block over a media item's placeholder tokens (`mm`) keyed with the item's hash."""
        b = self.block_size
        out = hashes[: len(ids) // b]
        h = out[-1] if out else self.root
        every = b"\x00lora\x00" + lora.encode() if lora else b""
        media = _mm_by_block(mm, b) if mm else {}
        for i in range(len(out), len(ids) // b):
            extra = every + media[i] if i in media else every
            if i == 0 and salt:
                extra += b"\x00salt\x00" + salt.encode()
            h = _xxh128(
                h.to_bytes(16, "big") + array("I", ids[i * b : (i + 1) * b]).tobytes() + extra
            )
            out.append(h)
        return out


class CpuTier:
    """A larger LRU behind the GPU cache, as vLLM's CPU offloading keeps one: a block the GPU
    evicts moves here (`on_store`), the least recently used leaves when it is full
    (`on_evict`); a request's blocks that follow its GPU hit here are loaded back rather than
    recomputed (engine.py charges the load). A reset of the GPU cache leaves it as it is."""

    def __init__(self, capacity_tokens: int, block_size: int) -> None:
        self.capacity_blocks = capacity_tokens // block_size
        self._lru: OrderedDict[int, None] = OrderedDict()
        self.on_store: Callable[[int], None] | None = None
        self.on_evict: Callable[[int], None] | None = None

    def __len__(self) -> int:
        return len(self._lru)

    def put(self, h: int) -> None:
        lru = self._lru
        if h in lru:
            lru.move_to_end(h)
            return
        lru[h] = None
        if self.on_store is not None:
            self.on_store(h)
        while len(lru) > self.capacity_blocks:
            old, _ = lru.popitem(last=False)
            if self.on_evict is not None:
                self.on_evict(old)

    def run(self, hashes: list[int], start: int, prompt_tokens: int, block_size: int) -> int:
        """Blocks of `hashes` from `start` on held here without a gap, capped as a GPU match
        is (at least one prompt token computed); they count as used."""
        cap = (prompt_tokens - 1) // block_size
        lru = self._lru
        n = start
        while n < min(cap, len(hashes)) and hashes[n] in lru:
            lru.move_to_end(hashes[n])
            n += 1
        return n - start

    def clear(self) -> None:
        """Everything dropped, each as an eviction."""
        while self._lru:
            h, _ = self._lru.popitem(last=False)
            if self.on_evict is not None:
                self.on_evict(h)


class PrefixCache:
    def __init__(self, capacity_tokens: int, block_size: int = 16) -> None:
        if capacity_tokens < block_size:
            raise ValueError("capacity must hold at least one block")
        self.block_size = block_size
        self.capacity_blocks = capacity_tokens // block_size
        self._ref: dict[int, int] = {}  # cached block hash -> reference count
        self._free: OrderedDict[int, None] = OrderedDict()  # unreferenced cached blocks, LRU first
        self._private = 0  # blocks held by running requests that are not (yet) cached
        self.on_evict: Callable[[int], None] | None = None
        self.cpu: CpuTier | None = None  # where evicted blocks go, with CPU offloading

    # -- queries ----------------------------------------------------------------------------
    def used_blocks(self) -> int:
        return len(self._ref) + self._private

    def usage_fraction(self) -> float:
        """Blocks in use by running requests / capacity (vLLM's kv_cache_usage_perc)."""
        return self._active() / self.capacity_blocks

    def cached_blocks(self) -> int:
        return len(self._ref)

    def holds(self, h: int) -> bool:
        return h in self._ref

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

    def can_grow(self, blocks: int) -> bool:
        """Whether a running sequence can take `blocks` more, evicting only unreferenced ones."""
        return self._active() + blocks <= self.capacity_blocks

    def can_allocate(self, hashes: list[int], total_blocks: int) -> bool:
        """Whether the blocks this request needs fit, evicting only unreferenced blocks."""
        ref = self._ref
        need = sum(1 for h in hashes if not ref.get(h)) + max(0, total_blocks - len(hashes))
        return self._active() + need <= self.capacity_blocks

    def _make_room(self, need: int) -> None:
        free = self._free
        ref = self._ref
        evicted = self.on_evict
        cpu = self.cpu
        while self.used_blocks() + need > self.capacity_blocks and free:
            h, _ = free.popitem(last=False)
            del ref[h]
            if cpu is not None:
                cpu.put(h)  # offloaded before the GPU copy goes, as its events say
            if evicted is not None:
                evicted(h)

    def clear(self) -> int:
        """Drop every unreferenced cached block (a prefix-cache reset); returns how many."""
        n = len(self._free)
        for h in self._free:
            del self._ref[h]
        self._free.clear()
        return n

    def allocate(self, hashes: list[int], total_blocks: int, new: list[int] | None = None) -> None:
        """Hold the prompt's full blocks (shared, cached) and private blocks for the rest.
        With `new`, the indices of the blocks that were not cached are appended to it."""
        ref = self._ref
        free = self._free
        for i, h in enumerate(hashes):
            c = ref.get(h)
            if c is None:
                ref[h] = 1
                if new is not None:
                    new.append(i)
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
        self,
        hashes: list[int],
        total_blocks: int,
        final_hashes: list[int] | None = None,
        new: list[int] | None = None,
    ) -> None:
        """A request ended. Its prompt blocks are unreferenced; with `final_hashes` (the hashes
        of prompt + output), the output's full blocks become cached too, as vLLM caches
        generated blocks, so a conversation's next turn hits on the answer. With `new`, the
        indices (into final_hashes) of output blocks that were not cached are appended."""
        ref = self._ref
        free = self._free
        # The output's blocks were private; they turn into cached blocks (no new room needed).
        self._private -= max(0, total_blocks - len(hashes))
        chain = list(hashes)
        start = len(hashes)
        for i, h in enumerate(final_hashes[start:] if final_hashes else ()):
            if h not in ref:
                ref[h] = 1  # released just below, with the prompt's blocks
                if new is not None:
                    new.append(start + i)
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
    def access(self, seq: bytes, output: bytes = b"", mm: Sequence[MultiModalPart] = ()) -> int:
        """One-shot use by an idealised sequential engine: returns the cached tokens of the
        prompt `seq`, then holds every full block of `seq + output` (most recent, the chain's
        head last), as the engine caches a finished request's generated blocks too; then evicts
        LRU blocks, as release() does. No reference kept. `mm`: the prompt's media items."""
        tokens = -(-len(seq) // BYTES_PER_TOKEN)
        # the prompt's blocks lead the chain, and match() stops before its last token
        hashes = block_hashes(seq + output, self.block_size, mm=mm)
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
