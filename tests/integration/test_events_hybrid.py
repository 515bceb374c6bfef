"""A hybrid model (a full-attention KV-cache group and a sliding-window one: the simulator's
--sliding-window), end to end: each group's KV events feed the router, and a prefix whose
full-attention blocks an engine still holds but whose window blocks it evicted is no hit
there, for the router as for the engine (a hit needs the window's blocks before the hit
point in the sliding-window group: index/tiers.py)."""

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


@pytest.fixture
async def env(fleet: Fleet) -> AsyncIterator[dict[str, Any]]:
    sims, ends = [], {}
    for i in range(2):
        pub, replay = free_port(), free_port()
        cfg = {"enable_kv_cache_events": True, "publisher": "zmq",
               "endpoint": f"tcp://127.0.0.1:{pub}", "replay_endpoint": f"tcp://127.0.0.1:{replay}"}
        # full attention: 256 blocks; the 48-token window group: 32 blocks of its own
        p = await fleet.start_sim(
            f"sim{i}", model=MODEL, kv_capacity=4096, profile="fast", time_scale=1.0,
            extra=["--tokenizer", "tiny", "--enable-prompt-tokens-details",
                   "--sliding-window", "48", "--sliding-window-capacity", "512",
                   "--kv-events-config", json.dumps(cfg)],
        )  # fmt: skip
        sims.append(p.url)
        ends[p.url] = f"tcp://127.0.0.1:{pub},tcp://127.0.0.1:{replay}"
    s = RouterSettings.model_validate({
        "discovery": {"backends": sims}, "models": [MODEL], "port": 0, "index": "events",
        "metrics_port": None,  # /metrics on the API port: the test reads it there
        "tokenizer": str(TINY_TOKENIZER), "expose_routing": True,
        "cached_tokens_reported": True,
        # the router's own claims after an answer (speculative, until events confirm them)
        # would stand in for the index here: they end at once
        "events": {"endpoints": ends, "speculative_s": 0.001},
    })  # fmt: skip
    stop = asyncio.Event()
    bound: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(serve(s, stop, bound.set_result))
    router = f"http://127.0.0.1:{await asyncio.wait_for(bound, 30)}"
    async with aiohttp.ClientSession() as session:
        yield {"sims": sims, "router": router, "session": session}
    stop.set()
    await task


async def post(env: dict[str, Any], url: str, body: dict[str, Any]) -> tuple[str, str, int]:
    async with env["session"].post(url + "/v1/chat/completions", json=body) as r:
        assert r.status == 200, await r.text()
        usage = (await r.json())["usage"]
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
        return r.headers.get("x-routed-to", url), r.headers.get("x-route-reason", ""), cached


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


async def test_a_prefix_without_its_window_blocks_is_no_hit(env) -> None:
    holder, _, _ = await post(env, env["router"], chat(SYSTEM))
    _, _, cached = await post(env, holder, chat(SYSTEM, "again"))
    assert cached > 0  # both groups hold it
    # other prompts push the prefix out of the holder's window group, not its full one
    for i in range(2):
        await post(env, holder, {"model": MODEL, "max_tokens": 2, "messages": [
            {"role": "user", "content": f"filler text number {i} " * 70}]})
    await caught_up(env)
    _, reason, cached = await post(env, env["router"], chat(SYSTEM, "once more"))
    assert reason == "miss" and cached == 0  # the router knew what the engine then did
