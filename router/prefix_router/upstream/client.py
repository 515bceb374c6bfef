"""Keep-alive POSTs to the engines: one pool of connections per backend URL."""

from __future__ import annotations

import asyncio
import re
import ssl
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from .connection import Connection
from .errors import UpstreamConnectError, UpstreamConnectTimeout, UpstreamHung
from .response import UpstreamResponse

IDLE_TIMEOUT_S = 60.0
MAX_IDLE = 256  # idle connections kept per backend
_SWEEP_S = 10.0
_CRLF = re.compile(r"[\r\n]")


class Pool:
    """The connections to one backend (scheme://host:port[/prefix])."""

    def __init__(self, client: UpstreamClient, base_url: str) -> None:
        u = urlsplit(base_url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"not an http(s) URL: {base_url!r}")
        self.name = base_url
        self.client = client  # its timeouts and limits
        self.loop = client.loop
        self.host = u.hostname
        self.port = u.port or (443 if u.scheme == "https" else 80)
        self.ssl: ssl.SSLContext | None = (
            ssl.create_default_context() if u.scheme == "https" else None
        )
        self.prefix = u.path.rstrip("/")
        self.host_header = u.netloc.rsplit("@", 1)[-1]
        self.idle: list[Connection] = []  # oldest first
        self.conns: set[Connection] = set()
        self.closing = False

    def take(self) -> Connection | None:
        idle = self.idle
        while idle:
            conn = idle.pop()
            if not conn.closed and conn.transport is not None and not conn.transport.is_closing():
                return conn
        return None

    def put(self, conn: Connection) -> None:
        if self.closing or len(self.idle) >= self.client.max_idle:
            conn.close()
            return
        conn.idle_since = self.loop.time()
        self.idle.append(conn)

    def lost(self, conn: Connection) -> None:
        self.conns.discard(conn)  # the idle list drops it on take() or sweep()
        if self.closing and not self.conns:
            self.client.retired(self)

    async def connect(self) -> Connection:
        limit = self.client.connect_timeout
        try:
            async with asyncio.timeout(limit):
                _, conn = await self.loop.create_connection(
                    lambda: Connection(self), self.host, self.port, ssl=self.ssl
                )
        except TimeoutError:
            raise UpstreamConnectTimeout(
                f"no connection to {self.name} within {limit:g}s"
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
            if now - conn.idle_since >= self.client.idle_timeout:
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
        self._pools: dict[str, Pool] = {}
        # pools of backends that left or were ejected, until their last answer is in
        self._retiring: dict[str, set[Pool]] = {}
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
            pool = self._pools[base_url] = Pool(self, base_url)
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

    def sockets(self) -> list[Any]:
        """The sockets of the connections still open (for tests and debugging)."""
        socks = (c.transport.get_extra_info("socket") for p in self._pools.values()
                 for c in p.conns if c.transport is not None and not c.closed)
        return [s for s in socks if s is not None]

    def forget(self, base_url: str) -> None:
        """Drop the pool of a backend that left or was ejected: its idle connections close
        now, the busy ones once their answer is in (requests in flight are not cut)."""
        pool = self._pools.pop(base_url, None)
        if pool is not None:
            pool.retire()
            if pool.conns:
                self._retiring.setdefault(base_url, set()).add(pool)

    def retired(self, pool: Pool) -> None:
        """`pool`'s last busy connection is gone."""
        left = self._retiring.get(pool.name)
        if left is not None:
            left.discard(pool)
            if not left:
                del self._retiring[pool.name]

    def abort(self, base_url: str, why: str) -> None:
        """Cut every request in flight to a backend that hangs: each fails with UpstreamHung,
        its connection closed (so the engine, if it ever wakes, drops it)."""
        pools = [*self._retiring.get(base_url, ()), *filter(None, [self._pools.get(base_url)])]
        for pool in pools:
            for conn in list(pool.conns):
                conn.fail(UpstreamHung(f"{base_url} hangs: {why}"))

    async def close(self) -> None:
        self.closed = True
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        for pool in self._pools.values():
            pool.close()
        self._pools.clear()
        await asyncio.sleep(0)  # let the transports run their connection_lost
