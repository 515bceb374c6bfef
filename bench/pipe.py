"""A byte pipe: accepts TCP connections and copies bytes both ways to one target, nothing else.

The floor of any extra hop written in Python on this host (two more loopback traversals, one
more process to wake up), for `bench first-chunk` to set the router beside. uvloop and
TCP_NODELAY, as the router runs. `python -m bench.pipe --port P --target HOST:PORT`.
"""

from __future__ import annotations

import argparse
import asyncio
import socket


class _Half(asyncio.Protocol):
    """One side of a piped connection; what it receives is written to its peer."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.peer: _Half | None = None
        self.pending: list[bytes] = []  # bytes that came before the peer was connected

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        peer = self.peer
        if peer is not None and peer.transport is not None:
            peer.transport.write(data)
        else:
            self.pending.append(data)

    def connection_lost(self, exc: Exception | None) -> None:
        peer = self.peer
        if peer is not None and peer.transport is not None:
            peer.transport.close()


async def serve(port: int, host: str, target_port: int) -> None:
    loop = asyncio.get_running_loop()
    connecting: set[asyncio.Task[None]] = set()  # strong references until each is done

    def accept() -> _Half:
        front = _Half()

        async def connect() -> None:
            try:
                _, back = await loop.create_connection(_Half, host, target_port)
            except OSError:
                if front.transport is not None:
                    front.transport.close()
                return
            back.peer, front.peer = front, back
            assert back.transport is not None
            for data in front.pending:
                back.transport.write(data)
            front.pending.clear()

        task = loop.create_task(connect())
        connecting.add(task)
        task.add_done_callback(connecting.discard)
        return front

    server = await loop.create_server(accept, "127.0.0.1", port, backlog=1024)
    async with server:
        await server.serve_forever()


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.pipe")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--target", required=True, help="host:port")
    a = p.parse_args()
    host, _, port = a.target.rpartition(":")
    import uvloop

    uvloop.install()
    asyncio.run(serve(a.port, host or "127.0.0.1", int(port)))


if __name__ == "__main__":
    main()
