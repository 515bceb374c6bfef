"""The endpoints passed through by model: embeddings and the other JSON ones, multipart audio
streamed, GET /version. Two engines, each serving its own model, are real HTTP servers in
this process that answer as vLLM's paths do and say what reached them."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from prefix_router.app import build_app
from prefix_router.config import RouterSettings


def engine(model: str, seen: list[dict]) -> web.Application:
    async def health(request: web.Request) -> web.Response:
        return web.Response(text="")

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": model, "object": "model"}]})

    async def embeddings(request: web.Request) -> web.Response:
        body = await request.json()
        seen.append({"path": request.path, "model": body.get("model"),
                     "headers": dict(request.headers)})  # fmt: skip
        return web.json_response({"object": "list", "model": model,
                                  "data": [{"object": "embedding", "index": 0,
                                            "embedding": [0.5, 0.25]}]})  # fmt: skip

    async def transcriptions(request: web.Request) -> web.Response:
        reader = await request.multipart()
        fields: dict[str, str] = {}
        size = 0
        async for part in reader:
            if part.filename:
                while chunk := await part.read_chunk(1 << 16):
                    size += len(chunk)
            else:
                fields[part.name or ""] = await part.text()
        seen.append({"path": request.path, "model": fields.get("model"), "size": size,
                     "chunked": request.headers.get("Transfer-Encoding") == "chunked"})  # fmt: skip
        return web.json_response({"text": f"{size} bytes heard by {model}"})

    async def version(request: web.Request) -> web.Response:
        seen.append({"path": request.path})
        return web.json_response({"version": "0.0-test"})

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    for path in ("/v1/embeddings", "/v2/rerank", "/tokenize"):
        app.router.add_post(path, embeddings)
    app.router.add_post("/v1/audio/transcriptions", transcriptions)
    app.router.add_get("/version", version)
    return app


@pytest.fixture
async def routed() -> AsyncIterator[tuple[TestClient, dict[str, list[dict]]]]:
    seen: dict[str, list[dict]] = {"m1": [], "m2": []}
    servers = [TestServer(engine(m, seen[m])) for m in seen]
    for s in servers:
        await s.start_server()
    urls = [str(s.make_url("")).rstrip("/") for s in servers]
    settings = RouterSettings.model_validate(
        {"discovery": {"backends": urls}, "max_body_bytes": 1 << 20}
    )
    async with TestClient(TestServer(build_app(settings))) as client:
        yield client, seen
    for s in servers:
        await s.close()


async def test_each_json_endpoint_goes_to_an_engine_serving_its_model(routed) -> None:
    client, seen = routed
    for path in ("/v1/embeddings", "/v2/rerank", "/tokenize"):
        for model in ("m1", "m2", "m2"):
            r = await client.post(path, json={"model": model, "input": "hello"},
                                  headers={"X-Forwarded-For": "198.18.0.9"})  # fmt: skip
            assert r.status == 200, await r.text()
            assert (await r.json())["model"] == model
    assert [x["model"] for x in seen["m1"]] == ["m1"] * 3
    assert [x["model"] for x in seen["m2"]] == ["m2"] * 6
    assert seen["m1"][0]["headers"]["X-Forwarded-For"].startswith("198.18.0.9, ")


async def test_an_unknown_model_is_a_404_in_openai_shape(routed) -> None:
    client, seen = routed
    r = await client.post("/v1/embeddings", json={"model": "nope", "input": "x"})
    assert r.status == 404
    assert (await r.json())["error"]["code"] == "model_not_found"
    r = await client.post("/v1/embeddings", data=b"{not json")
    assert r.status == 400 and "error" in await r.json()
    assert seen == {"m1": [], "m2": []}


async def test_an_upload_is_streamed_to_the_engine_serving_its_model(routed) -> None:
    client, seen = routed
    audio = bytes(range(256)) * 3000  # 768,000 bytes, under the 1 MiB limit
    form = aiohttp.FormData()
    form.add_field("model", "m2")
    form.add_field("file", audio, filename="a.wav", content_type="audio/wav")
    r = await client.post("/v1/audio/transcriptions", data=form)
    assert r.status == 200, await r.text()
    assert (await r.json())["text"] == f"{len(audio)} bytes heard by m2"
    assert seen["m2"][-1]["size"] == len(audio) and seen["m2"][-1]["chunked"]
    assert seen["m1"] == []


async def test_a_model_named_after_the_file_is_refused_with_several_models(routed) -> None:
    client, seen = routed
    form = aiohttp.FormData()
    form.add_field("file", b"\0" * 1000, filename="a.wav", content_type="audio/wav")
    form.add_field("model", "m1")
    r = await client.post("/v1/audio/transcriptions", data=form)
    assert r.status == 400 and (await r.json())["error"]["param"] == "model"
    assert seen == {"m1": [], "m2": []}


async def test_an_upload_over_the_limit_is_a_413(routed) -> None:
    client, _seen = routed
    form = aiohttp.FormData()
    form.add_field("model", "m1")
    form.add_field("file", b"\0" * (2 << 20), filename="a.wav", content_type="audio/wav")
    r = await client.post("/v1/audio/transcriptions", data=form)
    assert r.status == 413
    assert (await r.json())["error"]["message"].startswith("the request body")


async def test_version_is_answered_by_an_engine(routed) -> None:
    client, seen = routed
    r = await client.get("/version")
    assert r.status == 200 and (await r.json())["version"] == "0.0-test"
    assert len(seen["m1"]) + len(seen["m2"]) == 1
