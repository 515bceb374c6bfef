"""The router app in-process (a real simulator process behind it): socket options, garbage."""

from __future__ import annotations

import asyncio
import json
import random
import socket

import pytest
from aiohttp.test_utils import TestClient, TestServer

from bench.harness.fleet import Fleet
from prefix_router.app import CORE, UPSTREAM, build_app
from prefix_router.config import RouterSettings

MODEL = "test-model"


@pytest.fixture
async def routed(fleet: Fleet, start_sims):
    sims = await start_sims(fleet, 2)
    settings = RouterSettings.model_validate(
        {"discovery": {"backends": sims}, "kv_capacity_tokens": 100_000}
    )
    app = build_app(settings)
    async with TestClient(TestServer(app)) as client:
        yield client, app, sims


async def test_the_sockets_that_forward_have_tcp_nodelay(routed):
    client, app, _sims = routed
    r = await client.post(
        "/v1/completions", json={"model": MODEL, "prompt": "hi " * 50, "max_tokens": 2}
    )
    assert r.status == 200
    socks = app[UPSTREAM].sockets()  # type: ignore[attr-defined]
    assert socks, "the forwarding client's keep-alive pool should hold a connection"
    for s in socks:
        assert s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1


async def test_garbage_never_crashes_the_router(routed):
    client, app, _sims = routed
    rng = random.Random(0)
    values = [None, 0, -1, 1.5, "", "x", [], {}, [1, "a"], {"a": {}}, True, "\u0000", 2**70]
    for i in range(150):
        body = {
            k: rng.choice(values)
            for k in rng.sample(
                [
                    "model",
                    "prompt",
                    "messages",
                    "stream",
                    "max_tokens",
                    "tools",
                    "cache_salt",
                    "stream_options",
                ],
                rng.randint(0, 6),
            )
        }
        if rng.random() < 0.5:
            body["model"] = MODEL
        path = rng.choice(["/v1/completions", "/v1/chat/completions"])
        raw = json.dumps(body).encode() if i % 10 else bytes(rng.randrange(256) for _ in range(40))
        r = await client.post(path, data=raw, headers={"Content-Type": "application/json"})
        assert r.status < 500, (path, raw, await r.text())
        if r.status >= 400:
            err = (await r.json())["error"]
            assert isinstance(err["message"], str)
    # and it still routes afterwards
    r = await client.post("/v1/completions", json={"model": MODEL, "prompt": "ok", "max_tokens": 1})
    assert r.status == 200
    assert app[CORE].backends.healthy()


async def test_a_stream_releases_only_its_own_pending_prefill(fleet: Fleet, start_sims):
    # A long non-streamed request holds its prefill as pending load until its answer; a short
    # stream that starts and ends meanwhile must take off its own prefill, once.
    sims = await start_sims(fleet, 1, profile="llama-3.1-70b-h100", time_scale=5.0)
    settings = RouterSettings.model_validate(
        {"discovery": {"backends": sims}, "kv_capacity_tokens": 100_000}
    )
    app = build_app(settings)
    load = app[CORE].load
    async with TestClient(TestServer(app)) as client:
        long = asyncio.create_task(
            client.post(
                "/v1/completions",
                json={"model": MODEL, "prompt": "long " * 3000, "max_tokens": 40},
            )
        )
        for _ in range(100):
            if load.pending_prefill(sims[0]) > 0:
                break
            await asyncio.sleep(0.01)
        held = load.pending_prefill(sims[0])
        assert held > 3000
        r = await client.post(
            "/v1/completions",
            json={"model": MODEL, "prompt": "short " * 100, "max_tokens": 2, "stream": True},
        )
        assert r.status == 200
        await r.read()
        assert not long.done(), "the long request should still be running"
        assert load.pending_prefill(sims[0]) == pytest.approx(held)
        r = await long
        assert r.status == 200
        await r.read()
    assert load.pending_prefill(sims[0]) == 0
