"""How the router's blocks and bytes translate into the engines' tokens.

With byte blocks (no tokenizer known) a block is `block_bytes` of canonical prompt and its
size in tokens is an estimate: bytes per token start at the `bytes_per_token` setting and are
learned from the `prompt_tokens` the engines report, so the capacity model, the predicted
cached tokens and the pending prefill follow the real tokenizer (a fixed 4 bytes a token read
28% low for a llama.cpp tokenizer). With token-aligned blocks every figure is exact. Pure.
"""

from __future__ import annotations

from collections.abc import Callable

# Weight of each reported prompt in the learned ratio: a few hundred requests make it.
_WEIGHT = 0.02
# Reports are trusted within this factor of the setting (a garbled usage must not wreck it).
_SPAN = 4.0


class Sizing:
    __slots__ = ("_applied", "_prior", "_watchers", "block_bytes", "bytes_per_token", "exact")

    def __init__(self, block_size: int, block_bytes: int, bytes_per_token: float, exact: bool):
        if exact:  # token ids as 4-byte words (tokens.py): sizes are counts, nothing to learn
            block_bytes, bytes_per_token = block_size * 4, 4.0
        self.block_bytes = block_bytes
        self.bytes_per_token = bytes_per_token
        self._prior = bytes_per_token
        self._applied = bytes_per_token
        self.exact = exact
        self._watchers: list[Callable[[float], None]] = []

    def watch(self, fn: Callable[[float], None]) -> None:
        """`fn(block_tokens)` now and whenever the learned block size moves (the capacity
        models follow it)."""
        self._watchers.append(fn)
        fn(self.block_tokens)

    @property
    def block_tokens(self) -> float:
        """Engine tokens in one router block."""
        return self.block_bytes / self.bytes_per_token

    def prompt_tokens(self, size: int) -> float:
        """Engine tokens of a prompt of `size` canonical bytes."""
        return size / self.bytes_per_token

    def blocks_tokens(self, blocks: int) -> float:
        """Engine tokens in `blocks` router blocks."""
        return blocks * self.block_tokens

    def learn(self, size: int, reported_tokens: int) -> bool:
        """An engine counted `reported_tokens` in a prompt of `size` canonical bytes. True
        when the block size in tokens moved 2% since it was last applied: the watchers then
        follow it."""
        if self.exact or reported_tokens <= 0 or size <= 0:
            return False
        ratio = size / reported_tokens
        if not self._prior / _SPAN <= ratio <= self._prior * _SPAN:
            return False
        self.bytes_per_token += _WEIGHT * (ratio - self.bytes_per_token)
        if abs(self.bytes_per_token - self._applied) <= 0.02 * self._applied:
            return False
        self._applied = self.bytes_per_token
        for fn in self._watchers:
            fn(self.block_tokens)
        return True

    def evidence(self, matched: int, prompt: int, cached: int) -> tuple[int, int]:
        """(predicted, held) leading blocks of a prompt of `prompt` engine tokens whose engine
        reported `cached` tokens from cache, against the `matched` blocks the index gave it.
        Whole blocks: engines count to the token. An engine computes at least a prompt's last
        token (vLLM caps a hit at prompt - 1), so of a prompt held whole it reports one block
        less: not a block it dropped. With byte blocks a difference of one block is within
        the estimate's own error."""
        held = int(cached // self.block_tokens)
        if self.exact:
            return min(matched, max(0, int((prompt - 1) // self.block_tokens))), held
        return matched, matched if abs(held - matched) <= 1 else held
