"""A hybrid model (a full-attention KV-cache group and a sliding-window one: the simulator's
--sliding-window), end to end: each group's KV events feed the router, and a prefix whose
full-attention blocks an engine still holds but whose window blocks it evicted is no hit
there, for the router as for the engine (a hit needs the window's blocks before the hit
point in the sliding-window group: index/tiers.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from events_fleet import SYSTEM, caught_up, chat, events_router, filler, post

from bench.harness.fleet import Fleet


@pytest.fixture
async def env(fleet: Fleet) -> AsyncIterator[dict[str, Any]]:
    # full attention: 256 blocks; the 48-token window group: 32 blocks of its own
    async for e in events_router(fleet, 4096, ["--sliding-window", "48",
                                               "--sliding-window-capacity", "512"],
                                 # the router's own claims after an answer (speculative,
                                 # until events confirm them) would stand in for the index
                                 # here: they end at once
                                 {"speculative_s": 0.001}):  # fmt: skip
        yield e


async def test_a_prefix_without_its_window_blocks_is_no_hit(env) -> None:
    holder, _, _ = await post(env, env["router"], chat(SYSTEM))
    _, _, cached = await post(env, holder, chat(SYSTEM, "again"))
    assert cached > 0  # both groups hold it
    # other prompts push the prefix out of the holder's window group, not its full one
    for i in range(2):
        await post(env, holder, filler(i))
    await caught_up(env)
    _, reason, cached = await post(env, env["router"], chat(SYSTEM, "once more"))
    assert reason == "miss" and cached == 0  # the router knew what the engine then did
