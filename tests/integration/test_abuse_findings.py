"""What `python -m bench abuse` found the router doing wrong, each a test that failed before its
fix (bench/results/abuse/FINDINGS.md says how each was found): the router as `prefix-router`
runs it (app.serve), in this process, over an HTTP server that answers like an engine and
keeps what reached it. Not here: aiohttp's own answer to a request its parser refuses names
its version in `Server` (no public hook changes that answer: docs/router-http.md; the bench
counts it apart, tests/bench/test_abuse.py)."""

from __future__ import annotations

import asyncio
import gzip
import logging
import time
import zlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import pytest
from multidict import CIMultiDict

from prefix_router.app import serve
from prefix_router.config import RouterSettings

MODEL = "test-model"



@pytest.fixture
async def router(engine) -> AsyncIterator[Callable[..., Any]]:
    stops: list[tuple[asyncio.Event, asyncio.Task[None]]] = []

    async def make(**settings: Any) -> int:
        s = RouterSettings.model_validate(
            {"discovery": {"backends": [engine[0]]}, "models": [MODEL], "port": 0, **settings})
        stop = asyncio.Event()
        bound: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        stops.append((stop, asyncio.create_task(serve(s, stop, bound.set_result))))
        return await asyncio.wait_for(bound, 30)

    yield make
    for stop, task in stops:
        stop.set()
        await task


def chat_bytes(extra: bytes = b"") -> bytes:
    return (b'{"model": "' + MODEL.encode() + b'", "messages": [{"role": "user", "content": '
            b'"hello there"}]' + extra + b"}")


async def test_an_integer_too_long_for_python_is_the_clients_mistake(router, caplog) -> None:
    # Python's int() refuses more than 4,300 digits with a ValueError that json.loads lets
    # through (it is no JSONDecodeError): the router answered 500 and logged a traceback.
    port = await router()
    caplog.set_level(logging.INFO)
    async with aiohttp.ClientSession() as s, s.post(
        f"http://127.0.0.1:{port}/v1/chat/completions",
        data=chat_bytes(b', "max_tokens": ' + b"9" * 5000),
        headers={"Content-Type": "application/json"},
    ) as r:
        body = await r.json()
    assert r.status == 400, body
    assert body["error"]["type"] == "invalid_request_error"
    assert not [x for x in caplog.records if x.levelno >= logging.ERROR]


async def test_repeated_forwarded_for_headers_are_all_kept(router, engine) -> None:
    # Two X-Forwarded-For fields are one list (RFC 9110 5.3); the router kept only the last.
    _url, seen = engine
    port = await router()
    headers = CIMultiDict([("X-Forwarded-For", "198.18.0.7"), ("X-Forwarded-For", "198.18.0.8"),
                           ("Content-Type", "application/json")])
    async with aiohttp.ClientSession() as s, s.post(
        f"http://127.0.0.1:{port}/v1/chat/completions", data=chat_bytes(), headers=headers
    ) as r:
        assert r.status == 200
    got = ", ".join(seen[-1]["headers"].getall("X-Forwarded-For"))
    assert got == "198.18.0.7, 198.18.0.8, 127.0.0.1"


async def _raw(port: int, data: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), 30)
    finally:
        writer.close()


async def test_compressed_bodies_are_inflated_by_the_router_within_the_limit(
    router, engine
) -> None:
    # aiohttp's server inflates a body as it arrives, on the event loop, before any handler:
    # a deflate body of 256 MiB of zeros (256 KiB on the wire) held /healthz for ~3 s. The
    # router takes bodies as sent and inflates them itself, bounded, in a worker thread
    # (offload.py; /healthz during the attack is `python -m bench abuse`'s figure).
    _url, seen = engine
    port = await router(max_body_bytes=1 << 20)
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    json_headers = {"Content-Type": "application/json"}
    async with aiohttp.ClientSession() as s:
        bomb = zlib.compress(bytes(256 * 2**20), 9)
        async with s.post(url, data=bomb, headers={**json_headers,
                                                   "Content-Encoding": "deflate"}) as r:
            assert r.status == 413 and (await r.json())["error"]["message"]
        body = gzip.compress(chat_bytes())
        async with s.post(url, data=body, headers={**json_headers,
                                                   "Content-Encoding": "gzip"}) as r:
            assert r.status == 200
        assert seen and "Content-Encoding" not in seen[-1]["headers"]  # the engine gets it plain
        async with s.post(url, data=b"\x1f\x8bnot gzip", headers={
                **json_headers, "Content-Encoding": "gzip"}) as r:
            assert r.status == 400
        async with s.post(url, data=chat_bytes(), headers={
                **json_headers, "Content-Encoding": "zstd-from-the-future"}) as r:
            assert r.status == 415


async def test_the_connection_closes_once_a_trickled_body_got_its_408(router) -> None:
    # After the 408 (`Connection: close`) aiohttp reads on for its lingering time (10 s) while
    # the client keeps sending: a slow client holds its connection body_timeout_s + 10 s.
    port = await router(body_timeout_s=0.5)
    body = chat_bytes()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                 b"application/json\r\nContent-Length: %d\r\n\r\n" % len(body))
    got = b""
    answered = closed = None
    t0 = time.monotonic()
    try:
        for i in range(60):  # a byte every 0.25 s, for up to 15 s
            if i < len(body):
                writer.write(body[i : i + 1])
            try:
                data = await asyncio.wait_for(reader.read(65536), 0.25)
            except TimeoutError:
                continue
            if not data:
                closed = time.monotonic() - t0
                break
            got += data
            if answered is None and b"\r\n\r\n" in got:
                answered = time.monotonic() - t0
    except (ConnectionResetError, BrokenPipeError):
        closed = time.monotonic() - t0
    finally:
        writer.close()
    assert got.startswith(b"HTTP/1.1 408"), got[:100]
    assert answered is not None and closed is not None, (answered, closed)
    # aiohttp's default lingering would hold it 10 s more
    assert closed - answered < 5.0, f"closed {closed - answered:.1f}s after the 408"


@pytest.mark.parametrize("depth", [980, 985])
async def test_a_deeply_nested_chat_body_is_a_400(fleet, engine, depth: int) -> None:
    # tools, a content part or tool_calls nested 980-985 levels: json.dumps of them (the
    # canonical bytes) hit Python's recursion limit and the router answered 500. The router
    # runs as a process of its own: how deep a stack it has left is then the CLI's, not
    # pytest's (in this process the decoder runs out first, at a lower depth).
    router = await fleet.start_router("router", [engine[0]], policy="prefix", kv_capacity=1000)
    deep = b"[" * depth + b"]" * depth
    bodies = [
        chat_bytes(b', "tools": ' + deep),
        b'{"model": "%s", "messages": [{"role": "user", "content": [{"type": "image_url", '
        b'"image_url": %s}]}]}' % (MODEL.encode(), deep),
        b'{"model": "%s", "messages": [{"role": "assistant", "tool_calls": %s}]}'
        % (MODEL.encode(), deep),
    ]
    async with aiohttp.ClientSession() as s:
        for data in bodies:
            async with s.post(router.url + "/v1/chat/completions", data=data,
                              headers={"Content-Type": "application/json"}) as r:
                body = await r.json()
            assert r.status == 400, body
            assert body["error"]["type"] == "invalid_request_error"
    assert b"Traceback" not in router.log_path.read_bytes()
