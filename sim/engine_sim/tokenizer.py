"""The simulator's tokenizer: exactly one token per 4 bytes of UTF-8.

A real BPE tokenizer averages roughly 4 bytes of English per token; a fixed 4-byte grid keeps
that figure while making token counts a pure function of byte length, which is what lets the
router, the benchmark and the engine agree on prompt sizes without sharing a vocabulary.

`tokenize(text)` cuts the UTF-8 bytes into 4-byte chunks (the last one may be shorter) and maps
each chunk to `xxh32(chunk) % VOCAB_SIZE`. Chunks may split a multi-byte character; that is
fine because nothing ever needs to detokenize. Equal chunks give equal ids, so equal byte
prefixes give equal token prefixes, aligned to 4 bytes.
"""

from __future__ import annotations

import xxhash

BYTES_PER_TOKEN = 4
# Llama 3's vocabulary size, so ids look like the model the profiles describe.
VOCAB_SIZE = 128_256

_hash = xxhash.xxh32_intdigest


def _as_bytes(text: str | bytes) -> bytes:
    return text.encode() if isinstance(text, str) else text


def tokenize(text: str | bytes) -> list[int]:
    """Token ids of `text` (str is UTF-8 encoded first); len == ceil(bytes / 4)."""
    data = _as_bytes(text)
    # One comprehension over 4-byte slices: ~0.3 µs a token, so an 8,000-character prompt
    # costs well under a millisecond.
    return [_hash(data[i : i + BYTES_PER_TOKEN]) % VOCAB_SIZE for i in range(0, len(data), 4)]


def count_tokens(text: str | bytes) -> int:
    """len(tokenize(text)) without hashing anything."""
    return -(-len(_as_bytes(text)) // BYTES_PER_TOKEN)


def token_id(piece: str) -> int:
    """The id of a piece of exactly 4 bytes (one token), as tokenize would give it."""
    data = piece.encode()
    if len(data) != BYTES_PER_TOKEN:
        raise ValueError(f"a token piece is {BYTES_PER_TOKEN} bytes, got {len(data)}")
    return _hash(data) % VOCAB_SIZE
