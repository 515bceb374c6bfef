"""Prefix keys: chained xxh3_64 hashes over fixed-size blocks of the canonical bytes.

Block i's hash is xxh3_64(block_i, seed=hash of block i-1); the first block is seeded with a
hash of (model, cache salt). So a hash names a whole prefix, not just one block's bytes, and two
tenants with different salts never share an entry. Only full blocks are hashed, as engines only
cache full KV blocks.

A media item (an image, audio, video) is a span of the canonical bytes (its placeholder's tokens,
or its marker in byte mode) and an identity (the hash of its bytes or URL, conversation.py).
Every block that overlaps a span is hashed with the item's identity and where the item starts
relative to the block, as vLLM keys such a block with the item's hash in its extra keys
(vllm/v1/core/kv_cache_utils.py `_gen_mm_extra_hash_keys`): two prompts that differ only in an
image part at the image's first block, and equal images share their blocks. Blocks that overlap
no span are hashed as before, so a text-only prompt's key does not depend on this.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import xxhash

_xxh = xxhash.xxh3_64_intdigest

# A prompt's key covers at most its first this many blocks (131,072 tokens in blocks of 16):
# the index, the holds and the lookups of one request then cost a few milliseconds on the
# event loop however long the prompt; prompts sharing more than that are not told apart.
MAX_CHAIN_BLOCKS = 8192
# Separators of a block's media keys: 0xff/0xfe never occur in UTF-8 (parsing.py's rule), so an
# identity cannot forge the next item.
_MEDIA = b"\xff\x05"
_AT = b"\xfe"


@dataclass(frozen=True, slots=True)
class Media:
    """A media item's span [start, end) in the canonical bytes and its identity."""

    start: int
    end: int
    identity: str


def media_keys(items: Iterable[tuple[str, int]]) -> bytes:
    """A block's media keys as hashed after its bytes: (identity, where the item starts in
    canonical bytes, relative to the block's first byte; negative when it began earlier) for
    each item the block overlaps, in order. The KV-event feed builds the same from vLLM's
    extra keys (events/feed.py)."""
    return b"".join(_MEDIA + ident.encode() + _AT + str(at).encode() for ident, at in items)


def _media_by_block(media: Sequence[Media], block_bytes: int) -> dict[int, bytes]:
    """The media keys of each block that overlaps an item (block index -> keys): the others,
    most of a prompt, then cost one dict look-up each."""
    items: dict[int, list[tuple[str, int]]] = {}
    for m in media:
        for i in range(m.start // block_bytes, (m.end - 1) // block_bytes + 1):
            items.setdefault(i, []).append((m.identity, m.start - i * block_bytes))
    return {i: media_keys(its) for i, its in items.items()}


def chain_seed(model: str, salt: str | None) -> int:
    key = model if salt is None else f"{model}\x00{salt}"
    return _xxh(key.encode())


def block_hashes(
    canonical: bytes, block_bytes: int, seed: int, limit: int = MAX_CHAIN_BLOCKS,
    media: Sequence[Media] = (),
) -> list[int]:
    """Chained hashes of every full block (at most `limit` blocks), the blocks that overlap a
    media item's span with its keys."""
    if media:
        return extend_hashes([], canonical, block_bytes, seed, media, limit)
    n = min(len(canonical) // block_bytes, limit)
    out: list[int] = []
    append = out.append
    h = seed
    # Slicing bytes measured faster than memoryview slices for blocks this small.
    for pos in range(0, n * block_bytes, block_bytes):
        h = _xxh(canonical[pos : pos + block_bytes], h)
        append(h)
    return out


def extend_hashes(
    prefix_hashes: list[int], canonical: bytes, block_bytes: int, seed: int,
    media: Sequence[Media] = (), limit: int = MAX_CHAIN_BLOCKS,
) -> list[int]:
    """Hashes of `canonical`, reusing already computed hashes of its first blocks."""
    n = min(len(canonical) // block_bytes, limit)
    done = min(len(prefix_hashes), n)
    out = prefix_hashes[:done]
    h = out[-1] if out else seed
    if not media:
        for i in range(done, n):
            h = _xxh(canonical[i * block_bytes : (i + 1) * block_bytes], h)
            out.append(h)
        return out
    keys = _media_by_block(media, block_bytes)
    for i in range(done, n):
        block = canonical[i * block_bytes : (i + 1) * block_bytes]
        extra = keys.get(i)
        h = _xxh(block + extra if extra else block, h)
        out.append(h)
    return out
