"""Open-loop load generator: Poisson session arrivals, streaming chat requests, TTFT per request.

Each request is sent with `stream: true`; TTFT is the time to the first SSE event that carries
content, e2e the time to `data: [DONE]`. Every request sent is logged in send order, so the
oracle can replay exactly the same sequence.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass, field
from typing import Literal

import aiohttp

from engine_sim.chat import render_chat

from .workloads import Session, Workload, messages_for


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
    # Our router's x-routed-to and x-route-reason answer headers ("" through other routers).
    routed_to: str = ""
    reason: str = ""
    request_id: str = ""  # the x-request-id sent, when run_load was asked to tag requests


@dataclass
class RunLog:
    results: list[Result] = field(default_factory=list)
    sent: list[list[dict[str, str]]] = field(default_factory=list)  # messages, in send order
    started: float = 0.0
    finished: float = 0.0


# chat: messages to /v1/chat/completions; completions: their rendered prompt to /v1/completions
Api = Literal["chat", "completions"]


def _delta_content(choice: dict) -> str | None:
    return (choice.get("delta") or {}).get("content")


def _text(choice: dict) -> str | None:
    return choice.get("text")


async def _one(
    session_http: aiohttp.ClientSession,
    url: str,
    model: str,
    msgs: list[dict[str, str]],
    max_tokens: int,
    timeout: float,
    headers: dict[str, str] | None = None,
    api: Api = "chat",
) -> tuple[Result, str]:
    body: dict[str, object] = {
        "model": model,
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0,
    }
    if api == "chat":
        body["messages"] = msgs
        path, field_of = "/v1/chat/completions", _delta_content
    else:
        # The prompt the simulator's chat template makes of these messages: the engine sees
        # the same bytes either way, so a completions run is the same work as a chat run.
        body["prompt"] = render_chat(msgs)
        path, field_of = "/v1/completions", _text
    t0 = time.perf_counter()
    ttft = None
    parts: list[str] = []
    usage = None
    done = False
    status = 0
    routed_to = reason = ""
    try:
        async with session_http.post(
            url + path,
            json=body,
            headers=headers,
            timeout=aiohttp.ClientTimeout(total=timeout),
        ) as r:
            status = r.status
            routed_to = r.headers.get("x-routed-to", "")
            reason = r.headers.get("x-route-reason", "")
            if r.status != 200:
                text = await r.text()
                return Result(
                    0, 0, t0, None, None, False, status, 0, None, None, url, text[:200]
                ), ""
            # Only the first content event is parsed on the way (it stops the TTFT clock);
            # the rest is kept raw and parsed after the stream ends, so the client's own CPU
            # work does not delay what it measures.
            raw: list[bytes] = []
            async for line in r.content:
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    done = True
                    break
                if ttft is None:
                    obj = json.loads(data)
                    for ch in obj.get("choices") or ():
                        if field_of(ch):
                            ttft = time.perf_counter() - t0
                raw.append(data)
            e2e = time.perf_counter() - t0
            for data in raw:
                obj = json.loads(data)
                if obj.get("usage"):
                    usage = obj["usage"]
                for ch in obj.get("choices") or ():
                    piece = field_of(ch)
                    if piece:
                        parts.append(piece)
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        return Result(0, 0, t0, ttft, None, False, status, 0, None, None, url, repr(exc)), ""
    answer = "".join(parts)
    cached = prompt = None
    out_tokens = 0
    if usage:
        prompt = usage.get("prompt_tokens")
        out_tokens = usage.get("completion_tokens") or 0
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    ok = done and ttft is not None
    return Result(
        0,
        0,
        t0,
        ttft,
        e2e if ok else None,
        ok,
        status,
        out_tokens,
        cached,
        prompt,
        url,
        "" if ok else "stream ended without [DONE]",
        routed_to,
        reason,
    ), answer


async def run_load(
    workload: Workload,
    targets: list[str],
    model: str,
    rate: float,
    seconds: float,
    *,
    seed: int = 7,
    request_timeout: float = 300.0,
    drain_timeout: float = 120.0,
    progress: bool = True,
    session_header: str | None = None,
    session_id_offset: int = 0,
    api: Api = "chat",
    tag_requests: bool = False,
) -> RunLog:
    """Send `workload` at `rate` requests/s for `seconds`; targets are used round-robin per
    request, as a Kubernetes Service spreads connections over router replicas.

    With `session_header` (e.g. "X-Session-ID"), every request of a session carries that header
    with one id per Session (`session_id_offset` + its index): all turns of a conversation share
    it; each single-turn session has its own. Off by default. `api` "completions" sends each
    request's messages as the prompt the simulator's chat template makes of them.
    `tag_requests` sends each request with `x-request-id: r<send index>` (the simulators time
    the requests that carry one)."""
    rng = random.Random(seed)
    log = RunLog()
    avg_turns = sum(len(s.turns) for s in workload.sessions) / max(1, len(workload.sessions))
    session_rate = rate / avg_turns
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
                tag = f"r{len(log.sent)}" if tag_requests else ""
                log.sent.append(msgs)
                res, answer = await _one(
                    http, target, model, msgs, turn.max_tokens, request_timeout,
                    {**(hdrs or {}), "x-request-id": tag} if tag else hdrs, api,
                )
                res.session, res.turn, res.request_id = idx, t, tag
                log.results.append(res)
                if not res.ok:
                    return
                answers.append(answer)

        tasks: list[asyncio.Task[None]] = []
        log.started = time.perf_counter()
        deadline = log.started + seconds
        next_at = log.started
        last_report = log.started
        for idx, s in enumerate(workload.sessions):
            next_at += rng.expovariate(session_rate)
            if next_at >= deadline:
                break
            delay = next_at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(conversation(idx, s)))
            now = time.perf_counter()
            if progress and now - last_report > 10:
                last_report = now
                done = len(log.results)
                print(
                    f"    t={now - log.started:5.0f}s sent={len(log.sent)} done={done} "
                    f"errors={sum(not r.ok for r in log.results)}",
                    flush=True,
                )
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=drain_timeout)
            for t in pending:
                t.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        log.finished = time.perf_counter()
    return log
