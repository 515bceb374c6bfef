"""The simulator's hybrid model (--sliding-window): a sliding-window KV-cache group beside the
full-attention one, in a pool of its own. A hit needs the window's blocks before the hit point
in that group (vLLM's SlidingWindowManager), so a prefix the full-attention group still holds
is no hit once the window group evicted its blocks."""

from __future__ import annotations

from engine_sim.engine import Engine
from engine_sim.profiles import PROFILES


def _prompt(tag: str, tokens: int) -> bytes:
    return tag.encode() * (tokens * 4)  # 4 bytes a token (tokenizer.py)


async def _run(e: Engine, prompt: bytes) -> int:
    r = e.submit(prompt, 1, 0)
    while await r.out.get() is not None:
        pass
    return r.cached_tokens


async def test_a_hit_needs_the_window_groups_blocks() -> None:
    hybrid = Engine(PROFILES["zero"], 4096, 16, window_tokens=48, window_capacity_tokens=256)
    plain = Engine(PROFILES["zero"], 4096, 16)
    for e in (hybrid, plain):
        await _run(e, _prompt("a", 160))
        assert await _run(e, _prompt("a", 160)) == 144  # 9 blocks: both groups hold them
        await _run(e, _prompt("b", 240))  # fills the window group's 16 blocks, not the other
    assert await _run(plain, _prompt("a", 160)) == 144
    assert await _run(hybrid, _prompt("a", 160)) == 0
