"""An engine with a CPU tier behind its GPU cache (the simulator's --kv-offloading-tokens, as
vLLM's CPU offloading), end to end: its KV events for both media feed the router, and a prompt
the GPU evicted but the CPU tier holds is routed to that engine, at its load cost, rather than
to one holding a few of its first blocks on GPU. `tier_costs: {}` (GPU-only scoring) goes to
the latter."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from events_fleet import SYSTEM, caught_up, chat, events_router, filler, post

from bench.harness.fleet import Fleet


@pytest.fixture
async def env(fleet: Fleet, request: pytest.FixtureRequest) -> AsyncIterator[dict[str, Any]]:
    # 32 GPU blocks: a 450-token prompt pushes out everything else; 1,024 in the CPU tier
    async for e in events_router(fleet, 512, ["--kv-offloading-tokens", "16384"],
                                 {"tier_costs": request.param}):  # fmt: skip
        yield e


@pytest.mark.parametrize(("env", "to_cpu_holder"), [({"CPU": 1 / 22}, True), ({}, False)],
                         indirect=["env"], ids=["tier-scoring", "gpu-only"])  # fmt: skip
async def test_a_prefix_in_the_cpu_tier_draws_its_request(env, to_cpu_holder: bool) -> None:
    holder, _, _ = await post(env, env["router"], chat(SYSTEM))
    other = next(s for s in env["sims"] if s != holder)
    # both GPU caches fill with other prompts (so a placement evicts alike on both): the
    # holder's copy of the prefix moves to its CPU tier
    for sim in (holder, other):
        for i in range(3):
            await post(env, sim, filler(i))
    # the other engine holds the first few blocks of the prefix, on GPU
    await post(env, other, chat(SYSTEM[:300] + "Something else entirely here. " * 10))
    await caught_up(env)
    to, _, cached = await post(env, env["router"], chat(SYSTEM, "another question"))
    if to_cpu_holder:
        assert to == holder and cached >= 300  # loaded from the CPU tier
    else:
        assert to == other
