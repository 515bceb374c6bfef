"""An engine with a CPU tier behind its GPU cache (the simulator's --kv-offloading-tokens, as
vLLM's CPU offloading), end to end: its KV events for both media feed the router, and a prompt
the GPU evicted but the CPU tier holds is routed to that engine, at its load cost, rather than
to one holding a few of its first blocks on GPU. `tier_costs: {}` (GPU-only scoring) goes to
the latter."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import waiting

from bench.harness.fleet import Fleet, free_port
from bench.harness.promtext import sample_sum
from engine_sim.hf_tokenizer import TINY_TOKENIZER
from prefix_router.app import serve
from prefix_router.config import RouterSettings

MODEL = "test-model"
SYSTEM = "You answer questions about the billing of claims, briefly and politely. " * 12


def chat(system: str, user: str = "a question") -> dict[str, Any]:
    return {"model": MODEL, "max_tokens": 2,
            "messages": [{"role": "system", "content": system},
                         {"role": "user", "content": user}]}  # fmt: skip


async def env_for(fleet: Fleet, tier_costs: dict[str, float]) -> AsyncIterator[dict[str, Any]]:
    sims, ends = [], {}
    for i in range(2):
        pub, replay = free_port(), free_port()
        cfg = {"enable_kv_cache_events": True, "publisher": "zmq",
               "endpoint": f"tcp://127.0.0.1:{pub}", "replay_endpoint": f"tcp://127.0.0.1:{replay}"}
        # 32 GPU blocks: a 450-token prompt pushes out everything else; 1,024 in the CPU tier
        p = await fleet.start_sim(
            f"sim{i}", model=MODEL, kv_capacity=512, profile="fast", time_scale=1.0,
            extra=["--tokenizer", "tiny", "--enable-prompt-tokens-details",
                   "--kv-offloading-tokens", "16384", "--kv-events-config", json.dumps(cfg)],
        )  # fmt: skip
        sims.append(p.url)
        ends[p.url] = f"tcp://127.0.0.1:{pub},tcp://127.0.0.1:{replay}"
    s = RouterSettings.model_validate({
        "discovery": {"backends": sims}, "models": [MODEL], "port": 0, "index": "events",
        "metrics_port": None,  # /metrics on the API port: the test reads it there
        "tokenizer": str(TINY_TOKENIZER), "expose_routing": True,
        "cached_tokens_reported": True, "events": {"endpoints": ends, "tier_costs": tier_costs},
    })  # fmt: skip
    stop = asyncio.Event()
    bound: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(serve(s, stop, bound.set_result))
    router = f"http://127.0.0.1:{await asyncio.wait_for(bound, 30)}"
    async with aiohttp.ClientSession() as session:
        yield {"sims": sims, "router": router, "session": session}
    stop.set()
    await task


@pytest.fixture
async def env(fleet: Fleet, request: pytest.FixtureRequest) -> AsyncIterator[dict[str, Any]]:
    async for e in env_for(fleet, request.param):
        yield e


async def post(env: dict[str, Any], url: str, body: dict[str, Any]) -> tuple[str, int]:
    async with env["session"].post(url + "/v1/chat/completions", json=body) as r:
        assert r.status == 200, await r.text()
        usage = (await r.json())["usage"]
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
        return r.headers.get("x-routed-to", url), cached


async def caught_up(env: dict[str, Any]) -> None:
    """The router has applied every event each simulator published."""

    async def done() -> bool:
        async with env["session"].get(env["router"] + "/metrics") as r:
            text = await r.text()
        for sim in env["sims"]:
            async with env["session"].get(sim + "/stats") as r:
                sent = (await r.json())["kv_events"]["published_events"]
            if sample_sum(text, "prefix_router_kv_events_total", backend=sim) != sent:
                return False
        return True

    await waiting.until(done, 60, "the router to apply every event", interval=0.05)


@pytest.mark.parametrize(("env", "to_cpu_holder"), [({"CPU": 1 / 22}, True), ({}, False)],
                         indirect=["env"], ids=["tier-scoring", "gpu-only"])  # fmt: skip
async def test_a_prefix_in_the_cpu_tier_draws_its_request(env, to_cpu_holder: bool) -> None:
    holder, _ = await post(env, env["router"], chat(SYSTEM))
    other = next(s for s in env["sims"] if s != holder)
    # both GPU caches fill with other prompts (so a placement evicts alike on both): the
    # holder's copy of the prefix moves to its CPU tier
    for sim in (holder, other):
        for i in range(3):
            await post(env, sim, {"model": MODEL, "max_tokens": 2, "messages": [
                {"role": "user", "content": f"filler text number {i} " * 70}]})
    # the other engine holds the first few blocks of the prefix, on GPU
    await post(env, other, chat(SYSTEM[:300] + "Something else entirely here. " * 10))
    await caught_up(env)
    to, cached = await post(env, env["router"], chat(SYSTEM, "another question"))
    if to_cpu_holder:
        assert to == holder and cached >= 300  # loaded from the CPU tier
    else:
        assert to == other
