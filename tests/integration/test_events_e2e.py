"""The router on an index fed by the engines' KV events, end to end: simulator processes in
tokenizer mode publishing vLLM's frames, two router replicas in this process subscribing to
both, requests through their HTTP API."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import waiting
from events_fleet import MODEL, SYSTEM, publishing_sims

from bench.harness.fleet import Fleet
from bench.harness.promtext import sample_sum
from engine_sim.hf_tokenizer import TINY_TOKENIZER
from prefix_router.app import serve
from prefix_router.config import RouterSettings


def chat(user: str) -> dict[str, Any]:
    return {"model": MODEL, "max_tokens": 4, "stream": True,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "system", "content": SYSTEM},
                         {"role": "user", "content": user}]}  # fmt: skip


async def until(check, what: str, timeout: float = 60.0) -> Any:
    return await waiting.until(check, timeout, what, interval=0.05)

def gauge(text: str, name: str, backend: str | None = None) -> float:
    return sample_sum(text, name, **({} if backend is None else {"backend": backend}))


@pytest.fixture
async def setup(fleet: Fleet, request: pytest.FixtureRequest) -> AsyncIterator[dict[str, Any]]:
    kv_capacity = getattr(request, "param", 100_000)  # tokens a simulator holds
    sims, ends = await publishing_sims(fleet, kv_capacity)
    stops, tasks, urls = [], [], []
    for _ in range(2):
        s = RouterSettings.model_validate({
            "discovery": {"backends": sims}, "models": [MODEL], "port": 0,
            "index": "events", "tokenizer": str(TINY_TOKENIZER), "expose_routing": True,
            "cached_tokens_reported": True, "events": {"endpoints": ends},
            "metrics_port": None,  # /metrics on the API port: these tests read both there
        })  # fmt: skip
        stop = asyncio.Event()
        bound: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        tasks.append(asyncio.create_task(serve(s, stop, bound.set_result)))
        stops.append(stop)
        urls.append(f"http://127.0.0.1:{await asyncio.wait_for(bound, 30)}")
    async with aiohttp.ClientSession() as session:
        yield {"sims": sims, "routers": urls, "session": session}
    for stop in stops:
        stop.set()
    await asyncio.gather(*tasks)


async def ask(env: dict[str, Any], router: str, user: str) -> tuple[str, str, dict[str, Any]]:
    async with env["session"].post(router + "/v1/chat/completions", json=chat(user)) as r:
        assert r.status == 200, await r.text()
        usage: dict[str, Any] = {}
        async for line in r.content:
            if line.startswith(b"data: {"):
                usage = json.loads(line[6:]).get("usage") or usage
        return r.headers["x-routed-to"], r.headers["x-route-reason"], usage


async def metrics(env: dict[str, Any], url: str) -> str:
    async with env["session"].get(url + "/metrics") as r:
        return await r.text()


async def test_events_feed_the_index_and_both_routers_agree(setup) -> None:
    env = setup
    a, b = env["routers"]
    owner, reason, _ = await ask(env, a, "first question")
    assert reason == "miss"

    async def both_know() -> bool:
        ta, tb = await metrics(env, a), await metrics(env, b)
        ea = gauge(ta, "prefix_router_table_entries")
        return ea > 0 and ea == gauge(tb, "prefix_router_table_entries")

    await until(both_know, "both routers to hold the engine's blocks, the same count")
    # through the OTHER router, which never routed it: a hit on the owner, predicted exactly
    to, reason, usage = await ask(env, b, "second question")
    assert (to, reason) == (owner, "hit")
    cached = usage["prompt_tokens_details"]["cached_tokens"]
    assert cached > 0
    text = await metrics(env, b)
    assert gauge(text, "prefix_router_cache_prediction_error_tokens_sum") == 0.0


async def test_a_cleared_engine_is_no_owner_any_more(setup) -> None:
    env = setup
    a, _b = env["routers"]
    owner, _, _ = await ask(env, a, "first question")
    await until(lambda: _entries(env, a), "the engine's blocks")
    async with env["session"].post(owner + "/reset_prefix_cache") as r:
        assert r.status == 200

    async def emptied() -> bool:
        return not await _entries(env, a)

    await until(emptied, "the AllBlocksCleared event to empty the index")
    _, reason, _usage = await ask(env, a, "after the reset")
    assert reason == "miss"


async def _entries(env: dict[str, Any], url: str) -> float:
    return gauge(await metrics(env, url), "prefix_router_table_entries")


@pytest.mark.parametrize("setup", [2_000], indirect=True)  # tokens: a few prompts fill it
async def test_an_engine_is_learned_full_at_its_first_eviction(setup) -> None:
    """The events say what an engine stores and evicts, not how much it can hold: the router
    learns that from the first eviction (index/events.py) and shows it, with the streams'
    counts, on /metrics."""
    env = setup
    a, _b = env["routers"]
    given: dict[str, int] = {}
    for i in range(12):  # 696 tokens each, 376 of them its own: 2,000-token caches evict
        owner, _, _ = await ask(env, a, f"question {i} " + "with its own long context " * 60)
        given[owner] = given.get(owner, 0) + 1
    owners = [o for o, n in given.items() if n >= 6]  # their own blocks: over 2,000 tokens
    assert owners, given

    async def learned() -> bool:
        text = await metrics(env, a)
        return all(gauge(text, "prefix_router_engine_full_blocks", o) > 0 for o in owners)

    await until(learned, "the router to learn each engine's capacity from its evictions")
    text = await metrics(env, a)
    for o in owners:
        full = gauge(text, "prefix_router_engine_full_blocks", o)
        held = gauge(text, "prefix_router_engine_cached_blocks", o)
        # a block is 16 tokens: within the 2,000 tokens the engine has, and what it holds now
        assert 0 < held <= full <= 2_000 // 16, (o, full, held)
        assert gauge(text, "prefix_router_kv_events_total", o) > 0
    assert gauge(text, "prefix_router_kv_event_decode_errors_total") == 0
    assert gauge(text, "prefix_router_kv_event_resets_total") == 0
