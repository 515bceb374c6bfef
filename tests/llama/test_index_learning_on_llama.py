"""What the router learns from llama-server's cached-token counts (index `corrected`, token
blocks), on one real server. Two ways it once learned wrong there, found by the real-engine
benchmark (bench/results/real-engine/README.md):

- llama-server reports cached tokens to the token; the router compares whole blocks, so a
  prompt shared 9-15 tokens past a block boundary must not read as one block more held
  ("under"): the engine's count is floored to whole blocks.
- llama-server's slots keep their KV to themselves: a request for a prompt that a busy slot
  holds is computed in full in another slot. That miss must not make the router forget the
  prefixes the server still holds (a keep time learned from such misses did: learning.py)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer
from llama_env import BUILD_TIMEOUT, TOKENIZER_DIR
from llama_fleet import LlamaFleet, ServerConfig

from prefix_router.app import build_app
from prefix_router.config import RouterSettings

pytestmark = [pytest.mark.llama, pytest.mark.timeout(BUILD_TIMEOUT)]

BLOCK = 16  # the router's block_size (its default), in tokens
PA = " ".join(f"alpha{i} governs each clause" for i in range(150))
PB = " ".join(f"beta{i} covers every case" for i in range(150))


def chat(system: str, user: str, max_tokens: int = 4, **extra: Any) -> dict[str, Any]:
    return {"model": "tiny-llama", "max_tokens": max_tokens, "stream": True,
            "stream_options": {"include_usage": True}, "temperature": 0,
            "messages": [{"role": "system", "content": system},
                         {"role": "user", "content": user}], **extra}


@pytest.fixture
async def routed(
    tmp_path: Path, llama_binary: Path, llama_model: Path
) -> AsyncIterator[dict[str, Any]]:
    """One llama-server (2 slots, 16 MiB host cache) behind our router in process."""
    async with LlamaFleet(tmp_path / "logs") as fleet:
        (engine,) = await fleet.start(
            1, llama_binary, llama_model, ServerConfig(slots=2, cache_ram_mib=16))
        s = RouterSettings.model_validate({
            "discovery": {"backends": [engine.url]}, "port": 0, "tokenizer": str(TOKENIZER_DIR),
            "expose_routing": True, "kv_capacity_tokens": 8800, "block_size": BLOCK,
            "metrics_port": None,  # the app alone (no serve()): /metrics on its one port
        })  # fmt: skip
        server = TestServer(build_app(s))
        await server.start_server()
        try:
            async with aiohttp.ClientSession() as session:
                yield {"url": str(server.make_url("")).rstrip("/"), "engine": engine.url,
                       "session": session}
        finally:
            await server.close()


async def ask(env: dict[str, Any], body: dict[str, Any],
              first_token: asyncio.Event | None = None) -> tuple[str, int, int]:
    """(the router's reason, the engine's cached tokens, its prompt tokens)."""
    async with env["session"].post(env["url"] + "/v1/chat/completions", json=body) as r:
        assert r.status == 200, await r.text()
        reason, usage = r.headers["x-route-reason"], None
        async for line in r.content:
            if not line.startswith(b"data: {"):
                continue
            event = json.loads(line[6:])
            if first_token is not None and any(
                    c.get("delta", {}).get("content") for c in event.get("choices", ())):
                first_token.set()
            usage = event.get("usage") or usage
    assert usage is not None
    return reason, usage["prompt_tokens_details"]["cached_tokens"], usage["prompt_tokens"]


async def corrections(env: dict[str, Any]) -> dict[str, float]:
    async with env["session"].get(env["url"] + "/metrics") as r:
        text = await r.text()
    return {line.split('"')[1]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line.startswith("prefix_router_index_corrections_total{")}


async def engine_ids(env: dict[str, Any], body: dict[str, Any]) -> list[int]:
    """The prompt's token ids as the engine computes them (docs/real-engine.md)."""
    s, url = env["session"], env["engine"]
    async with s.post(url + "/apply-template", json={"messages": body["messages"]}) as r:
        prompt = (await r.json())["prompt"]
    async with s.post(url + "/tokenize", json={"content": prompt, "add_special": True}) as r:
        return (await r.json())["tokens"]


def shared(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
                min(len(a), len(b)))


async def test_a_prompt_cached_part_way_into_a_block_is_no_correction(routed) -> None:
    env = routed
    # a system prompt whose share with the next prompt ends 9-15 tokens into a block: then
    # the nearest whole block is one past the blocks the two prompts share
    for pad in range(BLOCK):
        system = PA + " x" * pad
        first, second = chat(system, "Why?"), chat(system, "How so?")
        common = shared(await engine_ids(env, first), await engine_ids(env, second))
        if common % BLOCK > BLOCK // 2:
            break
    else:
        pytest.fail("no padding put the shared part 9-15 tokens into a block")
    assert (await ask(env, first))[0] == "miss"
    before = await corrections(env)
    reason, cached, _ = await ask(env, second)
    assert reason == "hit" and cached >= common - 1  # the engine held the whole shared part
    # it held common // BLOCK whole blocks, as the router predicted: nothing to correct
    after = await corrections(env)
    assert after.get("under", 0.0) == before.get("under", 0.0), (common, cached, after)


async def test_a_busy_slot_miss_does_not_make_the_router_forget_what_the_engine_holds(
        routed) -> None:
    env = routed
    assert (await ask(env, chat(PB, "first b question")))[0] == "miss"
    # A's first request decodes a long answer in one slot...
    started = asyncio.Event()
    long_a = asyncio.create_task(ask(env, chat(PA, "first a question", 800, ignore_eos=True),
                                     started))
    await started.wait()
    # ...so the second, which the router sends to A's owner, is computed in full in the other
    reason, cached, _ = await ask(env, chat(PA, "second a question"))
    assert reason == "hit" and cached < 64
    await long_a
    # B's prompt is still there (the other slot saved it to the host cache) and the router
    # should know it: what it learned was a busy slot, not an engine that forgets
    reason, cached, prompt = await ask(env, chat(PB, "second b question"))
    assert cached >= prompt - 64
    assert reason == "hit"
