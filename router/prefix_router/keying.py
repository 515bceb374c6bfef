"""From a parsed request to its prefix key: the chain of block hashes the index is asked for.

With the model's tokenizer a block is the engine's own block of token ids, its prompt built
as vLLM builds it (prompt.py, conversation.py); without it, a block of the canonical prompt's
bytes (sizing.py). A media item (an image) is keyed as vLLM keys it: every block over its
placeholder's tokens (its marker's bytes, without a tokenizer) carries its identity (prefix.py).
A prompt longer than the engines take is refused here, before any work on the index.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .backends import Backend
from .errors import RequestError
from .offload import Offload
from .parsing import ParsedRequest, next_turn_canonical
from .prefix import Media, block_hashes, chain_seed, extend_hashes
from .prompt import Prompt, PromptError, token_media
from .sizing import Sizing

if TYPE_CHECKING:
    from .prompt import Renderer


@dataclass(frozen=True, slots=True)
class Key:
    seed: int  # the chain's seed: model and cache salt
    hashes: list[int]  # chained block hashes of the prompt
    prompt_tokens: float  # engine tokens of the prompt (estimated with byte blocks)
    prompt: Prompt | None = None  # what the engine runs (None: a pinned request, unkeyed)
    media: tuple[Media, ...] = ()  # the media items' spans in canonical bytes (byte blocks)


class Keyer:
    def __init__(
        self, sizing: Sizing, offload: Offload, max_prompt_tokens: int,
        renderer: Renderer | None = None,
    ) -> None:
        self.sizing = sizing
        self.offload = offload
        self._max_prompt_tokens = max_prompt_tokens
        self._renderer = renderer

    @property
    def renders(self) -> bool:
        """Whether prompts are rendered here (with the tokenizer): a parsed chat must then
        keep its messages in this process."""
        return self._renderer is not None

    async def key(self, parsed: ParsedRequest, backends: Sequence[Backend]) -> Key:
        """The prompt's key, once it is known to fit the engines serving it. Pure CPU: large
        prompts run in a worker thread (offload.py)."""
        seed = chain_seed(parsed.model, parsed.cache_salt)
        return await self.offload.run(len(parsed.canonical), self._key, parsed, seed, backends)

    def prompt(self, parsed: ParsedRequest) -> Prompt:
        """The prompt the engine will run: rendered and tokenized as vLLM does (prompt.py)
        with a tokenizer, else the request's canonical bytes."""
        if self._renderer is not None:
            try:
                return self._renderer.request(parsed.kind, parsed.body)
            except PromptError as exc:  # what the engine would answer too
                raise RequestError(400, str(exc), param=exc.param) from None
        return Prompt(parsed.canonical, exact=False,
                      continuation=lambda answer: Prompt(next_turn_canonical(parsed, answer),
                                                         exact=False))  # fmt: skip

    def _key(self, parsed: ParsedRequest, seed: int, backends: Sequence[Backend]) -> Key:
        prompt = self.prompt(parsed)
        limit = min(
            (b.max_model_len for b in backends if b.max_model_len),
            default=self._max_prompt_tokens,
        )
        sizing = self.sizing
        tokens = sizing.prompt_tokens(len(prompt.canonical))
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
        media = token_media(prompt) if prompt.exact else parsed.media
        hashes = block_hashes(prompt.canonical, sizing.block_bytes, seed, media=media)
        return Key(seed, hashes, tokens, prompt, () if prompt.exact else media)

    def next_turn(self, key: Key, answer: str) -> list[int]:
        """The chain the conversation's next turn starts with: the prompt, then the answer."""
        if key.prompt is None:
            return key.hashes
        nxt = key.prompt.next_turn(answer)
        # byte blocks: the next turn's bytes start with this prompt's, its media spans too
        media = token_media(nxt) if nxt.exact else key.media
        return extend_hashes(key.hashes, nxt.canonical, self.sizing.block_bytes, key.seed, media)
