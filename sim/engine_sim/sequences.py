"""What a request's token sequence is, in the simulator's two modes.

- `ByteSequences` (the default): 4 bytes a token (tokenizer.py); blocks are hashed over the
  prompt's bytes; output tokens are 4-byte pseudo-words.
- `TokenSequences` (`--tokenizer DIR`): the prompt is real token ids; blocks are hashed over
  ids with the engine's own salted chain (kvcache.TokenBlockHasher), LoRA name, cache salt
  and the prompt's media items (an image's hash on the blocks over its placeholder tokens) as
  extra keys, as vLLM's are; output tokens are words of the vocabulary chosen so the answer
  re-tokenizes to the very same ids (the next turn's prompt then holds them, as with a model
  whose output is canonically tokenized).

Both give the engine the same four things: the prompt's block hashes, the hashes of what was
computed when a request stops (to cache it), those to recompute after a preemption, and the
token ids of a range of blocks (for KV events).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import xxhash

from .kvcache import TokenBlockHasher, block_hashes, mm_keys
from .tokenizer import BYTES_PER_TOKEN, tokenize_bytes

if TYPE_CHECKING:
    from .engine import Request
    from .hf_tokenizer import ChatTokenizer

# 4-byte output pieces (one token each) so len(output bytes) == 4 x completion tokens.
_PIECES = [a + b + c + " " for a in "bdfklmnprstvz" for b in "aeiou" for c in "nrstl"]
_WORDS_MAX = 512


def output_piece(seed: int, i: int) -> str:
    return _PIECES[(seed * 2654435761 + i * 40503) % len(_PIECES)]


@dataclass(frozen=True)
class LoRA:
    """A LoRA adapter served under its own model name (vLLM's --lora-modules)."""

    id: int
    name: str
    path: str


def extra_keys(r: Request, first: int, last: int, b: int) -> list[tuple[Any, ...] | None] | None:
    """vLLM's event extra keys for blocks [first, last), in its order: the LoRA name on every
    block, the media items the block overlaps ((hash, offset from the block's first token)),
    the cache salt on block 0; None when the request has none of them. `b`: the block size."""
    if r.lora is None and not r.salt and not r.mm:
        return None
    out: list[tuple[Any, ...] | None] = []
    for i in range(first, last):
        keys: tuple[Any, ...] = (r.lora.name,) if r.lora else ()
        if r.mm:
            keys += tuple(mm_keys(r.mm, i * b, (i + 1) * b))
        if i == 0 and r.salt:
            keys += (r.salt,)
        out.append(keys or None)
    return out


class ByteSequences:
    def __init__(self, block_size: int) -> None:
        self.block_size = block_size

    @staticmethod
    def _seed(r: Request) -> int:
        if r.lora is None and not r.salt:
            return 0
        return xxhash.xxh3_64_intdigest(f"{r.lora.name if r.lora else ''}\0{r.salt or ''}".encode())

    def _seq(self, r: Request) -> bytes:
        return r.prompt + "".join(r.text).encode() if r.text else r.prompt

    def prompt_hashes(self, r: Request) -> list[int]:
        return block_hashes(r.prompt, self.block_size, seed=self._seed(r))

    def final_hashes(self, r: Request) -> list[int]:
        return block_hashes(self._seq(r), self.block_size, seed=self._seed(r))

    resume_hashes = final_hashes

    def piece(self, r: Request, i: int) -> str:
        return output_piece(r.seed, i)

    def block_ids(self, r: Request, first: int, last: int) -> list[int]:
        step = self.block_size * BYTES_PER_TOKEN
        return tokenize_bytes(self._seq(r)[first * step : last * step])


class TokenSequences:
    def __init__(self, tokenizer: ChatTokenizer, hasher: TokenBlockHasher) -> None:
        self.tokenizer = tokenizer
        self.hasher = hasher
        self.block_size = hasher.block_size
        self._words = _output_words(tokenizer)

    def _extend(self, r: Request, ids: list[int]) -> list[int]:
        return self.hasher.extend(r.hashes, ids, r.lora.name if r.lora else None, r.salt, r.mm)

    def prompt_hashes(self, r: Request) -> list[int]:
        assert r.ids is not None
        return self.hasher.extend([], r.ids, r.lora.name if r.lora else None, r.salt, r.mm)

    def final_hashes(self, r: Request) -> list[int]:
        # the last sampled token was never fed back, so its KV was never computed
        assert r.ids is not None
        return self._extend(r, r.ids + r.out_ids[:-1])

    def resume_hashes(self, r: Request) -> list[int]:
        assert r.ids is not None
        return self._extend(r, r.ids + r.out_ids)

    def piece(self, r: Request, i: int) -> str:
        words = self._words
        bare, spaced = words[(r.seed * 2654435761 + i * 40503) % len(words)]
        tid, text = spaced if i else bare
        r.out_ids.append(tid)
        return text

    def block_ids(self, r: Request, first: int, last: int) -> list[int]:
        assert r.ids is not None
        b = self.block_size
        return (r.ids + r.out_ids)[first * b : last * b]


def _output_words(tok: ChatTokenizer) -> list[tuple[tuple[int, str], tuple[int, str]]]:
    """Words that are one token alone and one token after a space, both ways round-tripping:
    "w1 w2 w3" then encodes to exactly [w1, " w2", " w3"]."""
    words = []
    for tid in range(tok.vocab_size):
        text = tok.decode([tid], skip_special_tokens=True)
        if not re.fullmatch(r" [a-z]{2,8}", text) or tok.encode(text) != [tid]:
            continue
        bare = tok.encode(text[1:])
        if len(bare) == 1 and tok.decode(bare) == text[1:]:
            words.append(((bare[0], text[1:]), (tid, text)))
            if len(words) == _WORDS_MAX:
                break
    if not words:
        raise ValueError("the tokenizer has no single-token words to answer with")
    return words
