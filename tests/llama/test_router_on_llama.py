"""The router in front of real llama-server processes (llama.cpp, a tiny random-weight model
with the repo's tokenizer): their health, the usage they report, streaming through the
router, the chat template the router renders (its token count is the engine's), and the
index's correction when an engine holds less than predicted."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer
from llama_env import BUILD_TIMEOUT, TOKENIZER_DIR
from llama_fleet import LlamaFleet, ServerConfig

from prefix_router.app import CORE, build_app
from prefix_router.config import RouterSettings

pytestmark = [pytest.mark.llama, pytest.mark.timeout(BUILD_TIMEOUT)]

SYSTEM = " ".join(f"rule{i} applies to every claim" for i in range(120))


def chat(user: str, stream: bool = False) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "tiny-llama", "max_tokens": 4, "stream": stream,
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}],
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


def counter(text: str, name: str, labels: str = "") -> float:
    m = re.search(rf"^{re.escape(name)}{re.escape(labels)} (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


@pytest.fixture
async def routed(
    tmp_path: Path, llama_binary: Path, llama_model: Path
) -> AsyncIterator[dict[str, Any]]:
    async with LlamaFleet(tmp_path / "logs") as fleet:
        servers = await fleet.start(2, llama_binary, llama_model, ServerConfig(slots=2))
        urls = [s.url for s in servers]
        s = RouterSettings.model_validate({
            "discovery": {"backends": urls}, "port": 0, "tokenizer": str(TOKENIZER_DIR),
            "expose_routing": True, "kv_capacity_tokens": 16_000,
            "metrics_port": None,  # the app alone (no serve()): /metrics on its one port
        })  # fmt: skip
        app = build_app(s)
        server = TestServer(app)
        await server.start_server()
        try:
            async with aiohttp.ClientSession() as session:
                yield {"url": str(server.make_url("")).rstrip("/"), "session": session,
                       "engines": urls, "app": app}  # fmt: skip
        finally:
            await server.close()


async def ask(env: dict[str, Any], body: dict[str, Any]) -> tuple[str, str, dict[str, Any]]:
    async with env["session"].post(env["url"] + "/v1/chat/completions", json=body) as r:
        assert r.status == 200, await r.text()
        if not body["stream"]:
            return r.headers["x-routed-to"], r.headers["x-route-reason"], (await r.json())["usage"]
        usage: dict[str, Any] = {}
        async for line in r.content:
            if line.startswith(b"data: {"):
                usage = json.loads(line[6:]).get("usage") or usage
        return r.headers["x-routed-to"], r.headers["x-route-reason"], usage


async def test_a_shared_prefix_lands_on_its_owner_and_the_counts_agree(routed) -> None:
    env = routed
    owner, reason, first = await ask(env, chat("first question"))
    assert reason == "miss" and first["prompt_tokens"] > 1000
    to, reason, usage = await ask(env, chat("second question", stream=True))  # streamed
    assert (to, reason) == (owner, "hit")
    cached = usage["prompt_tokens_details"]["cached_tokens"]
    assert cached > 1000  # the engine's own count: it held the system prompt
    async with env["session"].get(env["url"] + "/metrics") as r:
        text = await r.text()
    # the router's token count of each prompt is the engine's (the same template, tokenizer)
    assert counter(text, "prefix_router_prompt_tokens_total") == \
        counter(text, "prefix_router_reported_prompt_tokens_total")
    # what it predicted cached is what the engine reported, to a block (llama.cpp matches
    # to the token, the router to the block)
    errors = counter(text, "prefix_router_cache_prediction_error_tokens_sum")
    assert errors <= 16 * 2, text
    # the engines' own health and load signals were read
    assert counter(text, "prefix_router_backend_healthy", f'{{backend="{owner}"}}') == 1.0


async def test_an_engine_that_held_less_than_predicted_is_counted(routed) -> None:
    env = routed
    core = env["app"][CORE]
    owner, _, _ = await ask(env, chat("first question"))
    other = next(u for u in env["engines"] if u != owner)
    # the index is told, wrongly, that the other engine holds a long prefix it never saw
    body = chat("a question for the other engine " * 20)
    from prefix_router.parsing import parse_request

    parsed = parse_request(json.dumps(body).encode(), "chat")
    route = await core.route(parsed)
    core.index.table.record(parsed.model, route.hashes, other)
    to, reason, usage = await ask(env, body)
    assert (to, reason) == (other, "hit")  # the longest match, as far as the index knew
    async with env["session"].get(env["url"] + "/metrics") as r:
        text = await r.text()
    # it held nothing of it (a few template tokens at most): a correction, from its own count
    assert usage["prompt_tokens_details"]["cached_tokens"] < 64
    assert counter(text, "prefix_router_index_corrections_total", '{direction="over"}') == 1
