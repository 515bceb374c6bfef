"""An engine's answer as the proxy reads it, fed by its connection."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from .errors import UpstreamError

if TYPE_CHECKING:
    from .connection import Connection

# Body bytes waiting for a slow consumer above which the engine's socket is no longer read
# (TCP then slows the engine down); reading resumes when the consumer took them.
HIGH_WATER = 256 * 1024


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

    def __init__(self, conn: Connection) -> None:
        self.status = 0
        self.headers = Headers()
        self._loop = conn.loop
        self._conn: Connection | None = conn  # None once complete, failed or closed
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
            self._resume()
            await self._wait()
        return self._take()

    async def readany(self) -> bytes:
        """The body bytes that arrived since the last call (waiting for some); b"" at the end."""
        while not self._chunks:
            if self._error is not None:
                raise self._error
            if self._done:
                return b""
            await self._wait()
        return self._take()

    def _take(self) -> bytes:
        chunks = self._chunks
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        self._chunks = []
        self._size = 0
        self._resume()
        return data

    def _resume(self) -> None:
        conn = self._conn
        if conn is not None and conn.paused:
            conn.resume()

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
