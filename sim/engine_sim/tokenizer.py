"""A deterministic tokenizer: one token per 4 bytes of UTF-8 (the last token may be shorter).

Real tokenizers average ~4 characters per token on English text, which is the ratio routers
use to estimate tokens; fixing it exactly keeps every token count in the benchmarks exact and
makes a token sequence a pure function of the bytes, so the KV cache can hash byte blocks
(block_size tokens = 4 * block_size bytes) without materialising token ids.
"""

from __future__ import annotations

from array import array

import xxhash

BYTES_PER_TOKEN = 4
VOCAB_SIZE = 128_256  # Llama 3's vocabulary size, for plausible token ids


def count_tokens(data: bytes) -> int:
    return -(-len(data) // BYTES_PER_TOKEN)


def tokenize(text: str) -> list[int]:
    return tokenize_bytes(text.encode())


def tokenize_bytes(data: bytes) -> list[int]:
    h = xxhash.xxh32_intdigest
    return [h(data[i : i + BYTES_PER_TOKEN]) % VOCAB_SIZE for i in range(0, len(data), 4)]


def token_ids_to_bytes(ids: list[int]) -> bytes:
    """A prompt given as token ids: each id is exactly one 4-byte token."""
    return array("I", ids).tobytes()
