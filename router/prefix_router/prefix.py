"""Prefix keys: chained xxh3_64 hashes over fixed-size blocks of the canonical bytes.

Block i's hash is xxh3_64(block_i, seed=hash of block i-1); the first block is seeded with a
hash of (model, cache salt). So a hash names a whole prefix, not just one block's bytes, and two
tenants with different salts never share an entry. Only full blocks are hashed, as engines only
cache full KV blocks.
"""

from __future__ import annotations

import xxhash

_xxh = xxhash.xxh3_64_intdigest

# A prompt's key covers at most its first this many blocks (131,072 tokens in blocks of 16):
# the index, the holds and the lookups of one request then cost a few milliseconds on the
# event loop however long the prompt; prompts sharing more than that are not told apart.
MAX_CHAIN_BLOCKS = 8192


def chain_seed(model: str, salt: str | None) -> int:
    key = model if salt is None else f"{model}\x00{salt}"
    return _xxh(key.encode())


def block_hashes(
    canonical: bytes, block_bytes: int, seed: int, limit: int = MAX_CHAIN_BLOCKS
) -> list[int]:
    """Chained hashes of every full block (at most `limit` blocks)."""
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
    prefix_hashes: list[int], canonical: bytes, block_bytes: int, seed: int
) -> list[int]:
    """Hashes of `canonical`, reusing already computed hashes of its first blocks."""
    n = min(len(canonical) // block_bytes, MAX_CHAIN_BLOCKS)
    done = min(len(prefix_hashes), n)
    out = prefix_hashes[:done]
    h = out[-1] if out else seed
    for i in range(done, n):
        h = _xxh(canonical[i * block_bytes : (i + 1) * block_bytes], h)
        out.append(h)
    return out
