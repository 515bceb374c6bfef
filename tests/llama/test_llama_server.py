"""What the router relies on in a real llama-server (docs/real-engine.md has the examples):
health, usage with cached prompt tokens, the chat template the router renders itself, SSE with
usage in the last chunk, metrics, a bounded prompt cache that evicts, continuous batching."""

from __future__ import annotations

import json
import math
import os
import random
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment
from llama_env import BUILD_TIMEOUT, TOKENIZER_DIR
from llama_fleet import LlamaFleet, LlamaServer, ServerConfig
from make_gguf import ModelShape
from tokenizers import Tokenizer

pytestmark = [pytest.mark.llama, pytest.mark.timeout(BUILD_TIMEOUT)]

TIMEOUT = aiohttp.ClientTimeout(total=120)


def words(seed: int, n: int) -> str:
    """Seeded pseudo-words: a long prompt whose tokens are the same every run."""
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    return " ".join(
        "".join(rng.choice(letters) for _ in range(rng.randint(2, 9))) for _ in range(n)
    )


def chat(system: str, user: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


async def post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    async with aiohttp.ClientSession(timeout=TIMEOUT) as http, http.post(url, json=body) as r:
        assert r.status == 200, await r.text()
        return await r.json()


async def complete(server: LlamaServer, messages: list[dict[str, str]], **extra: Any) -> dict:
    body = {"model": "tiny-llama", "messages": messages, "max_tokens": 4, **extra}
    return await post(server.url + "/v1/chat/completions", body)


def render_like_router(
    messages: list[dict[str, str]], add_generation_prompt: bool = True
) -> tuple[str, list[int]]:
    """The chat template from tokenizer_config.json rendered with jinja2 the way transformers
    does, then encoded without added special tokens (the template writes the BOS itself)."""
    conf = json.loads((TOKENIZER_DIR / "tokenizer_config.json").read_text())
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda x, indent=None: json.dumps(x, indent=indent)
    text = env.from_string(conf["chat_template"]).render(
        messages=messages, bos_token=conf["bos_token"], add_generation_prompt=add_generation_prompt
    )
    tok = Tokenizer.from_file(str(TOKENIZER_DIR / "tokenizer.json"))
    return text, tok.encode(text, add_special_tokens=False).ids


async def test_health_and_models(llama_server: LlamaServer) -> None:
    async with aiohttp.ClientSession(timeout=TIMEOUT) as http:
        async with http.get(llama_server.url + "/health") as r:
            assert r.status == 200
            assert await r.json() == {"status": "ok"}
        async with http.get(llama_server.url + "/v1/models") as r:
            assert r.status == 200
            assert [m["id"] for m in (await r.json())["data"]] == ["tiny-llama"]


async def test_engine_tokens_are_the_routers(llama_server: LlamaServer) -> None:
    """The engine's prompt tokens for a chat are exactly what the router computes in process
    from the same tokenizer files, so token blocks can be aligned with the engine's.

    /apply-template leaves the BOS out of its text (the template writes it, and the engine adds
    it when it tokenizes), so the engine's ids are /tokenize of that text with add_special."""
    messages = chat("You are terse. " + words(1, 50), "Ünïcode and numbers 12345 too?")
    text, ids = render_like_router(messages)
    bos = json.loads((TOKENIZER_DIR / "tokenizer_config.json").read_text())["bos_token"]
    templated = await post(llama_server.url + "/apply-template", {"messages": messages})
    assert bos + templated["prompt"] == text
    tokenized = await post(
        llama_server.url + "/tokenize", {"content": templated["prompt"], "add_special": True}
    )
    assert tokenized["tokens"] == ids
    counted = await post(
        llama_server.url + "/v1/chat/completions/input_tokens", {"messages": messages}
    )
    assert counted["input_tokens"] == len(ids)
    answer = await complete(llama_server, messages)
    assert answer["usage"]["prompt_tokens"] == len(ids)


async def test_shared_prefix_reports_cached_tokens(llama_server: LlamaServer) -> None:
    system = words(2, 600)
    first = await complete(llama_server, chat(system, "first question"))
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert first["timings"]["cache_n"] == 0

    # The system turn ends in <|eot_id|>, a special token that no BPE merge crosses: the whole
    # turn is a common prefix of both prompts, whatever the user says next.
    _, system_turn = render_like_router(chat(system, "")[:1], add_generation_prompt=False)
    second = await complete(llama_server, chat(system, "another question"))
    usage = second["usage"]
    cached = usage["prompt_tokens_details"]["cached_tokens"]
    assert len(system_turn) <= cached < usage["prompt_tokens"]
    assert second["timings"]["cache_n"] == cached
    assert second["timings"]["prompt_n"] == usage["prompt_tokens"] - cached

    # The same prompt again: everything but the last token, which is always evaluated anew.
    third = await complete(llama_server, chat(system, "another question"))
    assert third["usage"]["prompt_tokens_details"]["cached_tokens"] == usage["prompt_tokens"] - 1


async def test_stream_sends_usage_in_last_chunk(llama_server: LlamaServer) -> None:
    body = {
        "model": "tiny-llama",
        "messages": chat(words(3, 200), "stream it"),
        "max_tokens": 6,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    events: list[str] = []
    async with (
        aiohttp.ClientSession(timeout=TIMEOUT) as http,
        http.post(llama_server.url + "/v1/chat/completions", json=body) as r,
    ):
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/event-stream")
        async for line in r.content:
            if line.strip():
                assert line.startswith(b"data: "), line
                events.append(line[len(b"data: ") :].decode().strip())
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    last = chunks[-1]
    assert last["choices"] == []
    assert last["usage"]["prompt_tokens"] > 0
    assert "cached_tokens" in last["usage"]["prompt_tokens_details"]
    assert all("usage" not in c for c in chunks[:-1])
    assert any(c["choices"] and c["choices"][0]["finish_reason"] for c in chunks)


async def test_metrics_exports_token_counters(llama_server: LlamaServer) -> None:
    system = words(4, 300)
    await complete(llama_server, chat(system, "one"))
    await complete(llama_server, chat(system, "two"))
    async with (
        aiohttp.ClientSession(timeout=TIMEOUT) as http,
        http.get(llama_server.url + "/metrics") as r,
    ):
        assert r.status == 200
        text = await r.text()
    values = {
        line.split()[0]: float(line.split()[1])
        for line in text.splitlines()
        if line.startswith("llamacpp:")
    }
    for name in ("requests_processing", "requests_deferred", "n_busy_slots_per_decode"):
        assert f"llamacpp:{name}" in values
    assert values["llamacpp:prompt_tokens_cached_total"] > 0
    assert values["llamacpp:prompt_tokens_total"] > 0


async def test_bounded_prompt_cache_evicts_oldest(
    llama_fleet: LlamaFleet, llama_binary: Path, llama_model: Path
) -> None:
    """One slot and a host cache sized for two of these prompts. The slot's prompt is saved to
    the host cache before the next prompt is looked up there, so the server behaves as an LRU
    of two prompts: A B A hits, A B C A misses (saving C pushed A, the oldest, out)."""
    prompts = [chat(words(10 + i, 600), "q") for i in range(3)]
    tokens = max(len(render_like_router(p)[1]) for p in prompts)
    state_bytes = (tokens + 1) * ModelShape().kv_bytes_per_token  # the prompt and 1 answer token
    config = ServerConfig(slots=1, cache_ram_mib=math.ceil(2.5 * state_bytes / 2**20))
    (server,) = await llama_fleet.start(1, llama_binary, llama_model, config)

    async def cached(i: int) -> int:
        answer = await complete(server, prompts[i], max_tokens=1)
        return answer["usage"]["prompt_tokens_details"]["cached_tokens"]

    hit = tokens // 2  # a miss still shares the template's first few tokens with the slot
    assert await cached(0) < hit
    assert await cached(1) < hit
    assert await cached(0) >= hit  # back from the host cache
    assert await cached(1) >= hit
    assert await cached(2) < hit
    assert await cached(0) < hit  # evicted


async def test_two_slots_decode_in_one_batch(
    llama_fleet: LlamaFleet, llama_binary: Path, llama_model: Path
) -> None:
    """Continuous batching: a short request that arrives while a long one is decoding is decoded
    in the same llama_decode() calls, step for step, and finishes first."""
    (server,) = await llama_fleet.start(1, llama_binary, llama_model, ServerConfig(slots=2))
    long = {
        "model": "tiny-llama",
        "messages": chat(words(20, 100), "a"),
        "max_tokens": 1500,
        "ignore_eos": True,
        "stream": True,
    }
    async with aiohttp.ClientSession(timeout=TIMEOUT) as http:
        async with http.post(server.url + "/v1/chat/completions", json=long) as stream:
            assert stream.status == 200
            async for line in stream.content:
                if b'"content":"' in line:  # the first decoded token: it is decoding now
                    break
            short = await complete(
                server, chat(words(21, 100), "b"), max_tokens=50, ignore_eos=True
            )
            assert short["usage"]["completion_tokens"] == 50
            rest = await stream.read()
            assert b'"finish_reason":"length"' in rest  # the long one was still decoding
        async with http.get(server.url + "/metrics") as r:
            text = await r.text()
    values = {
        line.split()[0]: float(line.split()[1])
        for line in text.splitlines()
        if line.startswith("llamacpp:")
    }
    # Both gauges count since the server started: busy slots summed over decode calls, less one
    # per call, is the number of calls that decoded both requests at once.
    calls = values["llamacpp:n_decode_total"]
    shared_calls = round(values["llamacpp:n_busy_slots_per_decode"] * calls - calls)
    assert shared_calls >= 45  # the short one's 50 tokens: its prefill call and 49 decode calls


async def test_fleet_stops_its_servers(
    llama_fleet: LlamaFleet, llama_binary: Path, llama_model: Path
) -> None:
    servers = await llama_fleet.start(2, llama_binary, llama_model)
    assert len({s.port for s in servers}) == 2
    await llama_fleet.close()
    for s in servers:
        assert s.process.returncode is not None
        with pytest.raises(ProcessLookupError):
            os.kill(s.pid, 0)

