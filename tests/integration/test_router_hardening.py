"""Hostile and sloppy clients against the router app on a real socket, with a real HTTP
server behind it that records what reaches it (an engine's stand-in that answers like one):
timeouts on incomplete requests, tenant isolation, hop-by-hop headers, the error contract, and
no client bytes in the log."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import pytest

from prefix_router.app import serve
from prefix_router.config import RouterSettings

MODEL = "test-model"



class Router:
    """The router as `prefix-router` runs it (app.serve), in this process, on a free port."""

    def __init__(self, port: int, metrics: int | None, session: aiohttp.ClientSession) -> None:
        self.host, self.port = "127.0.0.1", port
        self.url = f"http://127.0.0.1:{port}"
        # its /metrics page, on a port of its own (or the API port with metrics_port null)
        self.metrics = f"http://127.0.0.1:{metrics or port}/metrics"
        self.session = session

    def post(self, path: str, **kw: Any) -> Any:
        return self.session.post(self.url + path, **kw)

    def get(self, path: str, **kw: Any) -> Any:
        return self.session.get(self.url + path, **kw)


@pytest.fixture
async def router(engine) -> AsyncIterator[Callable[..., Any]]:
    stops: list[tuple[asyncio.Event, asyncio.Task[None]]] = []
    session = aiohttp.ClientSession()

    async def make(**settings: Any) -> Router:
        s = RouterSettings.model_validate(
            {"discovery": {"backends": [engine[0]]}, "models": [MODEL], "port": 0, **settings}
        )
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        bound: asyncio.Future[int] = loop.create_future()
        metrics: asyncio.Future[int] = loop.create_future()
        task = asyncio.create_task(serve(s, stop, bound.set_result, metrics.set_result))
        stops.append((stop, task))
        port = await asyncio.wait_for(bound, 30)
        return Router(port, metrics.result() if s.metrics_port is not None else None, session)

    yield make
    await session.close()
    for stop, task in stops:
        stop.set()
        await task


def chat(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "hello " * 40}], **extra}


async def _closed(host: str, port: int, send: list[bytes], gap: float) -> bytes:
    """Send `send` a piece at a time, `gap` apart; what came back when the router closed."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        for piece in send:
            writer.write(piece)
            await writer.drain()
            await asyncio.sleep(gap)
        return await asyncio.wait_for(reader.read(), 60)
    except (ConnectionResetError, BrokenPipeError):
        return b""
    finally:
        writer.close()


async def test_incomplete_requests_are_closed(router) -> None:
    client = await router(keepalive_timeout_s=0.5, body_timeout_s=0.5)
    host, port = client.host, client.port
    # a silent connection, and headers sent a byte at a time: closed, nothing answered
    assert await _closed(host, port, [], 0) == b""
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
    got = await _closed(host, port, [head[i : i + 1] for i in range(len(head))], 0.05)
    assert got == b""
    # a body that trickles: a 408 in OpenAI's error JSON, then the connection closes
    body = json.dumps(chat()).encode()
    start = head + b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
    got = await _closed(host, port, [start, body[:10], body[10:20]], 0.4)
    assert got.startswith(b"HTTP/1.1 408"), got[:200]
    assert b'"invalid_request_error"' in got


async def test_the_gateways_salt_wins_and_reaches_the_engine(router, engine) -> None:
    _url, seen = engine
    client = await router()
    async with client.post("/v1/chat/completions", json=chat(cache_salt="someone-else"),
                           headers={"x-cache-salt": "tenant-a"}) as r:  # fmt: skip
        assert r.status == 200
    assert seen[-1]["body"]["cache_salt"] == "tenant-a"
    async with client.post("/v1/chat/completions", json=chat(cache_salt="mine")) as r:
        assert r.status == 200 and seen[-1]["body"]["cache_salt"] == "mine"  # no gateway


async def test_routing_details_stay_inside_unless_turned_on(router) -> None:
    quiet = await router()
    async with quiet.post("/v1/chat/completions", json=chat()) as r:
        assert r.status == 200
        assert "x-routed-to" not in r.headers and "x-route-reason" not in r.headers
        assert r.headers["Server"] == "prefix-router"
    told = await router(expose_routing=True)
    async with told.post("/v1/chat/completions", json=chat()) as r:
        assert r.headers["x-route-reason"] == "miss" and r.headers["x-routed-to"]


async def test_hop_by_hop_headers_stop_here_and_forwarded_for_grows(router, engine) -> None:
    _url, seen = engine
    client = await router()
    async with client.post("/v1/chat/completions", json=chat(), headers={
        "Connection": "keep-alive, X-Secret-Hop", "X-Secret-Hop": "1", "X-Kept": "yes",
        "X-Forwarded-For": "198.18.0.7"}) as r:  # fmt: skip
        assert r.status == 200
    got = {k.lower(): v for k, v in seen[-1]["headers"].items()}
    assert "x-secret-hop" not in got and got["x-kept"] == "yes"
    assert got["x-forwarded-for"] == "198.18.0.7, 127.0.0.1"
    # named in Connection, the client's X-Forwarded-For is hop-by-hop too: ours starts anew
    async with client.post("/v1/chat/completions", json=chat(), headers={
        "Connection": "X-Forwarded-For", "X-Forwarded-For": "198.18.0.7"}) as r:  # fmt: skip
        assert r.status == 200
    got = {k.lower(): v for k, v in seen[-1]["headers"].items()}
    assert got["x-forwarded-for"] == "127.0.0.1"


async def test_the_forwarding_headers_follow_one_rule(router, engine) -> None:
    # Forwarded, X-Real-IP, X-Forwarded-Host and -Proto went to the engine as the client wrote
    # them (a client could pose as any address or host) while X-Forwarded-For was appended to.
    _url, seen = engine
    client = await router()
    async with client.post("/v1/chat/completions", json=chat(), headers=[
        ("Forwarded", "for=198.18.0.7"), ("Forwarded", 'for="[2001:db8::1]";proto=https'),
        ("X-Real-IP", "198.18.0.9"), ("X-Forwarded-Host", "api.example"),
        ("X-Forwarded-Proto", "https"), ("X-Forwarded-For", "198.18.0.7")]) as r:  # fmt: skip
        assert r.status == 200
    got = seen[-1]["headers"]
    here = f"127.0.0.1:{client.port}"
    # the lists: every hop the client named, then the router's peer (one field each)
    assert got.getall("Forwarded") == [
        f'for=198.18.0.7, for="[2001:db8::1]";proto=https, for=127.0.0.1;host="{here}";proto=http'
    ]
    assert got.getall("X-Forwarded-For") == ["198.18.0.7, 127.0.0.1"]
    # the single values: the router's own
    assert got.getall("X-Real-IP") == ["127.0.0.1"]
    assert got.getall("X-Forwarded-Host") == [here]
    assert got.getall("X-Forwarded-Proto") == ["http"]
    # named in Connection, the client's Forwarded is hop-by-hop: the router's starts anew
    async with client.post("/v1/chat/completions", json=chat(), headers={
        "Connection": "Forwarded", "Forwarded": "for=198.18.0.7"}) as r:  # fmt: skip
        assert r.status == 200
    assert seen[-1]["headers"].getall("Forwarded") == [f'for=127.0.0.1;host="{here}";proto=http']


async def test_the_error_contract(router) -> None:
    client = await router()
    async with client.post(
        "/v1/chat/completions", json=chat(), headers={"Expect": "418-teapot"}
    ) as r:
        assert r.status == 417 and (await r.json())["error"]["type"] == "invalid_request_error"
    async with client.get("/v1/chat/completions") as r:
        body = await r.json()
        assert r.status == 405 and body["error"]["type"] == "invalid_request_error"


async def test_a_clients_broken_body_leaves_no_trace_of_it_in_the_log(router, caplog) -> None:
    client = await router()
    host, port = client.host, client.port
    caplog.set_level(logging.DEBUG)
    secret = b"SECRET-PROMPT-" * 20
    head = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
            b"Content-Type: application/json\r\n")  # fmt: skip
    cases = [
        head + b"Transfer-Encoding: chunked\r\n\r\n" + b"zz\r\n" + secret + b"\r\n0\r\n\r\n",
        head + b"Content-Encoding: gzip\r\nContent-Length: %d\r\n\r\n" % len(secret) + secret,
    ]
    for raw in cases:
        reply = await _closed(host, port, [raw], 0)
        # refused by aiohttp's parser or by the router: a 400 either way
        assert reply.split(b" ", 2)[1] == b"400", reply[:200]
    text = "\n".join(r.getMessage() + str(r.exc_info or "") for r in caplog.records)
    assert "SECRET-PROMPT" not in text
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


async def test_metrics_are_not_served_on_the_api_port(router, engine) -> None:
    # /metrics labels its series with every engine's URL: on the API port any client learnt
    # the fleet's addresses (unless metrics_port was set).
    engine_url, _seen = engine
    client = await router()
    async with client.post("/v1/chat/completions", json=chat()) as r:
        assert r.status == 200
    async with client.get("/metrics") as r:
        assert r.status == 404
        assert engine_url.split("//")[1] not in await r.text()
    async with client.session.get(client.metrics) as r:
        assert r.status == 200
        assert engine_url.split("//")[1] in await r.text()
    assert client.metrics != client.url + "/metrics"
    one_port = await router(metrics_port=None)  # asked for: /metrics on the API port
    async with one_port.get("/metrics") as r:
        assert r.status == 200


async def test_a_prompt_longer_than_the_engines_take_is_refused_before_the_index(
    router, engine
) -> None:
    client = await router(max_prompt_tokens=1000)  # the stand-in says no max_model_len
    huge = {"model": MODEL, "messages": [{"role": "user", "content": "x" * 4_000_000}]}
    async with client.post("/v1/chat/completions", json=huge) as r:
        body = await r.json()
        assert r.status == 400 and body["error"]["code"] == "context_length_exceeded"
    async with client.session.get(client.metrics) as r:
        text = await r.text()
    assert "prefix_router_table_entries 0.0" in text  # nothing of it reached the index
    _url, seen = engine
    assert not seen


async def test_the_index_is_bounded_by_its_memory_budget(router) -> None:
    from prefix_router.config import INDEX_ENTRY_BYTES

    client = await router(index_memory_mb=1)  # ~5,000 entries
    bound = max(1000, 2**20 // INDEX_ENTRY_BYTES)
    for i in range(12):
        prompt = {"model": MODEL, "messages": [{"role": "user", "content": f"{i} " * 20_000}]}
        async with client.post("/v1/chat/completions", json=prompt) as r:
            assert r.status == 200
    async with client.session.get(client.metrics) as r:
        text = await r.text()
    entries = next(float(x.split()[1]) for x in text.splitlines()
                   if x.startswith("prefix_router_table_entries "))  # fmt: skip
    assert 0 < entries <= bound


async def test_an_oversized_body_is_refused_before_the_client_sends_it(router) -> None:
    client = await router(max_body_bytes=1 << 20)
    reader, writer = await asyncio.open_connection(client.host, client.port)
    try:
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                     b"Content-Type: application/json\r\nExpect: 100-continue\r\n"
                     b"Content-Length: %d\r\n\r\n" % (64 << 20))
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
    finally:
        writer.close()
    assert head.startswith(b"HTTP/1.1 413"), head  # not "100 Continue": nothing uploaded
