"""From a parsed request to its prefix key: the chain of block hashes the index is asked for.

With the model's tokenizer (tokens.py) a block is the engine's own block of token ids, chat
template applied; without it, a block of the canonical prompt's bytes (sizing.py). A prompt
longer than the engines take is refused here, before any work on the index.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .backends import Backend
from .errors import RequestError
from .offload import Offload
from .parsing import ParsedRequest, next_turn_canonical
from .prefix import block_hashes, chain_seed, extend_hashes
from .sizing import Sizing

if TYPE_CHECKING:
    from .tokens import ChatTokenizer


@dataclass(frozen=True, slots=True)
class Key:
    seed: int  # the chain's seed: model and cache salt
    hashes: list[int]  # chained block hashes of the prompt
    prompt_tokens: float  # engine tokens of the prompt (estimated with byte blocks)


class Keyer:
    def __init__(
        self, sizing: Sizing, offload: Offload, max_prompt_tokens: int,
        tokenizer: ChatTokenizer | None = None,
    ) -> None:
        self.sizing = sizing
        self.offload = offload
        self._max_prompt_tokens = max_prompt_tokens
        self._tokenizer = tokenizer

    @property
    def renders(self) -> bool:
        """Whether prompts are rendered here (with the tokenizer): a parsed chat must then
        keep its messages in this process."""
        return self._tokenizer is not None

    async def key(self, parsed: ParsedRequest, backends: Sequence[Backend]) -> Key:
        """The prompt's key, once it is known to fit the engines serving it. Pure CPU: large
        prompts run in a worker thread (offload.py)."""
        seed = chain_seed(parsed.model, parsed.cache_salt)
        return await self.offload.run(len(parsed.canonical), self._key, parsed, seed, backends)

    def _key(self, parsed: ParsedRequest, seed: int, backends: Sequence[Backend]) -> Key:
        if self._tokenizer is not None:
            self._tokenizer.tokenize(parsed)
        limit = min(
            (b.max_model_len for b in backends if b.max_model_len),
            default=self._max_prompt_tokens,
        )
        sizing = self.sizing
        tokens = sizing.prompt_tokens(len(parsed.canonical))
        # with byte blocks the count is an estimate: only what is far over is refused here
        if tokens > limit * (1.0 if sizing.exact else 2.0):
            what = "tokens" if sizing.exact else "tokens, estimated"
            raise RequestError(
                400,
                f"the prompt ({tokens:.0f} {what}) is longer than the model's context of "
                f"{limit} tokens",
                param="messages" if parsed.kind == "chat" else "prompt",
                code="context_length_exceeded",
            )
        return Key(seed, block_hashes(parsed.canonical, sizing.block_bytes, seed), tokens)

    def next_turn(self, parsed: ParsedRequest, key: Key, answer: str) -> list[int]:
        """The chain the conversation's next turn starts with: the prompt, then the answer."""
        if self._tokenizer is not None:
            canonical = self._tokenizer.next_turn_bytes(parsed, answer)
        else:
            canonical = next_turn_canonical(parsed, answer)
        return extend_hashes(key.hashes, canonical, self.sizing.block_bytes, key.seed)
