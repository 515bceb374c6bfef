"""Send the cases (cases.py) and judge each answer: the status against the case's allowed
ones, and what no answer may hold (routing details, an engine's address, a traceback, more
answers than requests); the probes that need a sequence of requests (tenants' caches)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from .cases import CHAT, Case, Ctx, chat, meets, post, text
from .raw import Reply, exchange

# The connection the router answers on is not where a probe looks for leaks: these are the
# addresses of what stands behind it.
ROUTING_HEADERS = ("x-routed-to", "x-route-reason")


@dataclass
class Outcome:
    cls: str
    case: str
    status: str  # an HTTP status, or closed / left / timeout
    seconds: float
    met: bool
    answered: float | None = None  # seconds to the first whole answer, where one came
    problems: list[str] = field(default_factory=list)  # what no answer may do
    notes: list[str] = field(default_factory=list)  # worth knowing, not wrong


def head_status(buf: bytes) -> int | None:
    """The status of the last response head in `buf` that is not a 1xx."""
    status = None
    for line in buf.split(b"\r\n"):
        if line.startswith(b"HTTP/1.") and line[9:12].isdigit() and line[9:10] != b"1":
            status = int(line[9:12])
    return status


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
    problems: list[str] = []
    notes: list[str] = []
    if len(reply.responses) > 1:
        problems.append(f"{len(reply.responses)} answers to one request")
    for r in reply.responses:
        for h in ROUTING_HEADERS:
            if r.header(h) is not None:
                problems.append(f"routing header {h}")
        server = r.header("server")
        if server is not None and server != "prefix-router":
            problems.append(f"Server: {server}")
        blob = r.body + "\n".join(f"{k}: {v}" for k, v in r.headers).encode("latin-1", "replace")
        if any(a.encode() in blob for a in private):
            problems.append("an engine's address in the answer")
        if b"Traceback" in r.body:
            problems.append("a traceback in the answer")
        if r.status >= 500:
            problems.append(f"{r.status} from the router")
        ctype = r.header("content-type") or ""
        if r.status >= 400 and "json" not in ctype:
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
        c = by_name.get(o.case)
        if c is not None and c.probe_check is not None:
            o.problems += c.probe_check(records.get(c.probe))  # type: ignore[arg-type]


async def tenant_probe(ctx: Ctx, url: str, rounds: int = 3) -> list[Outcome]:
    """Can a tenant learn from the cache what another sent? A prompt sent by tenant A (its
    gateway's salt), then by A again (a hit: the probe can see one), then by B naming A's
    salt in the body, then by a client without any salt: neither may hit A's cache."""
    out: list[Outcome] = []
    async with aiohttp.ClientSession() as s:

        async def ask(step: str, salt: str | None, body_salt: str | None, prompt: str,
                      want_hit: bool) -> None:
            extra = {"cache_salt": body_salt} if body_salt else {}
            headers = {"x-cache-salt": salt} if salt else {}
            t0 = time.perf_counter()
            async with s.post(url + CHAT, json=chat(ctx, prompt, max_tokens=1, **extra),
                              headers=headers) as r:
                body = await r.read()
                status, hdrs = r.status, r.headers
            problems = [f"routing header {h}" for h in ROUTING_HEADERS if h in hdrs]
            cached = None
            if status == 200:
                usage = json.loads(body).get("usage") or {}
                cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
                if want_hit and not cached:
                    problems.append("no hit for the same tenant: this probe cannot see hits")
                if not want_hit and cached:
                    problems.append(f"{cached} tokens cached from another tenant's request")
            out.append(Outcome("tenant probing", step, str(status),
                               round(time.perf_counter() - t0, 3), status == 200, None, problems))

        for i in range(rounds):
            p = text(ctx, f"tenant-{i}", 4000)
            await ask("tenant A sends a prompt", "tenant-a", None, p, False)
            await ask("tenant A again (a hit)", "tenant-a", None, p, True)
            await ask("tenant B, naming A's salt in the body", "tenant-b", "tenant-a", p, False)
            await ask("a client with no salt", None, None, p, False)
    return out


class Canary:
    """A port only the bench listens on: no client may make the router connect to it."""

    def __init__(self) -> None:
        self.hits = 0
        self.server: asyncio.Server | None = None
        self.port = 0

    async def start(self) -> int:
        async def on(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.hits += 1
            writer.close()

        self.server = await asyncio.start_server(on, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self.port

    async def close(self) -> None:
        if self.server:
            self.server.close()
            with contextlib.suppress(Exception):
                await self.server.wait_closed()


async def control_trickle(ctx: Ctx, port: int, private: Sequence[str], stop: asyncio.Event,
                          period_s: float = 0.5) -> list[Outcome]:
    """Ordinary requests through the attack, one every `period_s`: service goes on."""
    out = []
    i = 0
    while not stop.is_set():
        i += 1
        c = Case("control (ordinary requests)", "a small chat request",
                 (post(CHAT, json.dumps(chat(ctx, text(ctx, f"control-{i % 5}", 600))).encode()),),
                 ("200",))
        out.append(await send(c, port, private))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), period_s)
    return out
