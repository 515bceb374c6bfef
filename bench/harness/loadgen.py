"""Open-loop load generator: Poisson session arrivals, streaming requests, TTFT (to the first
event with content) and e2e (to `data: [DONE]`) per request. Every request sent is logged in
send order with its answer, so the oracle can replay exactly the same sequence."""

import asyncio
import itertools
import time
from dataclasses import dataclass, field
from typing import Any

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
    output_tokens: int
    prompt_tokens: int | None
    error: str = ""


@dataclass
class RunLog:
    results: list[Result] = field(default_factory=list)
    sent: list[list[dict[str, Any]]] = field(default_factory=list)  # messages, in send order
    tools: list[list[dict[str, Any]] | None] = field(default_factory=list)  # of each sent
    answers: list[str] = field(default_factory=list)  # of each sent, "" where none came whole
    planned: int = 0  # turns of the sessions started (a conversation stops at a failed turn)
    started: float = 0.0
    finished: float = 0.0


class _Part(msgspec.Struct):
    content: str | None = None


class _Choice(msgspec.Struct):
    text: str | None = None  # completions
    delta: _Part | None = None  # chat


class _Usage(msgspec.Struct):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


class _Error(msgspec.Struct):
    message: str | None = None


class _Event(msgspec.Struct):
    choices: list[_Choice] | None = None
    usage: _Usage | None = None
    error: _Error | None = None  # a router ends a stream its engine cut with one


# Only the fields read are built. Not strict: a number sent as a string or float passes.
_EVENT = msgspec.json.Decoder(_Event, strict=False)
_DONE = b"[DONE]"


def _content(event: _Event, api: str) -> str:
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


def _first_content(buf: bytearray, start: int, api: str) -> tuple[bool, int]:
    """(whether a data line from `start` on carries content, where the unread lines start)."""
    while (nl := buf.find(b"\n", start)) >= 0:
        data = _data(bytes(buf[start:nl]))
        start = nl + 1
        if data is not None and data != _DONE and _content(_EVENT.decode(data), api):
            return True, start
    return False, start


def _ends_done(buf: bytearray) -> bool:
    """Whether the last complete line is `data: [DONE]` (CRLF or not, a space or not)."""
    end = len(buf)
    while end and buf[end - 1] in b"\r\n":
        end -= 1
    if end == len(buf):
        return False  # the last line is not complete yet
    return _data(bytes(buf[max(buf.rfind(b"\n", 0, end) + 1, end - 64) : end])) == _DONE


def _read_events(raw: bytes, api: str) -> tuple[bool, str, _Usage | None, str]:
    """(whether the stream ended with [DONE], the answer, the usage, an error event's message)."""
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


async def _one(http: aiohttp.ClientSession, url: str, model: str, msgs: list[dict[str, Any]],
               max_tokens: int, timeout: float, headers: dict[str, str] | None,
               api: str, tools: list[dict[str, Any]] | None = None) -> tuple[Result, str]:
    body: dict[str, object] = {"model": model, "max_tokens": max_tokens, "stream": True,
                               "stream_options": {"include_usage": True}, "temperature": 0}
    if api == "chat":
        body["messages"] = msgs
        if tools is not None:
            body["tools"] = tools
    else:  # the prompt the simulator's chat template makes: the engine sees the same bytes
        body["prompt"] = render_chat(msgs)
    path = "/v1/chat/completions" if api == "chat" else "/v1/completions"
    t0 = time.perf_counter()
    res = Result(0, 0, t0, None, None, False, 0, None)
    try:
        async with http.post(url + path, json=body, headers=headers,
                             timeout=aiohttp.ClientTimeout(total=timeout)) as r:
            if r.status != 200:
                res.error = (await r.text())[:200]
                return res, ""
            # Read as the bytes come (one wake-up a read) and parsed on the way only up to the
            # first content, which stops the TTFT clock; the rest after the stream ends. So the
            # client's own CPU delays what it measures as little as it can (stream-cpu).
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
    res.ok = done and res.ttft is not None and not error
    res.e2e = e2e if res.ok else None
    res.error = "" if res.ok else error or "stream ended without [DONE]"
    return res, answer if res.ok else ""


async def run_load(workload: Workload, targets: list[str], model: str, rate: float,
                   seconds: float, *, seed: int = 7, request_timeout: float = 300.0,
                   drain_timeout: float = 120.0, progress: bool = True,
                   session_header: str | None = None, session_id_offset: int = 0,
                   api: str = "chat", shape: Shape | None = None,
                   stop: asyncio.Event | None = None) -> RunLog:
    """Send `workload` at `rate` requests/s (times the `shape`) for `seconds`, round-robin over
    `targets` a request as a Service spreads connections; `session_header`: one id a session
    (its index + `session_id_offset`); `api` "completions": the rendered prompt. `targets` is
    read at each request, so the caller may change it meanwhile (a Service's endpoints);
    `stop` set: no new session starts (those under way finish)."""
    log = RunLog()
    starts = session_starts(workload, rate, seconds, seed, shape)
    turn = itertools.count()

    def next_target() -> str:
        return targets[next(turn) % len(targets)]
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:

        async def conversation(idx: int, s: Session) -> None:
            answers: list[str] = []
            hdrs = {session_header: str(session_id_offset + idx)} if session_header else None
            for t, turn in enumerate(s.turns):
                if t and turn.think_s:
                    await asyncio.sleep(turn.think_s)  # the client's tools running
                msgs = messages_for(s, t, answers)
                sent = len(log.sent)
                log.sent.append(msgs)
                log.tools.append(s.tools)
                log.answers.append("")
                res, answer = await _one(http, next_target(), model, msgs, turn.max_tokens,
                                         request_timeout, hdrs, api, s.tools)
                res.session, res.turn = idx, t
                log.results.append(res)
                if not res.ok:
                    return
                log.answers[sent] = answer
                answers.append(answer)

        tasks: list[asyncio.Task[None]] = []
        log.started = last_report = time.perf_counter()
        for idx, (s, at) in enumerate(zip(workload.sessions, starts, strict=False)):
            delay = log.started + at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            if stop is not None and stop.is_set():
                break
            log.planned += len(s.turns)
            tasks.append(asyncio.create_task(conversation(idx, s)))
            if progress and (now := time.perf_counter()) - last_report > 10:
                last_report = now
                print(f"    t={now - log.started:5.0f}s sent={len(log.sent)} "
                      f"done={len(log.results)} errors={sum(not r.ok for r in log.results)}",
                      flush=True)
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=drain_timeout)
            for t in pending:
                t.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        log.finished = time.perf_counter()
    return log
