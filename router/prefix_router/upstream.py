"""The upstream client: keep-alive HTTP/1.1 POSTs to the engines, on aiohttp's ClientSession.

What the proxy needs of it, and no more: `post()` returns once the answer's status and headers
are in; the body then comes whole (`read()`) or as it arrives (`chunks()`); `close()` on an
answer still arriving closes its connection, which makes the engine abort the request.
Failures are sorted by what the proxy may do next:
  UpstreamConnectError    the request never reached the engine, or the connection closed
                          before any byte of an answer: another engine may serve it
  UpstreamConnectTimeout  no connection within the connect timeout (the same)
  UpstreamTimeout         sent, and no byte for the read timeout: the engine may still be
                          working on it, so it is not sent again
  UpstreamError           the answer was cut short or malformed
Retry policy for these non-idempotent POSTs: aiohttp resends nothing by itself (its retry of
a request on a reused connection covers idempotent methods only); the proxy sends a request
to the next engine only when the engine cannot have answered it (the cases above that say
so), since an engine that loses a request's connection aborts it.
"""

from __future__ import annotations

import socket
import weakref
from collections.abc import AsyncIterator, Mapping
from typing import Protocol

import aiohttp
from aiohappyeyeballs import AddrInfoType

# Idle keep-alive connections to an engine close after this long.
KEEPALIVE_S = 60.0
# An engine's response header line longer than this is refused as malformed (aiohttp's own
# default is 8 KiB, and the router passes on only a few short headers).
MAX_HEADER_BYTES = 8190


class UpstreamError(Exception):
    """The engine's answer was cut short or malformed."""


class UpstreamConnectError(UpstreamError):
    """No connection to the engine, or it closed before any byte of the answer."""


class UpstreamTimeout(TimeoutError):
    """No byte from the engine within the read timeout."""


class UpstreamConnectTimeout(UpstreamTimeout):
    """No connection within the connect timeout: the request never reached the engine."""


class UpstreamResponse(Protocol):
    status: int

    @property
    def headers(self) -> Mapping[str, str]: ...
    async def read(self) -> bytes: ...
    def chunks(self) -> AsyncIterator[bytes]: ...
    def close(self) -> None: ...


class Upstream(Protocol):
    async def post(
        self, base_url: str, path: str, body: bytes, headers: Mapping[str, str]
    ) -> UpstreamResponse: ...
    def forget(self, base_url: str) -> None: ...
    async def close(self) -> None: ...


class _Answer:
    """An aiohttp ClientResponse seen through the errors above."""

    __slots__ = ("_resp", "status")

    def __init__(self, resp: aiohttp.ClientResponse) -> None:
        self._resp = resp
        self.status = resp.status

    @property
    def headers(self) -> Mapping[str, str]:
        return self._resp.headers

    async def read(self) -> bytes:
        try:
            return await self._resp.read()
        except TimeoutError as exc:
            raise UpstreamTimeout(str(exc) or "no byte within the read timeout") from None
        except aiohttp.ClientError as exc:
            raise UpstreamError(f"{type(exc).__name__}: {exc}") from None

    async def chunks(self) -> AsyncIterator[bytes]:
        it = self._resp.content.iter_any().__aiter__()
        while True:
            try:
                data = await it.__anext__()
            except StopAsyncIteration:
                return
            except TimeoutError as exc:
                raise UpstreamTimeout(str(exc) or "no byte within the read timeout") from None
            except aiohttp.ClientError as exc:
                raise UpstreamError(f"{type(exc).__name__}: {exc}") from None
            yield data

    def close(self) -> None:
        self._resp.close()


class AiohttpUpstream:
    """One ClientSession for all engines: a keep-alive pool per host, TCP_NODELAY on every
    socket (made here, so it does not rest on a library default), no body decompression (the
    bytes pass through as the engine sent them)."""

    def __init__(self, connect_timeout_s: float, read_timeout_s: float) -> None:
        self._sockets: weakref.WeakSet[socket.socket] = weakref.WeakSet()
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(
                limit=0, limit_per_host=0, keepalive_timeout=KEEPALIVE_S,
                socket_factory=self._socket,
            ),
            timeout=aiohttp.ClientTimeout(
                total=None, sock_connect=connect_timeout_s, sock_read=read_timeout_s
            ),
            auto_decompress=False,
            # the router passes the client's headers on; it adds none of its own
            skip_auto_headers=("User-Agent", "Accept-Encoding", "Content-Type"),
            max_line_size=MAX_HEADER_BYTES,
            max_field_size=MAX_HEADER_BYTES,
        )

    async def post(
        self, base_url: str, path: str, body: bytes, headers: Mapping[str, str]
    ) -> _Answer:
        try:
            resp = await self._session.post(
                base_url + path, data=body, headers=headers, allow_redirects=False
            )
        except aiohttp.ConnectionTimeoutError as exc:
            raise UpstreamConnectTimeout(f"no connection to {base_url}: {exc}") from None
        except TimeoutError as exc:
            raise UpstreamTimeout(f"{base_url} sent nothing: {exc}") from None
        except aiohttp.ClientResponseError as exc:  # a malformed status line or headers
            raise UpstreamError(f"malformed answer from {base_url}: {exc}") from None
        except (aiohttp.ClientError, OSError) as exc:
            # refused, reset, or closed before any byte of an answer
            raise UpstreamConnectError(f"{base_url}: {type(exc).__name__}: {exc}") from None
        return _Answer(resp)

    def _socket(self, addr: AddrInfoType) -> socket.socket:
        family, kind, proto, _name, _address = addr
        sock = socket.socket(family, kind, proto)
        # each token is a small write that must leave at once, not wait for an ACK (Nagle)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sockets.add(sock)
        return sock

    def sockets(self) -> list[socket.socket]:
        """The sockets this client opened that are still alive (for tests and debugging)."""
        return [s for s in self._sockets if s.fileno() >= 0]

    def forget(self, base_url: str) -> None:
        """Nothing to do: idle connections to an engine that left close on their keep-alive
        timeout, and requests in flight there are not cut."""

    async def close(self) -> None:
        await self._session.close()
