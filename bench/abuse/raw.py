"""HTTP/1.1 on a bare socket: requests sent byte for byte as written (malformed on purpose,
a piece at a time, or abandoned half way), and the server's replies read back as they come.

A client library would refuse to send most of what the abuse run sends, or would repair it.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

CRLF = b"\r\n"


@dataclass
class Response:
    status: int
    headers: list[tuple[str, str]]
    body: bytes

    def header(self, name: str) -> str | None:
        name = name.lower()
        return next((v for k, v in self.headers if k.lower() == name), None)


@dataclass
class Reply:
    """What came back on one connection."""

    responses: list[Response] = field(default_factory=list)  # final (non-1xx) ones, in order
    interim: list[int] = field(default_factory=list)  # 1xx statuses (100 Continue)
    closed: bool = False  # the server ended the connection (EOF or reset)
    reset: bool = False
    timed_out: bool = False  # we stopped waiting
    seconds: float = 0.0  # from the first byte sent to the reply (or to the close)
    answered: float | None = None  # from the first byte sent to the first whole answer
    partial: bytes = b""  # bytes of a response that did not complete

    @property
    def status(self) -> int | None:
        return self.responses[0].status if self.responses else None

    @property
    def first(self) -> Response | None:
        return self.responses[0] if self.responses else None


def request(method: str, path: str, headers: Sequence[tuple[str, str]] = (),
            body: bytes = b"", *, version: str = "HTTP/1.1", length: bool = True) -> bytes:
    """One request's bytes; Content-Length is added for a body unless `length` is false."""
    lines = [f"{method} {path} {version}".encode()]
    lines += [f"{k}: {v}".encode("latin-1") for k, v in headers]
    if body and length:
        lines.append(b"Content-Length: %d" % len(body))
    return CRLF.join(lines) + CRLF + CRLF + body


def chunked(body: bytes, size: int = 65536) -> bytes:
    """`body` in the chunked transfer coding, ended."""
    out = bytearray()
    for i in range(0, len(body), size):
        piece = body[i : i + size]
        out += b"%x\r\n" % len(piece) + piece + CRLF
    return bytes(out + b"0\r\n\r\n")


def _head(block: bytes) -> tuple[int, list[tuple[str, str]]]:
    lines = block.split(CRLF)
    parts = lines[0].split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/") or not parts[1].isdigit():
        raise ValueError(f"not a status line: {lines[0][:80]!r}")
    headers = []
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        headers.append((name.decode("latin-1").strip(), value.decode("latin-1").strip()))
    return int(parts[1]), headers


def _chunked_end(buf: bytes, start: int) -> tuple[bytes, int] | None:
    """The de-chunked body that starts at `start` and where it ends, once it is complete."""
    out = bytearray()
    pos = start
    while True:
        eol = buf.find(CRLF, pos)
        if eol < 0:
            return None
        size = int(buf[pos:eol].split(b";")[0].strip() or b"0", 16)
        if size == 0:  # then trailers, ended by an empty line
            end = buf.find(CRLF + CRLF, eol)
            return None if end < 0 else (bytes(out), end + 4)
        if len(buf) < eol + 2 + size + 2:
            return None
        out += buf[eol + 2 : eol + 2 + size]
        pos = eol + 2 + size + 2


def parse_replies(buf: bytes, closed: bool, head: bool = False
                  ) -> tuple[list[Response], list[int], bytes]:
    """The complete responses in `buf`, the 1xx statuses before them, and the bytes left (an
    incomplete response). A response without framing ends where the connection does."""
    done: list[Response] = []
    interim: list[int] = []
    pos = 0
    while pos < len(buf):
        end = buf.find(CRLF + CRLF, pos)
        if end < 0:
            break
        status, headers = _head(buf[pos:end])
        body_at = end + 4
        if 100 <= status < 200:
            interim.append(status)
            pos = body_at
            continue
        names = {k.lower(): v for k, v in headers}
        if head or status in (204, 304):
            done.append(Response(status, headers, b""))
            pos = body_at
        elif "chunked" in names.get("transfer-encoding", "").lower():
            got = _chunked_end(buf, body_at)
            if got is None:
                break
            done.append(Response(status, headers, got[0]))
            pos = got[1]
        elif "content-length" in names:
            n = int(names["content-length"])
            if len(buf) < body_at + n:
                break
            done.append(Response(status, headers, buf[body_at : body_at + n]))
            pos = body_at + n
        else:
            if not closed:
                break
            done.append(Response(status, headers, buf[body_at:]))
            pos = len(buf)
    return done, interim, buf[pos:]


Until = Literal["reply", "close", "sent", "first-body-byte"]


async def exchange(port: int, pieces: Sequence[bytes], *, gap: float = 0.0,
                   until: Until = "reply", timeout: float = 30.0, head: bool = False,
                   rst: bool = False, host: str = "127.0.0.1") -> Reply:
    """Send `pieces` (`gap` seconds apart) and read until:
    reply: a complete final response (or the close); close: the server closes;
    sent: nothing (leave as soon as the last piece is out);
    first-body-byte: the first byte of a response body (a client leaving mid-stream).
    `rst`: leave with a TCP reset instead of a FIN."""
    out = Reply()
    reader, writer = await asyncio.open_connection(host, port, limit=2**20)
    if rst:
        writer.get_extra_info("socket").setsockopt(
            socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    buf = bytearray()
    started = time.monotonic()
    eof = asyncio.Event()

    async def send() -> None:
        for i, piece in enumerate(pieces):
            if eof.is_set():
                return
            if i and gap:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(eof.wait(), gap)
                if eof.is_set():
                    return
            writer.write(piece)
            await writer.drain()

    async def receive() -> None:
        while True:
            data = await reader.read(2**16)
            if not data:
                out.closed = True
                eof.set()
                return
            buf.extend(data)
            if out.answered is None and _complete(bytes(buf), head):
                out.answered = time.monotonic() - started
            if until == "reply" and out.answered is not None:
                return
            if until == "first-body-byte" and _body_started(bytes(buf)):
                return

    sender = asyncio.create_task(send())
    try:
        async with asyncio.timeout(timeout):
            if until == "sent":
                await sender
            else:
                await receive()
    except TimeoutError:
        out.timed_out = True
    except (ConnectionResetError, BrokenPipeError):
        out.closed = out.reset = True
    finally:
        out.seconds = time.monotonic() - started
        sender.cancel()
        with contextlib.suppress(asyncio.CancelledError, ConnectionError, OSError):
            await sender
        writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await writer.wait_closed()
    if sender.done() and not sender.cancelled() and isinstance(sender.exception(), OSError):
        out.closed = True  # the server closed while we were still sending
    try:
        out.responses, out.interim, out.partial = parse_replies(bytes(buf), out.closed, head)
    except ValueError:
        out.partial = bytes(buf)
    return out


def _complete(buf: bytes, head: bool) -> bool:
    try:
        return bool(parse_replies(buf, False, head)[0])
    except ValueError:
        return False


def _body_started(buf: bytes) -> bool:
    end = buf.find(CRLF + CRLF)
    while end >= 0:
        status = buf[9:12] if buf.startswith(b"HTTP/") else b""
        if not status.startswith(b"1"):
            return len(buf) > end + 4
        buf = buf[end + 4 :]
        end = buf.find(CRLF + CRLF)
    return False
