"""One keep-alive TCP connection to an engine, its bytes fed to httptools' parser."""

from __future__ import annotations

import asyncio
import socket
from typing import TYPE_CHECKING

import httptools

from .errors import MAX_HEADER_BYTES, UpstreamConnectError, UpstreamError, UpstreamTimeout
from .response import UpstreamResponse

if TYPE_CHECKING:
    from .client import Pool


class Connection(asyncio.Protocol):
    """One TCP connection; at most one response in flight on it."""

    def __init__(self, pool: Pool) -> None:
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
        self.timer = self.loop.call_at(self.last_data + self.pool.client.read_timeout, self._check)
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
        limit = self.pool.client.read_timeout
        due = now + limit if self.paused else self.last_data + limit
        if due > now:
            self.timer = self.loop.call_at(due, self._check)
            return
        self._fail(UpstreamTimeout(f"{self.pool.name} sent nothing for {limit:g}s"))

    def fail(self, exc: BaseException) -> None:
        """The answer in flight (if any) ends with `exc`; the connection closes, so the engine
        learns the request is abandoned."""
        self._fail(exc)

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
