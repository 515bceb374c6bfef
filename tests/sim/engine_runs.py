"""Prompts run through a simulated Engine in process, for the tests of its cache."""

from __future__ import annotations

from engine_sim.engine import Engine


def prompt(tag: str, tokens: int) -> bytes:
    return tag.encode() * (tokens * 4)  # 4 bytes a token (tokenizer.py)


async def cached_tokens(e: Engine, prompt: bytes) -> int:
    """Runs `prompt` (one output token) to its end: the prompt tokens it found cached."""
    r = e.submit(prompt, 1, 0)
    while await r.out.get() is not None:
        pass
    return r.cached_tokens
