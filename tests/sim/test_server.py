import gzip
import json

import pytest
from aiohttp.test_utils import TestClient, TestServer

from engine_sim.engine import Engine
from engine_sim.profiles import PROFILES
from engine_sim.server import build_app


@pytest.fixture
async def client():
    engine = Engine(PROFILES["fast"], 50_000)
    app = build_app(model="m", served=["m"], engine=engine, max_model_len=4096, replica_id="r0")
    async with TestClient(TestServer(app)) as c:
        yield c


async def test_chat_usage_reports_cached_tokens(client):
    body = {
        "model": "m",
        "messages": [{"role": "system", "content": "S" * 2000}, {"role": "user", "content": "hi"}],
        "max_tokens": 5,
    }
    r1 = await (await client.post("/v1/chat/completions", json=body)).json()
    r2 = await (await client.post("/v1/chat/completions", json=body)).json()
    assert r1["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert r2["usage"]["prompt_tokens_details"]["cached_tokens"] >= 480
    assert r2["usage"]["completion_tokens"] == 5
    assert r2["choices"][0]["message"]["role"] == "assistant"


async def test_streaming_completion_ends_with_done_and_usage(client):
    body = {
        "model": "m",
        "prompt": "hello " * 10,
        "max_tokens": 4,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    resp = await client.post("/v1/completions", json=body)
    assert resp.status == 200
    events = [
        line[5:].strip() for line in (await resp.read()).split(b"\n") if line.startswith(b"data:")
    ]
    assert events[-1] == b"[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert sum(1 for c in chunks if c["choices"]) == 4
    assert chunks[-1]["usage"]["completion_tokens"] == 4


async def test_streamed_chat_events_are_whole_openai_chunks(client):
    # Events are assembled from bytes made once per stream: each must still be one JSON
    # chunk with the fields and values an OpenAI client reads.
    body = {"model": "m", "messages": [{"role": "user", "content": 'say "hi"'}]}
    resp = await client.post("/v1/chat/completions", json={**body, "max_tokens": 3, "stream": True})
    events = [
        line[5:].strip() for line in (await resp.read()).split(b"\n") if line.startswith(b"data:")
    ]
    assert events[-1] == b"[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert len(chunks) == 3
    assert len({c["id"] for c in chunks}) == 1 and chunks[0]["id"].startswith("chatcmpl-")
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert {c["model"] for c in chunks} == {"m"}
    assert all(isinstance(c["created"], int) for c in chunks)
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert deltas[0]["role"] == "assistant" and all("role" not in d for d in deltas[1:])
    reasons = [c["choices"][0]["finish_reason"] for c in chunks]
    assert reasons == [None, None, "length"]
    whole = await (await client.post("/v1/chat/completions", json={**body, "max_tokens": 3})).json()
    assert "".join(d["content"] for d in deltas) == whole["choices"][0]["message"]["content"]


async def test_metrics_tokenize_models_health(client):
    await client.post("/v1/completions", json={"model": "m", "prompt": "abcd" * 50})
    text = await (await client.get("/metrics")).text()
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
    ):
        assert name in text, name
    tok = await (await client.post("/tokenize", json={"model": "m", "prompt": "abcdabcd"})).json()
    assert tok["count"] == 2 and len(tok["tokens"]) == 2
    models = await (await client.get("/v1/models")).json()
    assert models["data"][0]["id"] == "m"
    assert (await client.get("/health")).status == 200
    assert (await client.get("/get_model_info")).status == 404


@pytest.mark.parametrize(
    "path,body,status",
    [
        ("/v1/completions", b"{oops", 400),
        ("/v1/completions", {"model": "m"}, 400),
        ("/v1/completions", {"model": "m", "prompt": "x", "max_tokens": 0}, 400),
        ("/v1/completions", {"model": "m", "prompt": "x", "max_tokens": "5"}, 400),
        ("/v1/completions", {"model": "m", "prompt": "x", "max_tokens": 5000}, 400),
        ("/v1/completions", {"model": "nope", "prompt": "x"}, 404),
        ("/v1/chat/completions", {"model": "m", "messages": []}, 400),
        ("/v1/chat/completions", {"model": "m", "messages": [{"content": "x"}]}, 400),
        ("/v1/chat/completions", {"model": "m", "messages": [{"role": "u", "content": 3}]}, 400),
        ("/v1/completions", {"model": "m", "prompt": "x", "stream": 1}, 400),
        ("/v1/completions", b"[" * 100_000 + b"]" * 100_000, 400),
        ("/v1/completions", b'{"model": "m", "prompt": "ab\\ud800cd"}', 400),
        ("/tokenize", b'{"model": "m", "prompt": "ab\\ud800cd"}', 400),
        ("/v1/completions/render", b'{"model": "m", "prompt": "\\udc00"}', 400),
        (
            "/v1/chat/completions",
            b'{"model": "m", "messages": [{"role": "u", "content": "\\ud800"}]}',
            400,
        ),
        ("/v1/completions", {"model": "m", "prompt": [1, 2, 128_256]}, 400),
        ("/v1/chat/completions", {"model": "m", "messages": [{"role": "u", "content": [5]}]}, 400),
        (
            "/v1/chat/completions",
            {"model": "m", "messages": [{"role": "u", "content": [None]}]},
            400,
        ),
        (
            "/v1/completions",
            {"model": "m", "prompt": "x", "stream_options": {"include_usage": True}},
            400,
        ),
        (
            "/v1/completions",
            {"model": "m", "prompt": "x", "stream": True, "stream_options": "x"},
            400,
        ),
    ],
)
async def test_bad_input_is_an_openai_error(client, path, body, status):
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    resp = await client.post(path, data=data, headers={"Content-Type": "application/json"})
    assert resp.status == status
    err = (await resp.json())["error"]
    assert err["message"] and err["type"] and err["code"] == status


async def test_a_gzip_body_is_read_and_a_broken_one_is_400(client):
    body = json.dumps({"model": "m", "prompt": "abcd", "max_tokens": 2}).encode()
    gz = {"Content-Type": "application/json", "Content-Encoding": "gzip"}
    assert (
        await client.post("/v1/completions", data=gzip.compress(body), headers=gz)
    ).status == 200
    resp = await client.post("/v1/completions", data=body, headers=gz)
    assert resp.status == 400
    assert (await resp.json())["error"]["code"] == 400


async def test_a_wrong_method_is_405_with_allow(client):
    resp = await client.get("/v1/completions")
    assert resp.status == 405
    assert "POST" in resp.headers["Allow"]
    assert (await resp.json())["error"]["code"] == 405


async def test_a_cache_salt_keys_the_byte_cache(client):
    # Byte mode (no tokenizer, what every bench runs) seeds the block hashes with the salt;
    # a salted request once crashed the simulator with a 500 (a str given to xxhash).
    base = {"model": "m", "prompt": "select rows from the table " * 40, "max_tokens": 2}

    async def cached(**kw):
        r = await client.post("/v1/completions", json={**base, **kw})
        assert r.status == 200, await r.text()
        return (await r.json())["usage"]["prompt_tokens_details"]["cached_tokens"]

    assert await cached(cache_salt="tenant-a") == 0
    assert await cached(cache_salt="tenant-a") > 0
    assert await cached(cache_salt="tenant-b") == 0
    assert await cached() == 0
