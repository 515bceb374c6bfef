"""A client that has read a stream's `data: [DONE]` may close its connection before the chunked
stream's last (empty) chunk reaches it, as the bench's load generator and many SDKs do. The
answer was delivered whole: the router counts it `ok` (and records its answer for the next
turn), rather than failing the request with an error traceback.

The engine here is an aiohttp stub, because only it can be made to hold the stream's end
until the client has closed: a simulator ends its stream at once, and the race is then won
or lost by timing."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from inprocess import serve_router, stub_engine

from bench.harness.promtext import sample_sum
from prefix_router.config import RouterSettings

MODEL = "test-model"


@pytest.fixture
async def engine() -> AsyncIterator[tuple[str, asyncio.Event]]:
    """Streams a whole answer, then ends its stream only once the test says the client left."""
    client_gone = asyncio.Event()

    async def chat(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        chunk = ('{"id":"c1","object":"chat.completion.chunk","model":"test-model","choices":'
                 '[{"index":0,"delta":{"content":"hi"},"finish_reason":"stop"}],'
                 '"usage":{"prompt_tokens":5,"completion_tokens":1,"total_tokens":6}}')
        await resp.write(f"data: {chunk}\n\ndata: [DONE]\n\n".encode())
        await client_gone.wait()
        await resp.write_eof()
        return resp

    async with stub_engine(chat) as url:
        yield url, client_gone


async def _outcomes(session: aiohttp.ClientSession, metrics: str, backend: str) -> dict[str, Any]:
    async with session.get(metrics) as r:
        text = await r.text()
    return {o: sample_sum(text, "prefix_router_requests_total", backend=backend, outcome=o)
            for o in ("ok", "client_gone")}  # fmt: skip


async def test_a_client_closing_after_done_leaves_an_ok_request(engine) -> None:
    backend, client_gone = engine
    s = RouterSettings.model_validate({
        "discovery": {"backends": [backend]}, "models": [MODEL], "port": 0,
        "policy": "round-robin", "health": {"probe_interval_s": 0.1},
    })  # fmt: skip
    url, metrics, stop, task = await serve_router(s)
    try:
        host, port = url.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        body = (b'{"model":"test-model","stream":true,"max_tokens":1,'
                b'"messages":[{"role":"user","content":"hello"}]}')
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                     b"Content-Type: application/json\r\n"
                     b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        await writer.drain()
        seen = b""
        while b"[DONE]" not in seen:
            data = await asyncio.wait_for(reader.read(65536), 30)
            assert data, seen
            seen += data
        writer.close()  # the whole answer read: gone before the stream's last chunk
        await writer.wait_closed()
        client_gone.set()
        async with aiohttp.ClientSession() as session:
            deadline = asyncio.get_running_loop().time() + 30
            while sum((got := await _outcomes(session, metrics, backend)).values()) < 1:
                assert asyncio.get_running_loop().time() < deadline, got
                await asyncio.sleep(0.05)
        assert got == {"ok": 1.0, "client_gone": 0.0}
    finally:
        stop.set()
        await task
