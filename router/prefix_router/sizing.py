"""How the router's blocks and bytes translate into the engines' tokens.

With byte blocks (no tokenizer known) a block is `block_bytes` of canonical prompt and its
size in tokens is an estimate: bytes per token start at the `bytes_per_token` setting and are
learned from the `prompt_tokens` the engines report, so the capacity model, the predicted
cached tokens and the pending prefill follow the real tokenizer (a fixed 4 bytes a token read
28% low for a llama.cpp tokenizer). With token-aligned blocks every figure is exact. Pure.
"""

from __future__ import annotations

# Weight of each reported prompt in the learned ratio: a few hundred requests make it.
_WEIGHT = 0.02
# Reports are trusted within this factor of the setting (a garbled usage must not wreck it).
_SPAN = 4.0


class Sizing:
    __slots__ = ("_applied", "_prior", "block_bytes", "bytes_per_token", "exact")

    def __init__(self, block_size: int, block_bytes: int, bytes_per_token: float, exact: bool):
        if exact:  # token ids as 4-byte words (tokens.py): sizes are counts, nothing to learn
            block_bytes, bytes_per_token = block_size * 4, 4.0
        self.block_bytes = block_bytes
        self.bytes_per_token = bytes_per_token
        self._prior = bytes_per_token
        self._applied = bytes_per_token
        self.exact = exact

    @property
    def block_tokens(self) -> float:
        """Engine tokens in one router block."""
        return self.block_bytes / self.bytes_per_token

    def prompt_tokens(self, size: int) -> float:
        """Engine tokens of a prompt of `size` canonical bytes."""
        return size / self.bytes_per_token

    def learn(self, size: int, reported_tokens: int) -> bool:
        """An engine counted `reported_tokens` in a prompt of `size` canonical bytes. True
        when the block size in tokens moved 2% since it was last applied (`applied`), for
        the capacity model to follow."""
        if self.exact or reported_tokens <= 0 or size <= 0:
            return False
        ratio = size / reported_tokens
        if not self._prior / _SPAN <= ratio <= self._prior * _SPAN:
            return False
        self.bytes_per_token += _WEIGHT * (ratio - self.bytes_per_token)
        if abs(self.bytes_per_token - self._applied) > 0.02 * self._applied:
            self._applied = self.bytes_per_token
            return True
        return False
