"""A hand-written upstream client on httptools (llhttp), kept beside aiohttp's for the A/B
that decides between them (bench/results/overhead/): the same interface and errors as
upstream.py.

Keep-alive HTTP/1.1 POSTs: per backend a pool of idle connections (LIFO, at most `max_idle`,
closed after `idle_timeout_s`), TCP_NODELAY on every socket, a connect timeout and a read
timeout (no byte for that long), response headers bounded in size, outbound headers refused
if they hold CR or LF.

Retry policy for these non-idempotent POSTs: a request sent on a pooled connection that
fails before ANY byte of the answer came back is sent once more, on a fresh connection: the
engine may have closed the idle connection as we sent (its keep-alive timeout racing our
write), and an engine that loses a request's connection aborts it. After the first byte
nothing is ever sent again.
"""

from __future__ import annotations

import asyncio
import re
import socket
import ssl
from collections.abc import AsyncIterator, Mapping
from typing import Any
from urllib.parse import urlsplit

import httptools

from .upstream import (
    MAX_HEADER_BYTES,
    UpstreamConnectError,
    UpstreamConnectTimeout,
    UpstreamError,
    UpstreamTimeout,
)

IDLE_TIMEOUT_S = 60.0
MAX_IDLE = 256  # idle connections kept per backend
# Body bytes waiting for a slow consumer above which the engine's socket is no longer read
# (TCP then slows the engine down); reading resumes when the consumer took them.
HIGH_WATER = 256 * 1024
_SWEEP_S = 10.0
_CRLF = re.compile(r"[\r\n]")


class Headers(dict[str, str]):
    """Response headers by lower-cased name; a repeated header's values joined with ", "."""

    __slots__ = ()

    def __getitem__(self, name: str) -> str:
        return dict.__getitem__(self, name.lower())

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and dict.__contains__(self, name.lower())

    def get(self, name: str, default: Any = None) -> Any:  # type: ignore[override]
        return dict.get(self, name.lower(), default)


class UpstreamResponse:
    """One answer: `status` and `headers` once it is returned, then the body by `read()` or by
    `readany()`. A response whose body fully arrived has already given its connection back to
    the pool; `close()` (or leaving `async with`) on one still arriving closes the connection,
    which makes the engine abort the request."""

    __slots__ = (
        "_chunks",
        "_conn",
        "_done",
        "_error",
        "_head",
        "_loop",
        "_size",
        "_waiter",
        "headers",
        "status",
    )

    def __init__(self, conn: _Connection) -> None:
        self.status = 0
        self.headers = Headers()
        self._loop = conn.loop
        self._conn: _Connection | None = conn  # None once complete, failed or closed
        self._chunks: list[bytes] = []
        self._size = 0
        self._done = False
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._head = 0  # bytes of header lines so far

    async def read(self) -> bytes:
        """The whole body."""
        while not self._done:
            if self._error is not None:
                raise self._error
            conn = self._conn
            if conn is not None and conn.paused:
                conn.resume()
            await self._wait()
        body = b"".join(self._chunks)
        self._chunks = []
        self._size = 0
        return body

    async def readany(self) -> bytes:
        """The body bytes that arrived since the last call (waiting for some); b"" at the end."""
        while not self._chunks:
            if self._error is not None:
                raise self._error
            if self._done:
                return b""
            await self._wait()
        chunks = self._chunks
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        self._chunks = []
        self._size = 0
        conn = self._conn
        if conn is not None and conn.paused:
            conn.resume()
        return data

    async def chunks(self) -> AsyncIterator[bytes]:
        while data := await self.readany():
            yield data

    def close(self) -> None:
        conn = self._conn
        if conn is not None:
            self._conn = None
            conn.abandon()
        if not self._done and self._error is None:
            self._error = UpstreamError("the response was closed before its end")

    release = close

    async def __aenter__(self) -> UpstreamResponse:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    # -- fed by the connection

    async def _wait(self) -> None:
        waiter = self._waiter = self._loop.create_future()
        try:
            await waiter
        finally:
            self._waiter = None

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _feed(self, data: bytes) -> None:
        self._chunks.append(data)
        self._size += len(data)
        conn = self._conn
        if self._size > HIGH_WATER and conn is not None and not conn.paused:
            conn.pause()
        self._wake()

    def _end(self) -> None:
        self._done = True
        self._conn = None
        self._wake()

    def _fail(self, exc: BaseException) -> None:
        self._error = exc
        self._conn = None
        self._wake()


class _Connection(asyncio.Protocol):
    """One TCP connection; at most one response in flight on it."""

    def __init__(self, pool: _Pool) -> None:
        self.pool = pool
        self.loop = pool.loop
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.resp: UpstreamResponse | None = None
        self.got_bytes = False  # of the answer in flight
        self.informational = False  # inside a 1xx answer (skipped)
        self.paused = False
        self.closed = False
        self.idle_since = 0.0
        self.last_data = 0.0
        self.timer: asyncio.TimerHandle | None = None

    async def request(self, data: bytes) -> UpstreamResponse:
        """Send `data` (request line, headers and body) and wait for the answer's headers."""
        transport = self.transport
        if transport is None or self.closed or transport.is_closing():
            raise UpstreamConnectError(f"the connection to {self.pool.name} was closed")
        resp = self.resp = UpstreamResponse(self)
        self.got_bytes = False
        self.last_data = self.loop.time()
        self.timer = self.loop.call_at(self.last_data + self.pool.read_timeout, self._check)
        transport.write(data)
        try:
            while not resp.status:
                if resp._error is not None:
                    raise resp._error
                await resp._wait()
        except BaseException:
            resp.close()  # cancelled: the engine must learn it through the closed connection
            raise
        return resp

    def pause(self) -> None:
        if self.transport is not None and not self.closed:
            self.paused = True
            self.transport.pause_reading()

    def resume(self) -> None:
        if self.paused and self.transport is not None and not self.closed:
            self.paused = False
            self.last_data = self.loop.time()  # waiting on us was not the engine's silence
            self.transport.resume_reading()

    def abandon(self) -> None:
        self.resp = None
        self.close()

    def _stop_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def close(self) -> None:
        self._stop_timer()
        if not self.closed:
            self.closed = True
            if self.transport is not None:
                self.transport.close()

    def _check(self) -> None:
        """The read timer: fails the answer in flight after `read_timeout` without a byte."""
        self.timer = None
        if self.resp is None:
            return
        now = self.loop.time()
        limit = self.pool.read_timeout
        due = now + limit if self.paused else self.last_data + limit
        if due > now:
            self.timer = self.loop.call_at(due, self._check)
            return
        self._fail(UpstreamTimeout(f"{self.pool.name} sent nothing for {limit:g}s"))

    def _fail(self, exc: BaseException) -> None:
        resp = self.resp
        self.resp = None
        self.close()
        if resp is not None:
            resp._fail(exc)

    # -- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  (uvloop's are no subclass)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except (OSError, AttributeError):
                pass

    def data_received(self, data: bytes) -> None:
        if self.resp is None:
            # bytes nobody asked for (on an idle connection): it cannot be trusted any more
            self.close()
            return
        self.got_bytes = True
        self.last_data = self.loop.time()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(UpstreamError(f"malformed answer from {self.pool.name}: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._stop_timer()
        self.pool.lost(self)
        resp = self.resp
        if resp is None:
            return
        self.resp = None
        h = resp.headers
        if resp.status and "content-length" not in h and "transfer-encoding" not in h:
            resp._end()  # an answer delimited by the end of the connection
        elif not self.got_bytes:
            why = f": {exc}" if exc else ""
            msg = f"{self.pool.name} closed the connection before answering{why}"
            resp._fail(UpstreamConnectError(msg))
        else:
            resp._fail(UpstreamError(f"{self.pool.name} closed the connection mid-answer"))

    # -- httptools callbacks

    def on_header(self, name: bytes, value: bytes) -> None:
        assert self.resp is not None
        self.resp._head += len(name) + len(value)
        if self.resp._head > 8 * MAX_HEADER_BYTES or len(name) + len(value) > MAX_HEADER_BYTES:
            raise httptools.HttpParserError("the answer's headers are too large")
        headers = self.resp.headers
        key = name.decode("latin-1").lower()
        v = value.decode("latin-1")
        old = dict.get(headers, key)
        dict.__setitem__(headers, key, v if old is None else f"{old}, {v}")

    def on_headers_complete(self) -> None:
        resp = self.resp
        assert resp is not None
        status = self.parser.get_status_code()
        if 100 <= status < 200:
            self.informational = True
            resp.headers.clear()
            return
        resp.status = status
        resp._wake()

    def on_body(self, body: bytes) -> None:
        assert self.resp is not None
        self.resp._feed(body)

    def on_message_complete(self) -> None:
        if self.informational:
            self.informational = False
            return
        resp = self.resp
        assert resp is not None
        self.resp = None
        self._stop_timer()
        resp._end()
        if self.parser.should_keep_alive() and not self.closed:
            self.pool.put(self)
        else:
            self.close()


class _Pool:
    """The connections to one backend (scheme://host:port[/prefix])."""

    def __init__(self, client: UpstreamClient, base_url: str) -> None:
        u = urlsplit(base_url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"not an http(s) URL: {base_url!r}")
        self.name = base_url
        self.loop = client.loop
        self.connect_timeout = client.connect_timeout
        self.read_timeout = client.read_timeout
        self.idle_timeout = client.idle_timeout
        self.max_idle = client.max_idle
        self.host = u.hostname
        self.port = u.port or (443 if u.scheme == "https" else 80)
        self.ssl: ssl.SSLContext | None = (
            ssl.create_default_context() if u.scheme == "https" else None
        )
        self.prefix = u.path.rstrip("/")
        self.host_header = u.netloc.rsplit("@", 1)[-1]
        self.idle: list[_Connection] = []  # oldest first
        self.conns: set[_Connection] = set()
        self.closing = False

    def take(self) -> _Connection | None:
        idle = self.idle
        while idle:
            conn = idle.pop()
            if not conn.closed and conn.transport is not None and not conn.transport.is_closing():
                return conn
        return None

    def put(self, conn: _Connection) -> None:
        if self.closing or len(self.idle) >= self.max_idle:
            conn.close()
            return
        conn.idle_since = self.loop.time()
        self.idle.append(conn)

    def lost(self, conn: _Connection) -> None:
        self.conns.discard(conn)  # the idle list drops it on take() or sweep()

    async def connect(self) -> _Connection:
        try:
            async with asyncio.timeout(self.connect_timeout):
                _, conn = await self.loop.create_connection(
                    lambda: _Connection(self), self.host, self.port, ssl=self.ssl
                )
        except TimeoutError:
            raise UpstreamConnectTimeout(
                f"no connection to {self.name} within {self.connect_timeout:g}s"
            ) from None
        except OSError as exc:
            raise UpstreamConnectError(f"cannot connect to {self.name}: {exc}") from exc
        self.conns.add(conn)
        return conn

    def sweep(self, now: float) -> None:
        keep = []
        for conn in self.idle:
            if conn.closed:
                continue
            if now - conn.idle_since >= self.idle_timeout:
                conn.close()
            else:
                keep.append(conn)
        self.idle = keep

    def retire(self) -> None:
        """Close the idle connections; the busy ones close when their answer is in."""
        self.closing = True
        for conn in self.idle:
            conn.close()
        self.idle.clear()

    def close(self) -> None:
        self.retire()
        for conn in list(self.conns):
            conn.close()


class UpstreamClient:
    """Keep-alive HTTP/1.1 POSTs to backends named by base URL (http://host:port)."""

    def __init__(
        self,
        connect_timeout_s: float,
        read_timeout_s: float,
        *,
        idle_timeout_s: float = IDLE_TIMEOUT_S,
        max_idle: int = MAX_IDLE,
    ) -> None:
        self.connect_timeout = connect_timeout_s
        self.read_timeout = read_timeout_s
        self.idle_timeout = idle_timeout_s
        self.max_idle = max_idle
        self.loop = asyncio.get_running_loop()
        self._pools: dict[str, _Pool] = {}
        self._sweeper: asyncio.TimerHandle | None = None
        self.closed = False

    async def post(
        self, base_url: str, path: str, body: bytes, headers: Mapping[str, str]
    ) -> UpstreamResponse:
        """POST `body` to `base_url + path` with `headers` (plus Host and Content-Length) and
        return the answer once its headers are in. `headers` must not hold CR or LF (aiohttp's
        server parser refuses those in what we pass on)."""
        if self.closed:
            raise UpstreamConnectError("the upstream client is closed")
        for k, v in headers.items():
            if _CRLF.search(k) or _CRLF.search(v):
                raise ValueError(f"header {k!r} holds CR or LF")
        pool = self._pools.get(base_url)
        if pool is None:
            pool = self._pools[base_url] = _Pool(self, base_url)
            if self._sweeper is None:
                self._sweeper = self.loop.call_later(_SWEEP_S, self._sweep)
        head = "".join(
            [
                f"POST {pool.prefix}{path} HTTP/1.1\r\nHost: {pool.host_header}\r\n",
                *[f"{k}: {v}\r\n" for k, v in headers.items()],
                f"Content-Length: {len(body)}\r\n\r\n",
            ]
        )
        data = head.encode("utf-8", "surrogateescape") + body
        conn = pool.take()
        if conn is not None:
            try:
                return await conn.request(data)
            except UpstreamConnectError:
                pass  # a stale pooled connection; nothing came back, so once more on a new one
        conn = await pool.connect()
        return await conn.request(data)

    def _sweep(self) -> None:
        now = self.loop.time()
        for pool in self._pools.values():
            pool.sweep(now)
        self._sweeper = self.loop.call_later(_SWEEP_S, self._sweep)

    def forget(self, base_url: str) -> None:
        """Drop the pool of a backend that left or was ejected: its idle connections close
        now, the busy ones once their answer is in (requests in flight are not cut)."""
        pool = self._pools.pop(base_url, None)
        if pool is not None:
            pool.retire()

    async def close(self) -> None:
        self.closed = True
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        for pool in self._pools.values():
            pool.close()
        self._pools.clear()
        await asyncio.sleep(0)  # let the transports run their connection_lost
