"""An engine that answers its health probes and hangs every request leaves the rotation:
request failures are not cancelled by probe successes, a stream without its first token
within the budget counts as one, and an engine whose progress counters stand still while
requests wait on it is hung whatever its requests are (simulators hung by their /fault)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from inprocess import serve_router

from bench.harness.promtext import sample_sum
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


async def _hang(session: aiohttp.ClientSession, sim: str, hang: bool) -> None:
    async with session.post(sim + "/fault", json={"hang": hang}) as r:
        assert (await r.json())["hang"] is hang


async def _cut_there(session: aiohttp.ClientSession, metrics: str, backend: str) -> float:
    """Requests the router cut on `backend` because it hung."""
    async with session.get(metrics) as r:
        text = await r.text()
    return sample_sum(text, "prefix_router_requests_total", backend=backend, outcome="hung")


def _settings(backends: list[str], **health: float) -> RouterSettings:
    return RouterSettings.model_validate({
        "discovery": {"backends": backends}, "models": [MODEL], "port": 0,
        "policy": "round-robin", "upstream_timeout_s": 600, "expose_routing": True,
        "health": {"probe_interval_s": 0.1, "metrics_poll_interval_s": 0.1,
                   "stall_after_s": 1.0, **health},
    })  # fmt: skip


async def _ask(session: aiohttp.ClientSession, url: str, i: int) -> tuple[int, str]:
    """A non-streamed request: its first byte is its last, so only the engine's reported
    progress can tell a hung engine from a busy one."""
    body = {"model": MODEL, "max_tokens": 4,
            "messages": [{"role": "user", "content": f"question {i} " * 30}]}  # fmt: skip
    async with session.post(url + "/v1/chat/completions", json=body) as r:
        await r.read()
        return r.status, r.headers.get("x-routed-to", "")


async def test_non_streamed_requests_leave_a_hung_engine_in_seconds(fleet, start_sims) -> None:
    # Probes pass, the engine takes requests and makes no progress: before, only
    # upstream_timeout_s (here 600 s) ended a non-streamed request there, and it took three
    # such timeouts to eject the engine.
    hung, good = await start_sims(fleet, 2)
    url, _metrics, stop, task = await serve_router(_settings([hung, good], readmit_after_s=600))
    try:
        async with aiohttp.ClientSession() as session:
            await _hang(session, hung, True)
            # round robin: half of them reach the hung engine; all are answered by the other
            answers = await asyncio.wait_for(
                asyncio.gather(*(_ask(session, url, i) for i in range(4))), 120)
            assert answers == [(200, good)] * 4
            async with session.get(url + "/readyz") as r:
                assert (await r.json())["healthy_backends"] == 1
    finally:
        stop.set()
        await task


async def test_a_readmitted_engine_takes_one_request_until_it_answers(
    fleet, start_sims
) -> None:
    # A hung engine passes its probes, so it is re-admitted `readmit_after_s` later: before,
    # with its full share of traffic again, every request it took waited to be cut.
    hung, good = await start_sims(fleet, 2)
    url, metrics, stop, task = await serve_router(_settings([hung, good], readmit_after_s=0.5))
    try:
        async with aiohttp.ClientSession() as session:

            async def healthy(n: int) -> None:
                deadline = asyncio.get_running_loop().time() + 60
                while True:
                    async with session.get(url + "/readyz") as r:
                        if (await r.json())["healthy_backends"] == n:
                            return
                    assert asyncio.get_running_loop().time() < deadline, f"never {n} healthy"
                    await asyncio.sleep(0.02)

            await _hang(session, hung, True)
            assert await _ask(session, url, 0) == (200, good)
            assert await _ask(session, url, 1) == (200, good)  # round robin: one was cut there
            await healthy(2)  # re-admitted, still hung
            before = await _cut_there(session, metrics, hung)
            answers = await asyncio.wait_for(
                asyncio.gather(*(_ask(session, url, 10 + i) for i in range(6))), 120)
            assert answers == [(200, good)] * 6
            # on probation it took one of the six, its trial; the others went elsewhere
            assert await _cut_there(session, metrics, hung) - before == 1
            await _hang(session, hung, False)
            await healthy(2)
            # off probation once it answers: round robin reaches it again
            got = {await _ask(session, url, 20 + i) for i in range(4)}
            assert got == {(200, hung), (200, good)}
    finally:
        stop.set()
        await task
