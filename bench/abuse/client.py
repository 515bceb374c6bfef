"""The hostile client: HTTP/1.1 on a bare socket (a client library would refuse to send most of
the cases, or repair them), each case sent as written and its answers judged: the status
against the case's allowed ones, and what no answer may hold (routing details, an engine's
address, a traceback, more answers than requests)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import struct
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from .cases import CHAT, CRLF, Case, Ctx, chat, meets, post, text

# Where a request went is the router's secret: no answer may carry these.
ROUTING_HEADERS = ("x-routed-to", "x-route-reason")


@dataclass
class Response:
    status: int
    headers: list[tuple[str, str]]
    body: bytes

    def header(self, name: str) -> str | None:
        return next((v for k, v in self.headers if k.lower() == name), None)


@dataclass
class Reply:
    """What came back on one connection."""

    responses: list[Response] = field(default_factory=list)  # final (non-1xx) ones, in order
    interim: list[int] = field(default_factory=list)  # 1xx statuses (100 Continue)
    closed: bool = False  # the server ended the connection (EOF or reset)
    timed_out: bool = False  # we stopped waiting
    seconds: float = 0.0  # from the first byte sent to the reply (or to the close)
    answered: float | None = None  # from the first byte sent to the first whole answer
    partial: bytes = b""  # bytes of a response that did not complete

    @property
    def status(self) -> int | None:
        return self.responses[0].status if self.responses else None


def _chunked_end(buf: bytes, pos: int) -> tuple[bytes, int] | None:
    """The de-chunked body that starts at `pos` and where it ends, once it is complete."""
    out = bytearray()
    while (eol := buf.find(CRLF, pos)) >= 0:
        size = int(buf[pos:eol].split(b";")[0].strip() or b"0", 16)
        if size == 0:  # then trailers, ended by an empty line
            end = buf.find(CRLF + CRLF, eol)
            return None if end < 0 else (bytes(out), end + 4)
        if len(buf) < eol + 2 + size + 2:
            return None
        out += buf[eol + 2 : eol + 2 + size]
        pos = eol + 2 + size + 2
    return None


def parse_replies(buf: bytes, closed: bool, head: bool = False
                  ) -> tuple[list[Response], list[int], bytes]:
    """The complete responses in `buf`, the 1xx statuses before them, and the bytes left (an
    incomplete response). A response without framing ends where the connection does."""
    done: list[Response] = []
    interim: list[int] = []
    pos = 0
    while (end := buf.find(CRLF + CRLF, pos)) >= 0:
        first, *lines = buf[pos:end].split(CRLF)
        parts = first.split(b" ", 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/") or not parts[1].isdigit():
            raise ValueError(f"not a status line: {first[:80]!r}")
        status = int(parts[1])
        headers = [(k.decode("latin-1").strip(), v.decode("latin-1").strip())
                   for k, _, v in (line.partition(b":") for line in lines)]
        names = {k.lower(): v for k, v in headers}
        body_at, body = end + 4, None
        if 100 <= status < 200:
            interim.append(status)
        elif head or status in (204, 304):
            body = (b"", body_at)
        elif "chunked" in names.get("transfer-encoding", "").lower():
            body = _chunked_end(buf, body_at)
        elif "content-length" in names:
            n = int(names["content-length"])
            body = (buf[body_at : body_at + n], body_at + n) if len(buf) >= body_at + n else None
        elif closed:
            body = (buf[body_at:], len(buf))
        if 100 <= status < 200:
            pos = body_at
            continue
        if body is None:
            break
        done.append(Response(status, headers, body[0]))
        pos = body[1]
    return done, interim, buf[pos:]


def head_status(buf: bytes) -> int | None:
    """The status of the last response head in `buf` that is not a 1xx."""
    status = None
    for line in buf.split(CRLF):
        if line.startswith(b"HTTP/1.") and line[9:12].isdigit() and line[9:10] != b"1":
            status = int(line[9:12])
    return status


def _body_started(buf: bytes) -> bool:
    """Whether a byte of a final (non-1xx) response's body has come."""
    while (end := buf.find(CRLF + CRLF)) >= 0:
        if not (buf.startswith(b"HTTP/") and buf[9:10] == b"1"):
            return len(buf) > end + 4
        buf = buf[end + 4 :]
    return False


def _complete(buf: bytes, head: bool) -> bool:
    with contextlib.suppress(ValueError):
        return bool(parse_replies(buf, False, head)[0])
    return False


async def exchange(port: int, pieces: Sequence[bytes], *, gap: float = 0.0,
                   until: str = "reply", timeout: float = 30.0, head: bool = False,
                   rst: bool = False) -> Reply:
    """Send `pieces` (`gap` seconds apart) and read until (Case.until): "reply", a complete
    final response (or the close); "close", the server closes; "sent", nothing (leave as soon
    as the last piece is out); "first-body-byte", a response body begins (a client leaving
    mid-stream). `rst`: leave with a TCP reset instead of a FIN."""
    out = Reply()
    reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=2**20)
    if rst:
        writer.get_extra_info("socket").setsockopt(
            socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    buf = bytearray()
    started = time.monotonic()
    eof = asyncio.Event()

    async def send() -> None:
        for i, piece in enumerate(pieces):
            if i and gap:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(eof.wait(), gap)
            if eof.is_set():
                return
            writer.write(piece)
            await writer.drain()

    async def receive() -> None:
        while data := await reader.read(2**16):
            buf.extend(data)
            if out.answered is None and _complete(bytes(buf), head):
                out.answered = time.monotonic() - started
            if until == "reply" and out.answered is not None:
                return
            if until == "first-body-byte" and _body_started(bytes(buf)):
                return
        out.closed = True
        eof.set()

    sender = asyncio.create_task(send())
    try:
        async with asyncio.timeout(timeout):
            await (sender if until == "sent" else receive())
    except TimeoutError:
        out.timed_out = True
    except (ConnectionResetError, BrokenPipeError):
        out.closed = True
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


@dataclass
class Outcome:
    cls: str
    case: str
    status: str  # an HTTP status, or closed / left / timeout / refused
    seconds: float
    met: bool
    answered: float | None = None  # seconds to the first whole answer, where one came
    problems: list[str] = field(default_factory=list)  # what no answer may do
    notes: list[str] = field(default_factory=list)  # worth knowing, not wrong


def status_of(case: Case, reply: Reply) -> str:
    if case.until == "sent":
        return "left"
    if case.until == "first-body-byte":
        s = reply.status or head_status(reply.partial)
        return "left" if s in (None, 200) else str(s)
    if reply.responses:
        return str(reply.status)
    return "timeout" if reply.timed_out else "closed"


def answer_problems(reply: Reply, private: Sequence[str]) -> tuple[list[str], list[str]]:
    """What the answers on one connection must not hold (problems) and what is only worth
    noting. `private`: the addresses of the engines behind the router."""
    problems = [f"{len(reply.responses)} answers to one request"] * (len(reply.responses) > 1)
    notes = []
    for r in reply.responses:
        problems += [f"routing header {h}" for h in ROUTING_HEADERS if r.header(h) is not None]
        if (server := r.header("server")) is not None and server != "prefix-router":
            problems.append(f"Server: {server}")
        blob = r.body + "\n".join(f"{k}: {v}" for k, v in r.headers).encode("latin-1", "replace")
        if any(a.encode() in blob for a in private):
            problems.append("an engine's address in the answer")
        if b"Traceback" in r.body:
            problems.append("a traceback in the answer")
        if r.status >= 500:
            problems.append(f"{r.status} from the router")
        if r.status >= 400 and "json" not in (ctype := r.header("content-type") or ""):
            notes.append(f"{r.status} as {ctype or 'no content type'}")
    return problems, notes


def judge(case: Case, reply: Reply, private: Sequence[str]) -> Outcome:
    status = status_of(case, reply)
    problems, notes = answer_problems(reply, private)
    if case.close_within is not None:
        if not reply.closed:
            problems.append(f"still open after {reply.seconds:.1f}s")
        elif reply.seconds > case.close_within:
            problems.append(f"closed after {reply.seconds:.1f}s (bar {case.close_within:g}s)")
    if case.answer_within is not None and (reply.answered or 1e9) > case.answer_within:
        problems.append(f"answered after {reply.answered or reply.seconds:.1f}s "
                        f"(bar {case.answer_within:g}s)")
    if reply.interim and case.expect[0] in ("413", "417"):
        notes.append("100 Continue sent before the refusal")
    return Outcome(case.cls, case.name, status, round(reply.seconds, 3),
                   meets(status, case.expect),
                   None if reply.answered is None else round(reply.answered, 3), problems, notes)


async def send(case: Case, port: int, private: Sequence[str]) -> Outcome:
    try:
        reply = await exchange(port, case.pieces, gap=case.gap, until=case.until,
                               timeout=case.timeout, head=case.head, rst=case.rst)
    except OSError as exc:  # could not even connect
        return Outcome(case.cls, case.name, "refused", 0.0, False, None, [f"connect: {exc!r}"])
    return judge(case, reply, private)


async def run_cases(cases: Iterable[Case], port: int, private: Sequence[str],
                    parallel: int = 16) -> list[Outcome]:
    """Every case, each `repeat` times, at most `parallel` connections at once."""
    gate = asyncio.Semaphore(parallel)

    async def one(case: Case) -> Outcome:
        async with gate:
            return await send(case, port, private)

    return list(await asyncio.gather(*(one(c) for c in cases for _ in range(c.repeat))))


def check_probes(outcomes: list[Outcome], cases: Iterable[Case],
                 records: dict[int, dict[str, Any]]) -> None:
    """Judge the header probes by what reached the engines (the tap's records)."""
    by_name = {c.name: c for c in cases if c.probe is not None}
    for o in outcomes:
        if (c := by_name.get(o.case)) is not None and c.probe_check is not None:
            o.problems += c.probe_check(records.get(c.probe))  # type: ignore[arg-type]


async def tenant_probe(ctx: Ctx, url: str, rounds: int = 3) -> list[Outcome]:
    """Can a tenant learn from the cache what another sent? A prompt sent by tenant A (its
    gateway's salt), then by A again (a hit: the probe can see one), then by B naming A's
    salt in the body, then by a client without any salt: neither may hit A's cache."""
    out: list[Outcome] = []
    async with aiohttp.ClientSession() as s:
        for i in range(rounds):
            p = text(ctx, f"tenant-{i}", 4000)
            for step, salt, body_salt, want_hit in (
                    ("tenant A sends a prompt", "tenant-a", None, False),
                    ("tenant A again (a hit)", "tenant-a", None, True),
                    ("tenant B, naming A's salt in the body", "tenant-b", "tenant-a", False),
                    ("a client with no salt", None, None, False)):
                extra = {"cache_salt": body_salt} if body_salt else {}
                t0 = time.perf_counter()
                async with s.post(url + CHAT, json=chat(ctx, p, max_tokens=1, **extra),
                                  headers={"x-cache-salt": salt} if salt else {}) as r:
                    body = await r.read()
                problems = [f"routing header {h}" for h in ROUTING_HEADERS if h in r.headers]
                if r.status == 200:
                    usage = json.loads(body).get("usage") or {}
                    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
                    if want_hit and not cached:
                        problems.append("no hit for the same tenant: this probe cannot see hits")
                    if not want_hit and cached:
                        problems.append(f"{cached} tokens cached from another tenant's request")
                out.append(Outcome("tenant probing", step, str(r.status),
                                   round(time.perf_counter() - t0, 3), r.status == 200, None,
                                   problems))
    return out


async def control_trickle(ctx: Ctx, port: int, private: Sequence[str], stop: asyncio.Event,
                          period_s: float = 0.5) -> list[Outcome]:
    """Ordinary requests through the attack, one every `period_s`: service goes on."""
    out: list[Outcome] = []
    while not stop.is_set():
        body = json.dumps(chat(ctx, text(ctx, f"control-{(len(out) + 1) % 5}", 600))).encode()
        out.append(await send(Case("control (ordinary requests)", "a small chat request",
                                   (post(CHAT, body),), ("200",)), port, private))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), period_s)
    return out
