"""The Responses API at vLLM's paths: POST /v1/responses, GET /v1/responses/{id},
POST /v1/responses/{id}/cancel (vLLM has no DELETE: it answers 405, as here).

As vLLM does it: the request becomes chat messages (prefix_router/responses_chat.py) and runs the
chat path (the same prompt, blocks and KV events as the equivalent chat request). With the store off
(vLLM's default) `store: true` is silently dropped, nothing is remembered and every id is unknown;
`background` then is an error. With it on, a stored response can be continued
(`previous_response_id`), read back and, while it runs in the background, cancelled. The simulator
always stops at max_output_tokens (its chat answers finish_reason "length"), so a response ends
"incomplete", as vLLM reports one that hit the limit.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from prefix_router.conversation import PromptError
from prefix_router.prompt import MultiModalPart
from prefix_router.responses_chat import responses_chat

from .engine import Request
from .responses_store import ResponseStore, Stored
from .server import CONF, ENGINE, BadRequest, _body, _check_model, _flag, prompt_of, submit

STORE: web.AppKey[ResponseStore] = web.AppKey("responses_store", ResponseStore)
# Tokens a response generates when the request names no max_output_tokens (the simulator's
# chat default; vLLM's is the rest of the context).
DEFAULT_MAX_OUTPUT_TOKENS = 16


def _json(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"))


def _answer(request: web.Request, obj: dict[str, Any]) -> web.Response:
    # x-replica-id: which simulator answered (as on every generation), for tests and benchmarks
    headers = {"x-replica-id": request.app[CONF]["replica_id"]}
    return web.json_response(obj, headers=headers, dumps=_json)


def not_found(response_id: str) -> BadRequest:
    # vLLM's words and type for it (serving_responses' _make_not_found_error)
    return BadRequest(
        f"Response with id '{response_id}' not found.", 404, "response_id", "invalid_request_error"
    )


@dataclass
class Plan:
    """A validated request: what to run and how to answer."""

    rid: str
    model: str
    body: dict[str, Any]
    messages: list[dict[str, Any]]
    prompt: bytes
    ids: list[int] | None
    prompt_tokens: int
    max_tokens: int
    stream: bool
    background: bool
    store: bool
    created: int = field(default_factory=lambda: int(time.time()))
    mm: tuple[MultiModalPart, ...] = ()  # the prompt's media items (token mode)


def _response(plan: Plan, status: str, output: list[Any], usage: Any) -> dict[str, Any]:
    b = plan.body
    return {
        "id": plan.rid,
        "created_at": plan.created,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": b.get("instructions"),
        "metadata": b.get("metadata"),
        "model": plan.model,
        "object": "response",
        "output": output,
        "parallel_tool_calls": b.get("parallel_tool_calls", True),
        "temperature": 1.0 if b.get("temperature") is None else b["temperature"],
        "tool_choice": b.get("tool_choice", "auto"),
        "tools": b.get("tools") or [],
        "top_p": 1.0 if b.get("top_p") is None else b["top_p"],
        "background": plan.background,
        "max_output_tokens": plan.max_tokens,
        "max_tool_calls": b.get("max_tool_calls"),
        "previous_response_id": b.get("previous_response_id"),
        "prompt": None,
        "reasoning": b.get("reasoning"),
        "service_tier": b.get("service_tier", "auto"),
        "status": status,
        "text": b.get("text"),
        "top_logprobs": None,
        "truncation": b.get("truncation", "disabled"),
        "usage": usage,
        "user": b.get("user"),
        "input_messages": None,
        "output_messages": None,
    }


def _usage(r: Request) -> dict[str, Any]:
    return {
        "input_tokens": r.prompt_tokens,
        "input_tokens_details": {
            "cached_tokens": r.cached_tokens,
            "input_tokens_per_turn": [r.prompt_tokens],
            "cached_tokens_per_turn": [r.cached_tokens],
        },
        "output_tokens": r.generated,
        "output_tokens_details": {
            "reasoning_tokens": 0,
            "tool_output_tokens": 0,
            "output_tokens_per_turn": [r.generated],
            "tool_output_tokens_per_turn": [0],
        },
        "total_tokens": r.prompt_tokens + r.generated,
    }


def _text_part(text: str) -> dict[str, Any]:
    return {"annotations": [], "text": text, "type": "output_text", "logprobs": None}


def _message(item_id: str, text: str, status: str) -> dict[str, Any]:
    content = [_text_part(text)] if status == "completed" else []
    return {
        "id": item_id,
        "content": content,
        "role": "assistant",
        "status": status,
        "type": "message",
    }


def _final(plan: Plan, r: Request, item_id: str) -> dict[str, Any]:
    text = "".join(r.text)
    status = "incomplete" if r.generated >= r.max_tokens else "completed"
    return _response(plan, status, [_message(item_id, text, "completed")], _usage(r))


def _plan(request: web.Request, body: dict[str, Any]) -> Plan:
    app = request.app
    model = _check_model(request, body)
    if body.get("prompt") is not None:
        raise BadRequest("prompt template is not supported", param="prompt")
    # vLLM's request model takes null for these as their default
    stream = _flag(body, "stream", False) if body.get("stream") is not None else False
    background = body.get("background") is not None and _flag(body, "background", False)
    store = _flag(body, "store", True) if body.get("store") is not None else True
    if background and not store:
        raise BadRequest("background can only be used when `store` is true", param="background")
    enabled = app[CONF]["responses_store"]
    if store and not enabled:
        if background:
            raise BadRequest(
                "This vLLM engine does not support `store=True` and therefore does not support "
                "the background mode. To enable these features, set the environment variable "
                "`VLLM_ENABLE_RESPONSES_API_STORE=1` when launching the vLLM server.",
                param="background",
            )
        store = False  # vLLM drops it silently: store=True is only the API's default
    if "input" not in body:
        raise BadRequest("input is required", param="input")
    previous = None
    prev_id = body.get("previous_response_id")
    if prev_id is not None:
        if not isinstance(prev_id, str):
            raise BadRequest("previous_response_id must be a string", param="previous_response_id")
        entry = app[STORE].get(prev_id)
        if entry is None:
            raise not_found(prev_id)
        previous = (entry.messages, entry.response["output"])
    try:
        chat = responses_chat(body, previous)
    except PromptError as e:
        raise BadRequest(str(e), param=e.param) from None
    messages = chat["messages"]
    prompt, ids, ptoks, mm = prompt_of(app, chat, chat=True)
    limit = app[CONF]["max_model_len"]
    if ptoks >= limit:
        raise BadRequest(
            f"The engine prompt length {ptoks} exceeds the max_model_len {limit}. "
            "Please reduce prompt.",
            param="input",
        )
    wanted = body.get("max_output_tokens")
    if wanted is None:
        wanted = DEFAULT_MAX_OUTPUT_TOKENS
    elif not isinstance(wanted, int) or isinstance(wanted, bool) or wanted < 1:
        raise BadRequest("max_output_tokens must be a positive integer", param="max_output_tokens")
    return Plan(
        rid=f"resp_{uuid.uuid4().hex}",
        model=model,
        body=body,
        messages=messages,
        prompt=prompt,
        ids=ids,
        prompt_tokens=ptoks,
        max_tokens=min(wanted, limit - ptoks),
        stream=stream,
        background=background,
        store=store,
        mm=mm,
    )


async def _events(plan: Plan, r: Request) -> AsyncIterator[tuple[str, dict[str, Any]]]:
    """The stream of one response, as vLLM's simple (non-harmony) path sends it: created,
    in_progress, the message item opened, a text delta a token, everything closed, completed.
    Content indices are the OpenAI API's (the openai client's stream helper reads them)."""
    initial = _response(plan, "in_progress", [], None)
    yield "response.created", {"response": initial}
    yield "response.in_progress", {"response": initial}
    item_id = f"msg_{uuid.uuid4().hex}"
    where = {"output_index": 0, "item_id": item_id, "content_index": 0}
    first = True
    while (piece := await r.out.get()) is not None:
        if first:
            first = False
            yield (
                "response.output_item.added",
                {
                    "output_index": 0,
                    "item": _message(item_id, "", "in_progress"),
                },
            )
            yield (
                "response.content_part.added",
                {
                    **where,
                    "part": {"type": "output_text", "text": "", "annotations": [], "logprobs": []},
                },
            )
        yield "response.output_text.delta", {**where, "delta": piece, "logprobs": []}
    text = "".join(r.text)
    yield "response.output_text.done", {**where, "text": text, "logprobs": []}
    part = {"text": text, "type": "output_text", "annotations": []}
    yield "response.content_part.done", {**where, "part": part}
    yield (
        "response.output_item.done",
        {
            "output_index": 0,
            "item": _message(item_id, text, "completed"),
        },
    )
    yield "response.completed", {"response": _final(plan, r, item_id)}


def _sse(seq: int, kind: str, data: dict[str, Any]) -> bytes:
    event = _json({"type": kind, "sequence_number": seq, **data})
    return f"event: {kind}\ndata: {event}\n\n".encode()


async def create(request: web.Request) -> web.StreamResponse:
    app = request.app
    body = await _body(request)
    plan = _plan(request, body)
    r = submit(app, body, plan.model, plan.prompt, plan.ids, plan.max_tokens, plan.mm)
    store = app[STORE]
    if plan.background:
        return await _background(request, plan, r, store)
    headers = {"x-replica-id": app[CONF]["replica_id"]}
    try:
        if not plan.stream:
            while (await r.out.get()) is not None:
                pass
            response = _final(plan, r, f"msg_{uuid.uuid4().hex}")
            if plan.store:
                store.put(plan.rid, Stored(response, plan.messages))
            headers["x-cached-tokens"] = str(r.cached_tokens)
            return web.json_response(response, headers=headers, dumps=_json)
        resp = web.StreamResponse(
            headers={**headers, "Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await resp.prepare(request)
        seq = 0
        async for kind, data in _events(plan, r):
            if kind == "response.completed" and plan.store:
                store.put(plan.rid, Stored(data["response"], plan.messages))
            await resp.write(_sse(seq, kind, data))
            seq += 1
        await resp.write_eof()
        return resp
    finally:
        if not r.done:
            app[ENGINE].cancel(r)  # the client went away: free the slot and the blocks


async def _background(
    request: web.Request, plan: Plan, r: Request, store: ResponseStore
) -> web.StreamResponse:
    """Stored at once as "queued" and run by a task of its own; a streamed one also keeps its
    events, which this request (and any GET ?stream=true) reads as they come."""
    queued = _response(plan, "queued", [], None)
    entry = Stored(queued, plan.messages, events=[] if plan.stream else None)
    store.put(plan.rid, entry)
    engine = request.app[ENGINE]

    async def run() -> None:
        try:
            if entry.events is None:
                while (await r.out.get()) is not None:
                    pass
                final = _final(plan, r, f"msg_{uuid.uuid4().hex}")
            else:
                seq = 0
                final = queued
                async for kind, data in _events(plan, r):
                    event = _sse(seq, kind, data)
                    seq += 1
                    entry.events.append(event)
                    store.grow(plan.rid, len(event))
                    if kind == "response.completed":
                        final = data["response"]
                    async with entry.changed:
                        entry.changed.notify_all()
            if entry.response["status"] != "cancelled":
                entry.response = final
                store.put(plan.rid, entry)
        except Exception:
            entry.response = {**entry.response, "status": "failed"}  # as vLLM marks it
            raise
        finally:
            if not r.done:
                engine.cancel(r)
            entry.task = None
            async with entry.changed:
                entry.changed.notify_all()

    entry.task = asyncio.create_task(run(), name=f"response {plan.rid}")
    if not plan.stream:
        return _answer(request, queued)
    return await _replay(request, entry, 0)


async def _replay(request: web.Request, entry: Stored, start: int) -> web.StreamResponse:
    """A background response's events from `start` on, waiting for new ones until it ends."""
    resp = web.StreamResponse(
        headers={
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-cache",
            "x-replica-id": request.app[CONF]["replica_id"],
        }
    )
    await resp.prepare(request)
    events = entry.events if entry.events is not None else []
    i = start
    while True:
        while i < len(events):
            await resp.write(events[i])
            i += 1
        if entry.task is None:
            break
        async with entry.changed:
            await entry.changed.wait_for(lambda n=i: len(events) > n or entry.task is None)
    await resp.write_eof()
    return resp


async def retrieve(request: web.Request) -> web.StreamResponse:
    rid = request.match_info["response_id"]
    entry = request.app[STORE].get(rid)
    if entry is None:
        raise not_found(rid)
    stream = request.query.get("stream", "false").lower() in ("true", "1")
    if not stream:
        return _answer(request, entry.response)
    if entry.events is None:
        raise BadRequest(f"Unknown response_id: {rid}", param="response_id")
    after = request.query.get("starting_after")
    try:
        start = 0 if after is None else int(after) + 1
    except ValueError:
        raise BadRequest("starting_after must be an integer", param="starting_after") from None
    return await _replay(request, entry, max(start, 0))


async def cancel(request: web.Request) -> web.Response:
    rid = request.match_info["response_id"]
    entry = request.app[STORE].get(rid)
    if entry is None:
        raise not_found(rid)
    if not entry.running:
        raise BadRequest(
            "Cannot cancel a synchronous response.", 400, "response_id", "invalid_request_error"
        )
    entry.response = {**entry.response, "status": "cancelled"}
    task = entry.task
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    return _answer(request, entry.response)


def add_routes(app: web.Application, *, store_enabled: bool, store_max_bytes: int) -> None:
    app[CONF]["responses_store"] = store_enabled
    app[STORE] = ResponseStore(store_max_bytes)

    async def stop_background(app: web.Application):
        yield
        tasks = [e.task for e in app[STORE].running() if e.task is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    app.cleanup_ctx.append(stop_background)
    app.router.add_post("/v1/responses", create)
    app.router.add_get("/v1/responses/{response_id}", retrieve)
    app.router.add_post("/v1/responses/{response_id}/cancel", cancel)
