"""The hostile client: HTTP/1.1 on a bare socket (a client library would refuse to send most
cases, or repair them), and the judge of what came back."""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from .cases import Case

ROUTING_HEADERS = ("x-routed-to", "x-route-reason")  # where a request went is the router's secret
HEAD = re.compile(rb"HTTP/1\.\d ([2-5]\d\d)[^\r\n]*((?:\r\n[^\r\n]+)*)\r\n\r\n")  # final
# The known exception (docs/router-http.md): a request aiohttp's HTTP parser refuses is answered
# by aiohttp itself, in text/plain, naming its version; aiohttp has no public hook for it.
AIOHTTP_ITSELF = re.compile(r"Python/[\d.]+ aiohttp/[\d.]+")
KNOWN = "aiohttp's parser answered itself (docs/router-http.md)"


@dataclass
class Answer:
    status: int
    headers: dict[str, str]  # names in lower case
    body: bytes  # as far as its Content-Length says, else to the close
    whole: bool  # as long as its Content-Length says


def first_answer(raw: bytes) -> Answer | None:
    if not (m := HEAD.search(raw)):
        return None
    h = {k.strip().lower().decode("latin-1"): v.strip().decode("latin-1")
         for k, _, v in (line.partition(b":") for line in m[2].split(b"\r\n")[1:])}
    n = int(h["content-length"]) if h.get("content-length", "").isdigit() else None
    body = raw[m.end():][:n]
    return Answer(int(m[1]), h, body, n is not None and len(body) == n)


@dataclass
class Outcome:
    cls: str
    case: str
    status: str  # an HTTP status, or closed / left / timeout / refused
    met: bool  # a status the case allows
    problems: list[str] = field(default_factory=list)  # what no answer may do
    notes: list[str] = field(default_factory=list)  # worth knowing, not wrong
    known: list[str] = field(default_factory=list)  # the documented exception (KNOWN)


async def exchange(port: int, case: Case) -> tuple[bytes, bool, float]:
    """Send the case's pieces (`gap` apart) and read until what it waits for: a whole answer
    (or the close), the close, nothing ("sent"), or the first byte of an answer's body.
    Returns what came, whether the router closed, and the seconds it took."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=2**20)
    raw, closed, t0 = b"", False, time.monotonic()

    async def send() -> None:
        for i, piece in enumerate(case.pieces):
            if i and case.gap:
                await asyncio.sleep(case.gap)
            writer.write(piece)
            await writer.drain()

    async def receive() -> None:
        nonlocal raw, closed
        while data := await reader.read(2**16):
            raw += data
            a = first_answer(raw)
            if a and ((case.until == "reply" and a.whole) or
                      (case.until == "first-body-byte" and a.body)):
                return
        closed = True

    sender = asyncio.create_task(send())
    try:
        async with asyncio.timeout((case.close_within or 20) + 10):
            await (sender if case.until == "sent" else receive())
    except TimeoutError:
        pass
    except OSError:  # reset
        closed = True
    if sender.done() and not sender.cancelled() and isinstance(sender.exception(), OSError):
        closed = True  # the router closed while the client was still sending
    sender.cancel()
    writer.close()
    with contextlib.suppress(OSError, asyncio.CancelledError):
        await asyncio.gather(sender, writer.wait_closed())
    return raw, closed, time.monotonic() - t0


def judge(case: Case, raw: bytes, closed: bool, seconds: float, private: Sequence[str]
          ) -> Outcome:
    """The status against the case's, and what no answer may hold: routing details, an
    engine's address (`private`), a server version, a traceback."""
    a = first_answer(raw)
    status = str(a.status) if a else "closed" if closed else "timeout"
    if case.until == "sent" or (case.until == "first-body-byte" and status in ("200", "closed")):
        status = "left"
    o = Outcome(case.cls, case.name, status, status in case.expect)
    if a is not None:
        o.problems += [f"routing header {h}" for h in ROUTING_HEADERS if h in a.headers]
        itself = a.status == 400 and AIOHTTP_ITSELF.fullmatch(a.headers.get("server", ""))
        if itself:
            o.known.append(KNOWN)
        elif a.headers.get("server", "prefix-router") != "prefix-router":
            o.problems.append(f"Server: {a.headers['server']}")
        if any(p.encode() in a.body + repr(a.headers).encode() for p in private):
            o.problems.append("an engine's address in the answer")
        if b"Traceback" in a.body:
            o.problems.append("a traceback in the answer")
        if not itself and a.status >= 400 and "json" not in (
                ctype := a.headers.get("content-type", "none")):
            o.notes.append(f"{a.status} as {ctype}")
    if case.close_within is not None and not (closed and seconds <= case.close_within):
        o.problems.append(f"{'closed' if closed else 'still open'} after {seconds:.1f}s "
                          f"(bar {case.close_within:g}s)")
    return o


async def run_cases(cases: Sequence[Case], port: int, private: Sequence[str],
                    parallel: int = 16) -> list[Outcome]:
    """Every case, each `repeat` times, at most `parallel` connections at once."""
    gate = asyncio.Semaphore(parallel)

    async def one(case: Case) -> Outcome:
        async with gate:
            try:
                return judge(case, *await exchange(port, case), private)
            except OSError as exc:  # could not even connect
                return Outcome(case.cls, case.name, "refused", False, [repr(exc)])

    return list(await asyncio.gather(*(one(c) for c in cases for _ in range(c.repeat))))
