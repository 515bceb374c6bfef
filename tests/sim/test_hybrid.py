"""The simulator's hybrid model (--sliding-window): a sliding-window KV-cache group beside the
full-attention one, in a pool of its own. A hit needs the window's blocks before the hit point
in that group (vLLM's SlidingWindowManager), so a prefix the full-attention group still holds
is no hit once the window group evicted its blocks."""

from __future__ import annotations

from engine_runs import cached_tokens, prompt

from engine_sim.engine import Engine
from engine_sim.profiles import PROFILES


async def test_a_hit_needs_the_window_groups_blocks() -> None:
    hybrid = Engine(PROFILES["zero"], 4096, 16, window_tokens=48, window_capacity_tokens=256)
    plain = Engine(PROFILES["zero"], 4096, 16)
    for e in (hybrid, plain):
        await cached_tokens(e, prompt("a", 160))
        assert await cached_tokens(e, prompt("a", 160)) == 144  # 9 blocks: both groups hold them
        # fills the window group's 16 blocks, not the other
        await cached_tokens(e, prompt("b", 240))
    assert await cached_tokens(plain, prompt("a", 160)) == 144
    assert await cached_tokens(hybrid, prompt("a", 160)) == 0
