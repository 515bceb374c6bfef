"""prefix_router.upstream_httptools against real servers on 127.0.0.1: a tiny asyncio server
per test answering as it is told (Content-Length, chunked, Connection: close, closing idle
connections, stalling), and aiohttp's server for a streamed answer."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from aiohttp import web

from prefix_router.upstream import (
    UpstreamClient,
    UpstreamConnectError,
    UpstreamError,
    UpstreamTimeout,
)
from prefix_router.upstream.response import HIGH_WATER

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[None]]
JSON = {"Content-Type": "application/json"}


async def read_request(reader: asyncio.StreamReader) -> tuple[bytes, bytes] | None:
    """(head, body) of the next request on the connection, None at its end."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None
    length = 0
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    return head, await reader.readexactly(length)


def answer(body: bytes, *extra: str) -> bytes:
    head = "".join(f"{h}\r\n" for h in extra)
    return f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\n{head}\r\n".encode() + body


class Server:
    """Connections numbered from 0 in order of arrival, each served by `handler`."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.gone: list[int] = []  # connections the client closed, in order
        self.url = ""
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> Server:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        k = self.connections
        self.connections += 1
        try:
            await self.handler(reader, writer, k)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()


async def keep_alive(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, k: int) -> None:
    """Answer every request with its own body, on the same connection."""
    while (req := await read_request(reader)) is not None:
        writer.write(answer(req[1], "X-Conn: " + str(k)))
        await writer.drain()


@pytest.fixture
async def client() -> AsyncIterator[UpstreamClient]:
    c = UpstreamClient(connect_timeout_s=2.0, read_timeout_s=5.0)
    yield c
    await c.close()


async def test_content_length_answers_reuse_one_connection(client: UpstreamClient) -> None:
    async with Server(keep_alive) as srv:
        for i in range(5):
            async with await client.post(srv.url, "/v1/completions", b"body %d" % i, JSON) as r:
                assert r.status == 200
                assert await r.read() == b"body %d" % i
                assert r.headers["x-conn"] == "0"
                assert r.headers.get("X-CONN") == "0" and "Content-Length" in r.headers
        assert srv.connections == 1


async def test_request_carries_host_content_length_and_headers(client: UpstreamClient) -> None:
    seen: list[bytes] = []

    async def record(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, k: int) -> None:
        req = await read_request(reader)
        assert req is not None
        seen.append(req[0])
        writer.write(answer(b"{}"))
        await writer.drain()

    async with Server(record) as srv:
        headers = {"Content-Type": "application/json", "X-Request-Id": "abc"}
        async with await client.post(srv.url, "/v1/chat/completions", b'{"a": 1}', headers) as r:
            assert await r.read() == b"{}"
    host = srv.url.removeprefix("http://")
    assert seen[0] == (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: " + host.encode() + b"\r\n"
        b"Content-Type: application/json\r\nX-Request-Id: abc\r\nContent-Length: 8\r\n\r\n"
    )


async def test_chunked_answer_arrives_chunk_by_chunk(client: UpstreamClient) -> None:
    step = asyncio.Event()

    async def chunked(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, k: int) -> None:
        while await read_request(reader) is not None:
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nfirst\r\n")
            await writer.drain()
            await step.wait()
            step.clear()
            writer.write(b"6\r\nsecond\r\n0\r\n\r\n")
            await writer.drain()

    async with Server(chunked) as srv:
        for _ in range(2):
            async with await client.post(srv.url, "/", b"", JSON) as r:
                assert await r.readany() == b"first"  # before the rest exists
                step.set()
                rest = b""
                while chunk := await r.readany():
                    rest += chunk
                assert rest == b"second"
                assert await r.readany() == b""
        assert srv.connections == 1  # a chunked answer leaves the connection reusable


async def test_connection_close_answer_is_not_pooled(client: UpstreamClient) -> None:
    async def close_each(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, k: int
    ) -> None:
        req = await read_request(reader)
        assert req is not None
        writer.write(answer(b"bye", "Connection: close"))
        await writer.drain()

    async with Server(close_each) as srv:
        for _ in range(3):
            async with await client.post(srv.url, "/", b"", JSON) as r:
                assert await r.read() == b"bye"
        assert srv.connections == 3


async def test_answer_ended_by_the_connection_close(client: UpstreamClient) -> None:
    async def eof_body(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, k: int) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nuntil the end")
        await writer.drain()

    async with Server(eof_body) as srv:
        async with await client.post(srv.url, "/", b"", JSON) as r:
            assert await r.read() == b"until the end"


async def test_server_closing_an_idle_connection(client: UpstreamClient) -> None:
    async def one_then_close(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, k: int
    ) -> None:
        req = await read_request(reader)
        assert req is not None
        writer.write(answer(b"ok"))
        await writer.drain()  # then close: a keep-alive timeout of zero

    async with Server(one_then_close) as srv:
        async with await client.post(srv.url, "/", b"", JSON) as r:
            assert await r.read() == b"ok"
        await asyncio.sleep(0.1)  # the close reaches the pooled connection
        async with await client.post(srv.url, "/", b"", JSON) as r:
            assert await r.read() == b"ok"
        assert srv.connections == 2


async def test_stale_pooled_connection_is_retried_once_on_a_fresh_one(
    client: UpstreamClient,
) -> None:
    """The race a keep-alive timeout makes: the request went out on a pooled connection and the
    server closed it without a byte of answer. No byte came back, so it is sent again."""

    async def drop_second(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, k: int
    ) -> None:
        n = 0
        while (req := await read_request(reader)) is not None:
            n += 1
            if k == 0 and n == 2:
                return  # read the request, close without answering
            writer.write(answer(req[1]))
            await writer.drain()

    async with Server(drop_second) as srv:
        async with await client.post(srv.url, "/", b"one", JSON) as r:
            assert await r.read() == b"one"
        async with await client.post(srv.url, "/", b"two", JSON) as r:
            assert await r.read() == b"two"
        assert srv.connections == 2


async def test_fresh_connection_closed_before_any_byte_is_a_connect_error(
    client: UpstreamClient,
) -> None:
    async def drop(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, k: int) -> None:
        await read_request(reader)

    async with Server(drop) as srv:
        with pytest.raises(UpstreamConnectError):
            await client.post(srv.url, "/", b"x", JSON)
        assert srv.connections == 1  # not sent again: it was no stale pooled connection


async def test_cut_after_the_first_byte_is_not_retried(client: UpstreamClient) -> None:
    async def cut(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, k: int) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly some")
        await writer.drain()

    async with Server(cut) as srv:
        r = await client.post(srv.url, "/", b"", JSON)
        with pytest.raises(UpstreamError) as err:
            await r.read()
        assert not isinstance(err.value, UpstreamConnectError)
        assert srv.connections == 1


async def test_connect_refused() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: refused
        c = UpstreamClient(connect_timeout_s=2.0, read_timeout_s=5.0)
        try:
            with pytest.raises(UpstreamConnectError, match="cannot connect"):
                await c.post(f"http://127.0.0.1:{port}", "/", b"", JSON)
        finally:
            await c.close()


def stall_after(prefix: bytes) -> Handler:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, k: int) -> None:
        await read_request(reader)
        writer.write(prefix)
        await writer.drain()
        await asyncio.sleep(30)

    return handler


async def test_read_timeout_before_the_headers() -> None:
    c = UpstreamClient(connect_timeout_s=2.0, read_timeout_s=0.3)
    try:
        async with Server(stall_after(b"")) as srv:
            t0 = asyncio.get_running_loop().time()
            with pytest.raises(TimeoutError):
                await c.post(srv.url, "/", b"", JSON)
            assert 0.25 < asyncio.get_running_loop().time() - t0 < 2.0
    finally:
        await c.close()


async def test_read_timeout_on_a_slow_body() -> None:
    c = UpstreamClient(connect_timeout_s=2.0, read_timeout_s=0.3)
    try:
        head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nsome\r\n"
        async with Server(stall_after(head)) as srv:
            r = await c.post(srv.url, "/", b"", JSON)
            assert await r.readany() == b"some"
            with pytest.raises(UpstreamTimeout):
                await r.readany()
    finally:
        await c.close()


async def test_a_trickling_body_is_no_timeout() -> None:
    """The read timeout is the longest silence, not the whole answer's time."""

    async def trickle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, k: int) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        for _ in range(6):
            writer.write(b"1\r\n.\r\n")
            await writer.drain()
            await asyncio.sleep(0.1)
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    c = UpstreamClient(connect_timeout_s=2.0, read_timeout_s=0.3)
    try:
        async with Server(trickle) as srv:
            async with await c.post(srv.url, "/", b"", JSON) as r:
                assert await r.read() == b"......"
    finally:
        await c.close()


async def test_closing_a_partly_read_answer_closes_the_connection(client: UpstreamClient) -> None:
    """What makes the engine abort the request of a client that went away."""
    gone = asyncio.Event()

    async def stream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, k: int) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        try:
            while True:
                writer.write(b"5\r\ntoken\r\n")
                await writer.drain()
                if await reader.read(1) == b"":  # EOF: the client closed
                    gone.set()
                    return
        except ConnectionError:
            gone.set()

    async with Server(stream) as srv:
        r = await client.post(srv.url, "/", b"", JSON)
        assert (await r.readany()).startswith(b"token")
        r.close()
        await asyncio.wait_for(gone.wait(), 5)
        with pytest.raises(UpstreamError):
            await r.readany()


async def test_cancelled_while_waiting_closes_the_connection(client: UpstreamClient) -> None:
    gone = asyncio.Event()

    async def never(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, k: int) -> None:
        await read_request(reader)
        if await reader.read(1) == b"":
            gone.set()

    async with Server(never) as srv:
        task = asyncio.create_task(client.post(srv.url, "/", b"", JSON))
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.wait_for(gone.wait(), 5)


async def test_slow_consumer_pauses_reading(client: UpstreamClient) -> None:
    size = 32 * 1024 * 1024  # more than loopback's socket buffers hold
    done = asyncio.Event()

    async def big(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, k: int) -> None:
        while await read_request(reader) is not None:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % size)
            writer.write(b"x" * size)
            await writer.drain()
            done.set()

    async with Server(big) as srv:
        r = await client.post(srv.url, "/", b"", JSON)
        await asyncio.sleep(0.3)  # the consumer is busy elsewhere
        conn = r._conn
        assert conn is not None and conn.paused
        assert r._size < HIGH_WATER + 1024 * 1024  # not the whole body buffered
        assert not done.is_set()  # the server is held back by TCP
        got = 0
        while chunk := await r.readany():
            got += len(chunk)
        assert got == size
        # the connection went back to the pool and serves the next request
        async with await client.post(srv.url, "/", b"", JSON) as r2:
            assert len(await r2.read()) == size
        assert srv.connections == 1


async def test_idle_connections_are_bounded_and_age_out() -> None:
    c = UpstreamClient(connect_timeout_s=2.0, read_timeout_s=5.0, max_idle=2, idle_timeout_s=60)
    try:
        async with Server(keep_alive) as srv:
            rs = await asyncio.gather(*(c.post(srv.url, "/", b"x", JSON) for _ in range(4)))
            for r in rs:
                assert await r.read() == b"x"
            pool = c._pools[srv.url]
            assert srv.connections == 4
            assert len(pool.idle) == 2  # the other two were closed
            pool.sweep(c.loop.time() + 61)
            assert pool.idle == []
            await asyncio.sleep(0.05)
            assert pool.conns == set()
    finally:
        await c.close()


async def test_streamed_answer_from_aiohttp(client: UpstreamClient) -> None:
    """The simulator's way of streaming: aiohttp's StreamResponse, chunked."""

    async def sse(request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(5):
            await resp.write(b"data: %d\n\n" % i)
            await asyncio.sleep(0.01)
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_post("/v1/completions", sse)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(2):
            async with await client.post(url, "/v1/completions", b"{}", JSON) as r:
                assert r.status == 200
                assert r.headers["Content-Type"] == "text/event-stream"
                got = b""
                while chunk := await r.readany():
                    got += chunk
                assert got.endswith(b"data: [DONE]\n\n") and got.startswith(b"data: 0\n\n")
        assert len(client._pools[url].conns) == 1
    finally:
        await runner.cleanup()
