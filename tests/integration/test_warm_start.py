"""A router replica that starts with `index: events` reports ready once it has read every
engine's replay, so it serves its first request on the fleet's caches (app.py /readyz,
events/subscriber.py), and not later than `events.ready_wait_s` whatever the replays do.

The replay socket is the test's own where it must hold its answer (a real ZMQ ROUTER socket:
the simulator's replays at once, and the router's wait could not be seen)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import waiting
import zmq
import zmq.asyncio
from aiohttp.test_utils import TestClient, TestServer

from bench.harness.fleet import Fleet, Proc, free_port
from engine_sim.hf_tokenizer import TINY_TOKENIZER
from prefix_router.app import build_app
from prefix_router.config import RouterSettings

MODEL = "test-model"
SYSTEM = "You answer questions about the billing of claims, briefly and politely. " * 12


def chat(user: str) -> dict[str, Any]:
    return {"model": MODEL, "max_tokens": 2,
            "messages": [{"role": "system", "content": SYSTEM},
                         {"role": "user", "content": user}]}  # fmt: skip


async def sim(fleet: Fleet, name: str) -> Proc:
    return await fleet.start_sim(name, model=MODEL, kv_capacity=100_000, profile="fast",
                                 time_scale=1.0, kv_events=True,
                                 extra=["--tokenizer", "tiny", "--enable-prompt-tokens-details"])


def router(sims: list[Proc], endpoints: dict[str, str], **events: Any) -> TestClient:
    s = RouterSettings.model_validate({
        "discovery": {"backends": [p.url for p in sims]}, "models": [MODEL],
        "index": "events", "tokenizer": str(TINY_TOKENIZER), "expose_routing": True,
        "events": {"endpoints": endpoints, **events},
    })  # fmt: skip
    return TestClient(TestServer(build_app(s)))


async def ready(client: TestClient) -> tuple[int, dict[str, Any]]:
    r = await client.get("/readyz")
    return r.status, await r.json(content_type=None)


async def is_ready(client: TestClient) -> bool:
    return (await ready(client))[0] == 200


@pytest.fixture
async def held_replay() -> AsyncIterator[tuple[str, zmq.asyncio.Socket]]:
    ctx = zmq.asyncio.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    port = free_port()
    sock.bind(f"tcp://127.0.0.1:{port}")
    try:
        yield f"tcp://127.0.0.1:{port}", sock
    finally:
        sock.close(linger=0)
        ctx.destroy(linger=0)


async def test_not_ready_until_every_engines_replay_is_read(fleet: Fleet, held_replay) -> None:
    replay, sock = held_replay
    engine = await sim(fleet, "sim0")
    pub = engine.events.split(",")[0]
    async with router([engine], {engine.url: f"{pub},{replay}"}, replay_timeout_s=600,
                      ready_wait_s=600) as client:  # fmt: skip
        ident, *_request = await waiting.until(lambda: sock.recv_multipart(zmq.NOBLOCK), 30,
                                               "the replay asked for", interval=0.05)
        status, body = await ready(client)
        assert (status, body["index"]) == (503, "warming")
        await sock.send_multipart([ident, b"", b"\xff" * 8, b""])  # the replay's end
        await waiting.until(lambda: is_ready(client), 30, "ready once the replay is read",
                            interval=0.05)


async def test_ready_after_the_wait_whatever_the_replays_do(fleet: Fleet, held_replay) -> None:
    replay, _sock = held_replay  # asked, never answered
    engine = await sim(fleet, "sim0")
    pub = engine.events.split(",")[0]
    async with router([engine], {engine.url: f"{pub},{replay}"}, replay_timeout_s=600,
                      ready_wait_s=0.5) as client:  # fmt: skip
        await waiting.until(lambda: is_ready(client), 30, "ready after ready_wait_s",
                            interval=0.05)
        assert await is_ready(client)  # the replay never answered

async def test_a_new_router_hits_what_the_engines_already_hold(fleet: Fleet) -> None:
    """Another router (here: a client straight to the engine) filled one engine's cache; a
    router that starts routes its first request of that prefix there, as a hit."""
    sims = [await sim(fleet, f"sim{i}") for i in range(2)]
    warm = sims[1]
    async with aiohttp.ClientSession() as s:
        async with s.post(warm.url + "/v1/chat/completions", json=chat("earlier")) as r:
            assert r.status == 200, await r.text()
    async with router(sims, {p.url: p.events for p in sims}) as client:
        await waiting.until(lambda: is_ready(client), 30, "ready", interval=0.05)
        r = await client.post("/v1/chat/completions", json=chat("now"))
        assert r.status == 200, await r.text()
        assert (r.headers["x-routed-to"], r.headers["x-route-reason"]) == (warm.url, "hit")
        json.loads(await r.text())
