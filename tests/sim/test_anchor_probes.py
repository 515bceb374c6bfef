"""What the anchor routers probe on a worker, answered as bench/results/anchors/NOTES.md says.

sglang-router 0.3.2 at start-up: GET /health, then /server_info, /get_server_info, /model_info,
/get_model_info (a 404 on each keeps it from loading a tokenizer). vllm-router 0.1.17 with
cache_aware, per request and per worker: POST /v1/chat/completions/render (or
/v1/completions/render), then /tokenize if that is a 404.
"""

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


@pytest.mark.parametrize(
    "path", ["/server_info", "/get_server_info", "/model_info", "/get_model_info"]
)
async def test_sglang_metadata_probes_are_404(client, path):
    r = await client.get(path)
    assert r.status == 404
    assert (await r.json())["error"]["code"] == 404


async def test_health(client):
    assert (await client.get("/health")).status == 200


async def test_chat_render_gives_the_ids_tokenize_gives(client):
    msgs = [{"role": "system", "content": "S" * 100}, {"role": "user", "content": "hi"}]
    body = {"model": "m", "messages": msgs, "max_tokens": 7, "stream": True}
    r = await client.post("/v1/chat/completions/render", json=body)
    assert r.status == 200
    out = await r.json()
    tok = await (await client.post("/tokenize", json={"model": "m", "messages": msgs})).json()
    assert out["token_ids"] == tok["tokens"]
    assert out["sampling_params"]["max_tokens"] == 7
    assert out["model"] == "m"
    # the render did not run anything
    assert (await (await client.get("/stats")).json())["requests"] == 0


async def test_completion_render(client):
    r = await client.post("/v1/completions/render", json={"model": "m", "prompt": "abcdabcdab"})
    out = await r.json()
    tok = await (await client.post("/tokenize", json={"model": "m", "prompt": "abcdabcdab"})).json()
    assert out["token_ids"] == tok["tokens"]
    assert len(out["token_ids"]) == 3
    ids = await (
        await client.post("/v1/completions/render", json={"model": "m", "prompt": [5, 6, 7]})
    ).json()
    assert ids["token_ids"] == [5, 6, 7]
    # one prompt of ids given as a batch of one is those ids, not a text to tokenize again
    nested = await (
        await client.post("/v1/completions/render", json={"model": "m", "prompt": [[5, 6, 7]]})
    ).json()
    assert nested["token_ids"] == [5, 6, 7]


async def test_render_unknown_model_is_404(client):
    r = await client.post(
        "/v1/chat/completions/render",
        json={"model": "nope", "messages": [{"role": "user", "content": "x"}]},
    )
    assert r.status == 404
