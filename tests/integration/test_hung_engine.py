"""An engine that answers its health probes and hangs every request leaves the rotation:
request failures are not cancelled by probe successes, and a stream without its first token
within the budget counts as one."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from prefix_router.app import serve
from prefix_router.config import RouterSettings

MODEL = "test-model"


@pytest.fixture
async def hung() -> AsyncIterator[str]:
    """Healthy on /health, silent forever on every request (until the client goes)."""

    async def health(request: web.Request) -> web.Response:
        return web.json_response({})

    async def chat(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)  # the status line, then nothing: a hung prefill
        await asyncio.Event().wait()
        return resp

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_post("/v1/chat/completions", chat)
    server = TestServer(app)
    await server.start_server()
    yield str(server.make_url("")).rstrip("/")
    await server.close()


async def test_a_hung_engine_that_answers_its_probes_is_ejected(hung, fleet, start_sims) -> None:
    (good,) = await start_sims(fleet, 1)
    s = RouterSettings.model_validate({
        "discovery": {"backends": [hung, good]}, "models": [MODEL], "port": 0,
        "policy": "round-robin",
        "first_token_budget_s": 0.3, "upstream_timeout_s": 600, "expose_routing": True,
        "health": {"eject_after_failures": 2, "probe_interval_s": 0.1},
    })  # fmt: skip
    stop = asyncio.Event()
    bound: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(serve(s, stop, bound.set_result))
    url = f"http://127.0.0.1:{await asyncio.wait_for(bound, 30)}"
    body = {"model": MODEL, "stream": True, "max_tokens": 2,
            "messages": [{"role": "user", "content": "hello"}]}  # fmt: skip
    stuck: list[asyncio.Task[None]] = []
    try:
        async with aiohttp.ClientSession() as session:

            async def ask(i: int) -> str:
                b = {**body, "messages": [{"role": "user", "content": f"question {i} " * 30}]}
                async with session.post(url + "/v1/chat/completions", json=b) as r:
                    await r.read()
                    return r.headers.get("x-routed-to", "")

            # round robin: half of these wait on the hung engine, whose probes all succeed
            stuck += [asyncio.create_task(ask(i)) for i in range(4)]

            async def ready() -> dict:
                async with session.get(url + "/readyz") as r:
                    return await r.json()

            deadline = asyncio.get_running_loop().time() + 60
            while (await ready())["healthy_backends"] != 1:
                assert asyncio.get_running_loop().time() < deadline, "the hung engine stayed"
                await asyncio.sleep(0.05)
            assert [await ask(10 + i) for i in range(3)] == [good, good, good]
    finally:
        for t in stuck:
            t.cancel()
        stop.set()
        await task
