"""Deterministic output text: pseudo-words from an RNG seeded by (prompt, seed).

Every piece is exactly 4 ASCII bytes (a 3-letter pseudo-word and a space), so it is exactly one
token of the simulator's tokenizer: `len(tokenize(output_text)) == completion_tokens`, and the
token ids the engine caches for its output are those the next turn's prompt will contain.
"""

from __future__ import annotations

import random
from array import array
from collections.abc import Sequence

import xxhash

from .tokenizer import token_id

_C = "bcdfghklmnprstvz"
_V = "aeiou"
PIECES: tuple[str, ...] = tuple(a + b + c + " " for a in _C for b in _V for c in _C)
PIECE_IDS: tuple[int, ...] = tuple(token_id(p) for p in PIECES)


def prompt_key(prompt_ids: Sequence[int]) -> int:
    return xxhash.xxh3_64_intdigest(array("I", prompt_ids).tobytes())


class OutputStream:
    """The answer to one prompt, one token at a time."""

    __slots__ = ("_rng",)

    def __init__(self, prompt_ids: Sequence[int], seed: int | None = None) -> None:
        self._rng = random.Random(prompt_key(prompt_ids) ^ ((seed or 0) & (2**64 - 1)))

    def next(self) -> tuple[int, str]:
        i = self._rng.randrange(len(PIECES))
        return PIECE_IDS[i], PIECES[i]
