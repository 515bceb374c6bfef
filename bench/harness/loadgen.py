"""Open-loop load generator: Poisson session arrivals, streaming chat requests, TTFT per request.

Each request is sent with `stream: true`; TTFT is the time to the first SSE event that carries
content, e2e the time to `data: [DONE]`. Every request sent is logged in send order with the
answer it got, so the oracle can replay exactly the same sequence.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Literal

import aiohttp
import msgspec

from engine_sim.chat import render_chat

from .shapes import Shape
from .workloads import Session, Workload, messages_for, session_starts


@dataclass(slots=True)
class Result:
    session: int
    turn: int
    sent_at: float
    ttft: float | None
    e2e: float | None
    ok: bool
    status: int
    output_tokens: int
    cached_tokens: int | None
    prompt_tokens: int | None
    target: str
    error: str = ""


@dataclass
class RunLog:
    results: list[Result] = field(default_factory=list)
    sent: list[list[dict[str, str]]] = field(default_factory=list)  # messages, in send order
    # The answer to each request sent (same order), "" where none came whole: the simulators
    # cache a finished answer's blocks, so the oracle replays prompt and answer alike.
    answers: list[str] = field(default_factory=list)
    # Turns of the sessions started: those not in `sent` were never sent (a conversation
    # stops at its first failed turn; the drain timeout cuts the rest).
    planned: int = 0
    started: float = 0.0
    finished: float = 0.0


# chat: messages to /v1/chat/completions; completions: their rendered prompt to /v1/completions
Api = Literal["chat", "completions"]


class _Part(msgspec.Struct):
    content: str | None = None


class _Choice(msgspec.Struct):
    text: str | None = None  # completions
    delta: _Part | None = None  # chat


class _Details(msgspec.Struct):
    cached_tokens: int | None = None


class _Usage(msgspec.Struct):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    prompt_tokens_details: _Details | None = None


class _Error(msgspec.Struct):
    message: str | None = None


class _Event(msgspec.Struct):
    choices: list[_Choice] | None = None
    usage: _Usage | None = None
    # an error event: a router ends a stream its engine cut with one (then [DONE])
    error: _Error | None = None


# Typed: only the fields read here are built (an event holds a dozen more). Not strict: a
# number sent as a string or a float passes, as it did through the standard library's json.
_EVENT = msgspec.json.Decoder(_Event, strict=False)
_DONE = b"[DONE]"


def _content(event: _Event, api: Api) -> str:
    out = ""
    for ch in event.choices or ():
        piece = ch.text if api == "completions" else (ch.delta.content if ch.delta else None)
        if piece:
            out += piece
    return out


def _data(line: bytes) -> bytes | None:
    """The payload of an SSE `data:` line (CR, spaces stripped); None for any other line."""
    line = line.strip()
    return line[5:].strip() if line.startswith(b"data:") else None


def _first_content(buf: bytearray, start: int, api: Api) -> tuple[bool, int]:
    """(whether a data line from `start` on carries content, where the unread lines start)."""
    while True:
        nl = buf.find(b"\n", start)
        if nl < 0:
            return False, start
        data = _data(bytes(buf[start:nl]))
        start = nl + 1
        if data is not None and data != _DONE and _content(_EVENT.decode(data), api):
            return True, start


def _ends_done(buf: bytearray) -> bool:
    """Whether the last complete line read is `data: [DONE]` (in any of its spellings: CRLF,
    no space after the colon); what follows it is only the end of the body."""
    end = len(buf)
    while end and buf[end - 1] in b"\r\n":
        end -= 1
    if end == len(buf):
        return False  # the last line is not complete yet
    return _data(bytes(buf[max(buf.rfind(b"\n", 0, end) + 1, end - 64) : end])) == _DONE


def _read_events(raw: bytes, api: Api) -> tuple[bool, str, _Usage | None, str]:
    """(whether the stream ended with [DONE], the answer's text, the usage it reported, the
    message of an error event in it: "" if none, and the answer is then not whole)."""
    parts: list[str] = []
    usage = None
    error = ""
    for line in raw.split(b"\n"):
        data = _data(line)
        if data is None:
            continue
        if data == _DONE:
            return True, "".join(parts), usage, error
        event = _EVENT.decode(data)
        if event.error is not None:
            error = event.error.message or "error event"
        u = event.usage
        if u is not None and (u.prompt_tokens is not None or u.completion_tokens is not None):
            usage = u
        parts.append(_content(event, api))
    return False, "".join(parts), usage, error


async def _one(session_http: aiohttp.ClientSession, url: str, model: str,
               msgs: list[dict[str, str]], max_tokens: int, timeout: float,
               headers: dict[str, str] | None = None, api: Api = "chat") -> tuple[Result, str]:
    body: dict[str, object] = {"model": model, "max_tokens": max_tokens, "stream": True,
                               "stream_options": {"include_usage": True}, "temperature": 0}
    if api == "chat":
        body["messages"] = msgs
        path = "/v1/chat/completions"
    else:
        # The prompt the simulator's chat template makes of these messages: the engine sees
        # the same bytes either way, so a completions run is the same work as a chat run.
        body["prompt"] = render_chat(msgs)
        path = "/v1/completions"
    t0 = time.perf_counter()
    res = Result(0, 0, t0, None, None, False, 0, 0, None, None, url)
    answer = ""
    try:
        async with session_http.post(url + path, json=body, headers=headers,
                                     timeout=aiohttp.ClientTimeout(total=timeout)) as r:
            res.status = r.status
            if r.status != 200:
                res.error = (await r.text())[:200]
                return res, ""
            # The stream is read as the bytes come (one wake-up per read, not two line reads
            # per event) and only up to its first content event is parsed on the way, as that
            # stops the TTFT clock; the rest is parsed after the stream ends. So the client's
            # own CPU delays what it measures as little as it can (15-20 us of CPU a streamed
            # token under uvloop, bench/results/stream-cpu).
            buf = bytearray()
            unread = 0
            async for chunk in r.content.iter_any():
                buf += chunk
                if res.ttft is None:
                    found, unread = _first_content(buf, unread, api)
                    if found:
                        res.ttft = time.perf_counter() - t0
                if _ends_done(buf):
                    break
            e2e = time.perf_counter() - t0
            done, answer, usage, error = _read_events(bytes(buf), api)
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        res.error = repr(exc)
        return res, ""
    if usage is not None:
        res.prompt_tokens = usage.prompt_tokens
        res.output_tokens = usage.completion_tokens or 0
        if usage.prompt_tokens_details is not None:
            res.cached_tokens = usage.prompt_tokens_details.cached_tokens
    res.ok = done and res.ttft is not None and not error
    res.e2e = e2e if res.ok else None
    res.error = "" if res.ok else error or "stream ended without [DONE]"
    return res, answer if res.ok else ""


async def run_load(workload: Workload, targets: list[str], model: str, rate: float,
                   seconds: float, *, seed: int = 7, request_timeout: float = 300.0,
                   drain_timeout: float = 120.0, progress: bool = True,
                   session_header: str | None = None, session_id_offset: int = 0,
                   api: Api = "chat", shape: Shape | None = None) -> RunLog:
    """Send `workload` at `rate` requests/s for `seconds`, round-robin over `targets` per
    request (as a Service spreads connections over router replicas). `session_header`: one id
    per session (`session_id_offset` + its index) in that header. `shape`: the rate over
    the run (shapes.py)."""
    log = RunLog()
    starts = session_starts(workload, rate, seconds, seed, shape)
    rr = 0
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    async with aiohttp.ClientSession(connector=connector) as http:

        async def conversation(idx: int, s: Session) -> None:
            nonlocal rr
            answers: list[str] = []
            hdrs = {session_header: str(session_id_offset + idx)} if session_header else None
            for t, turn in enumerate(s.turns):
                msgs = messages_for(s, t, answers)
                target = targets[rr % len(targets)]
                rr += 1
                sent = len(log.sent)
                log.sent.append(msgs)
                log.answers.append("")
                res, answer = await _one(http, target, model, msgs, turn.max_tokens,
                                         request_timeout, hdrs, api)
                res.session, res.turn = idx, t
                log.results.append(res)
                if not res.ok:
                    return
                log.answers[sent] = answer
                answers.append(answer)

        tasks: list[asyncio.Task[None]] = []
        log.started = time.perf_counter()
        last_report = log.started
        for idx, (s, at) in enumerate(zip(workload.sessions, starts, strict=False)):
            delay = log.started + at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            log.planned += len(s.turns)
            tasks.append(asyncio.create_task(conversation(idx, s)))
            now = time.perf_counter()
            if progress and now - last_report > 10:
                last_report = now
                done = len(log.results)
                print(f"    t={now - log.started:5.0f}s sent={len(log.sent)} done={done} "
                      f"errors={sum(not r.ok for r in log.results)}", flush=True)
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=drain_timeout)
            for t in pending:
                t.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        log.finished = time.perf_counter()
    return log
