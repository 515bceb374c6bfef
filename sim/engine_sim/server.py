"""The simulator's HTTP face: vLLM's OpenAI-compatible API on aiohttp.

Two ways to turn a request into tokens: the byte tokenizer (tokenizer.py, chat.py: the
default) or, with a Hugging Face tokenizer (hf_tokenizer.py), real token ids of the chat
rendered with the tokenizer's chat template, as vLLM does.
"""

from __future__ import annotations

import json
import time
import uuid
from array import array
from typing import TYPE_CHECKING, Any, NamedTuple

import xxhash
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from prefix_router.conversation import PromptError
from prefix_router.prompt import MultiModalPart

from .chat import render_chat
from .engine import Engine, Request
from .metrics import EngineMetrics
from .tokenizer import VOCAB_SIZE, count_tokens, token_ids_to_bytes, tokenize, tokenize_bytes

if TYPE_CHECKING:
    from .hf_tokenizer import ChatTokenizer
    from .sequences import LoRA

ENGINE: web.AppKey[Engine] = web.AppKey("engine", Engine)
METRICS: web.AppKey[EngineMetrics] = web.AppKey("metrics", EngineMetrics)
CONF: web.AppKey[dict] = web.AppKey("conf", dict)
# TTFT samples /stats keeps between resets (a benchmark run's worth and then some).
_MAX_TTFT_SAMPLES = 200_000
# What /version answers: the vLLM release whose API and KV events the simulator follows.
VLLM_VERSION = "0.24.0"


class BadRequest(Exception):
    def __init__(
        self, message: str, status: int = 400, param: str | None = None, etype: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.param = param
        self.etype = etype  # the error's type when vLLM names it (else the status's)


def error(
    status: int, message: str, param: str | None = None, etype: str | None = None
) -> web.Response:
    # vLLM's ErrorResponse: {"error": {message, type, param, code}}
    if etype is None:
        etype = {400: "BadRequestError", 404: "NotFoundError"}.get(status, "InternalServerError")
    body = {"error": {"message": message, "type": etype, "param": param, "code": status}}
    return web.json_response(body, status=status)


@web.middleware
async def json_errors(request: web.Request, handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except BadRequest as e:
        return error(e.status, str(e), e.param, e.etype)
    except UnicodeEncodeError as e:
        # JSON may escape a lone UTF-16 surrogate; no tokenizer takes that as text
        return error(400, f"the request holds a lone surrogate ({e.object[e.start]!r})")
    except web.HTTPException as e:
        if e.status < 400:
            raise
        if e.status == 404:
            # SGLang's model-info probes land here too: 404 keeps its router from fetching a
            # tokenizer.
            return error(404, f"Not Found: {request.path}")
        resp = error(e.status, e.reason or "error")
        if "Allow" in e.headers:
            resp.headers["Allow"] = e.headers["Allow"]
        return resp


async def _body(request: web.Request) -> dict[str, Any]:
    try:
        body = json.loads(await request.read())
    except (ValueError, UnicodeDecodeError) as e:
        raise BadRequest(f"JSON decode error: {e}") from None
    except RecursionError:
        raise BadRequest("JSON decode error: nested too deeply") from None
    except web.RequestPayloadError as e:
        raise BadRequest(f"the request body cannot be read: {e}") from None
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    return body


def _check_model(request: web.Request, body: dict[str, Any]) -> str:
    conf = request.app[CONF]
    names = conf["served"]
    model = body.get("model")
    if model is None:
        return names[0]
    if not isinstance(model, str) or (model not in names and model not in conf["loras"]):
        raise BadRequest(f"The model `{model}` does not exist.", 404, "model")
    return model


def _max_tokens(body: dict[str, Any], chat: bool) -> int:
    value = body.get("max_completion_tokens") if chat else None
    if value is None:
        value = body.get("max_tokens")
    if value is None:
        return 16
    if not isinstance(value, int) or isinstance(value, bool):
        raise BadRequest("max_tokens must be an integer", param="max_tokens")
    if value < 1:
        raise BadRequest(f"max_tokens must be at least 1, got {value}.", param="max_tokens")
    return value


def _chat_args(body: dict[str, Any]) -> tuple[list[dict[str, Any]], list[Any] | None]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list", param="messages")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise BadRequest(f"messages[{i}] must be an object with a role", param="messages")
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise BadRequest("tools must be a list", param="tools")
    return messages, tools


def _flag(body: dict[str, Any], name: str, default: bool) -> bool:
    value = body.get(name, default)
    if not isinstance(value, bool):
        raise BadRequest(f"{name} must be a boolean", param=name)
    return value


def _prompt_ids(body: dict[str, Any], chat: bool, tok: ChatTokenizer) -> list[int]:
    return _prompt_tokens(body, chat, tok)[0]


def _prompt_tokens(
    body: dict[str, Any], chat: bool, tok: ChatTokenizer
) -> tuple[list[int], tuple[MultiModalPart, ...]]:
    """The prompt's token ids as vLLM makes them, and its media items: a chat through the
    prompt module shared with the router (prefix_router.prompt), a text prompt encoded with
    special tokens."""
    if chat:
        _chat_args(body)
        try:
            p = tok.prompt("chat", body)
        except PromptError as e:
            raise BadRequest(str(e), param=e.param) from None
        return p.token_ids, p.mm
    return _completion_ids(body, tok), ()


def _completion_ids(body: dict[str, Any], tok: ChatTokenizer) -> list[int]:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str) and prompt:
        return tok.encode(prompt, _flag(body, "add_special_tokens", True))
    if (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
    ):
        for t in prompt:
            if not 0 <= t < tok.vocab_size:
                raise BadRequest(f"Token id {t} is out of vocabulary", param="prompt")
        return list(prompt)
    if isinstance(prompt, list) and len(prompt) > 1 and all(isinstance(p, str) for p in prompt):
        raise BadRequest("batched prompts are not supported by the simulator", param="prompt")
    raise BadRequest("prompt must be a non-empty string or a list of token ids", param="prompt")


def _prompt_bytes(body: dict[str, Any], chat: bool) -> bytes:
    if chat:
        messages, tools = _chat_args(body)
        try:
            return render_chat(messages, tools).encode()
        except (ValueError, TypeError) as e:
            raise BadRequest(str(e), param="messages") from None
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str) and prompt:
        return prompt.encode()
    if (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < 2**32 for t in prompt)
    ):
        for t in prompt:
            if t >= VOCAB_SIZE:
                raise BadRequest(f"Token id {t} is out of vocabulary", param="prompt")
        return token_ids_to_bytes(prompt)
    if isinstance(prompt, list) and len(prompt) > 1 and all(isinstance(p, str) for p in prompt):
        raise BadRequest("batched prompts are not supported by the simulator", param="prompt")
    raise BadRequest("prompt must be a non-empty string or a list of token ids", param="prompt")


def _usage(r: Request, details: str, stream: bool = False) -> dict[str, Any]:
    """`details`: "always" (the byte tokenizer's simulator, as before) or vLLM's rule, "on"
    (--enable-prompt-tokens-details: only when some tokens were cached) or "off". vLLM leaves
    the field null in a whole response and out of a stream's usage chunk otherwise."""
    usage: dict[str, Any] = {
        "prompt_tokens": r.prompt_tokens,
        "completion_tokens": r.generated,
        "total_tokens": r.prompt_tokens + r.generated,
    }
    if details == "always" or (details == "on" and r.cached_tokens):
        usage["prompt_tokens_details"] = {"cached_tokens": r.cached_tokens}
    elif not stream:
        usage["prompt_tokens_details"] = None
    return usage


def _lora_and_salt(app: web.Application, body: dict[str, Any], model: str):
    salt = body.get("cache_salt")
    if salt is not None and (not isinstance(salt, str) or not salt):
        raise BadRequest("cache_salt must be a non-empty string", param="cache_salt")
    return app[CONF]["loras"].get(model), salt


class EnginePrompt(NamedTuple):
    """A prompt as the engine takes it: bytes with the byte tokenizer, ids with a real one
    (and then its media items, which key the blocks over their placeholders)."""

    prompt: bytes
    ids: list[int] | None
    tokens: int
    mm: tuple[MultiModalPart, ...] = ()


def prompt_of(app: web.Application, body: dict[str, Any], chat: bool) -> EnginePrompt:
    """A chat or completion body's prompt as the engine takes it. The Responses API renders
    its input into a chat body and comes through here too, so both see the same tokens."""
    tok = app[CONF]["tokenizer"]
    if tok is None:
        prompt = _prompt_bytes(body, chat)
        return EnginePrompt(prompt, None, count_tokens(prompt))
    ids, mm = _prompt_tokens(body, chat, tok)
    return EnginePrompt(b"", ids, len(ids), mm)


def submit(
    app: web.Application,
    body: dict[str, Any],
    model: str,
    prompt: bytes,
    ids: list[int] | None,
    max_tokens: int,
    mm: tuple[MultiModalPart, ...] = (),
) -> Request:
    """The prompt queued on the engine (its LoRA and cache salt from the body)."""
    engine = app[ENGINE]
    if not engine.fits(len(ids) if ids is not None else count_tokens(prompt), max_tokens):
        raise BadRequest("the request needs more KV-cache blocks than the engine has")
    if ids is None:
        seed = xxhash.xxh32_intdigest(prompt[-256:])
    else:
        seed = xxhash.xxh32_intdigest(array("I", ids[-64:]).tobytes())
    lora, salt = _lora_and_salt(app, body, model)
    return engine.submit(prompt, max_tokens, seed, ids=ids, lora=lora, salt=salt, mm=mm)


async def _generate(request: web.Request, chat: bool) -> web.StreamResponse:
    received = time.perf_counter()
    app = request.app
    engine = app[ENGINE]
    body = await _body(request)
    model = _check_model(request, body)
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise BadRequest("stream must be a boolean", param="stream")
    opts = body.get("stream_options")
    if opts is not None:
        # vLLM's checks, in its words
        if not stream:
            raise BadRequest(
                "Stream options can only be defined when `stream=True`.", param="stream_options"
            )
        if not isinstance(opts, dict):
            raise BadRequest("stream_options must be an object", param="stream_options")
    max_tokens = _max_tokens(body, chat)
    prompt, ids, ptoks, mm = prompt_of(app, body, chat)
    limit = app[CONF]["max_model_len"]
    if ptoks + max_tokens > limit:
        raise BadRequest(
            f"This model's maximum context length is {limit} tokens. However, you requested "
            f"{ptoks + max_tokens} tokens ({ptoks} in the messages, {max_tokens} in the "
            "completion). Please reduce the length of the messages or completion.",
            param="max_tokens" if ptoks < limit else "messages",
        )
    r = submit(app, body, model, prompt, ids, max_tokens, mm)
    rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
    created = int(time.time())
    include_usage = isinstance(opts, dict) and bool(opts.get("include_usage"))
    replica = app[CONF]["replica_id"]
    try:
        if not stream:
            while (await r.out.get()) is not None:
                pass
            text = "".join(r.text)
            if chat:
                choice = {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "logprobs": None,
                    "finish_reason": "length",
                    "stop_reason": None,
                }
            else:
                choice = {
                    "index": 0,
                    "text": text,
                    "logprobs": None,
                    "finish_reason": "length",
                    "stop_reason": None,
                }
            obj = {
                "id": rid,
                "object": "chat.completion" if chat else "text_completion",
                "created": created,
                "model": model,
                "choices": [choice],
                "usage": _usage(r, app[CONF]["details"]),
            }
            return web.json_response(
                obj, headers={"x-replica-id": replica, "x-cached-tokens": str(r.cached_tokens)}
            )
        resp = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-cache",
                "x-replica-id": replica,
            }
        )
        await resp.prepare(request)
        kind = "chat.completion.chunk" if chat else "text_completion"
        # The events of one stream differ only in the piece (and the first and last in a field
        # or two): the bytes around it are made once, not a dict and a json.dumps a token.
        # Sim CPU a streamed token, 16 streams of 200 tokens: 19.2 us with a dict and
        # json.dumps, 15.5 us so (2026-12-05, this 2-core host; `bench stream-cpu` measures it
        # again: 16.9-22.5 us in four runs, 2026-12-05 19:30-20:00).
        head = (
            f'data: {{"id":{json.dumps(rid)},"object":"{kind}","created":{created},'
            f'"model":{json.dumps(model)},"choices":[{{"index":0,'
        ).encode()
        opening = '"delta":{"role":"assistant","content":' if chat else '"text":'
        then = '"delta":{"content":' if chat else '"text":'
        close = "}" if chat else ""
        going = (close + ',"logprobs":null,"finish_reason":null}]}\n\n').encode()
        ending = (close + ',"logprobs":null,"finish_reason":"length"}]}\n\n').encode()
        first = True
        while True:
            piece = await r.out.get()
            if piece is None:
                break
            # the last piece: only the end-of-stream marker (None) is left behind it
            tail = ending if r.done and r.out.qsize() <= 1 else going
            field = opening if first else then
            await resp.write(head + (field + json.dumps(piece)).encode() + tail)
            if first:
                first = False
                tag = request.headers.get("x-request-id")
                timings = engine.counters.timings
                if tag and r.first_token_at is not None and len(timings) < _MAX_TTFT_SAMPLES:
                    timings.append(
                        (tag, received, r.arrived, r.first_token_at, time.perf_counter())
                    )
        if include_usage:
            chunk = {
                "id": rid,
                "object": kind,
                "created": created,
                "model": model,
                "choices": [],
                "usage": _usage(r, app[CONF]["details"], stream=True),
            }
            await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp
    finally:
        if not r.done:
            engine.cancel(r)  # the client went away: free the slot and the blocks


async def completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, chat=False)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, chat=True)


async def models(request: web.Request) -> web.Response:
    conf = request.app[CONF]
    data = [
        {
            "id": n,
            "object": "model",
            "created": conf["started"],
            "owned_by": "vllm",
            "root": conf["served"][0],
            "parent": None,
            "max_model_len": conf["max_model_len"],
        }
        for n in conf["served"]
    ]
    data += [
        {
            "id": lora.name,
            "object": "model",
            "created": conf["started"],
            "owned_by": "vllm",
            "root": lora.path,
            "parent": conf["served"][0],
            "max_model_len": None,
        }
        for lora in conf["loras"].values()
    ]
    return web.json_response({"object": "list", "data": data})


async def health(request: web.Request) -> web.Response:
    return web.Response(status=200)


async def tokenize_handler(request: web.Request) -> web.Response:
    body = await _body(request)
    _check_model(request, body)
    tok = request.app[CONF]["tokenizer"]
    if tok is not None:
        if "messages" not in body and not isinstance(body.get("prompt"), str):
            raise BadRequest("prompt (a string) or messages is required", param="prompt")
        ids = _prompt_ids(body, "messages" in body, tok)
        return web.json_response(
            {
                "count": len(ids),
                "max_model_len": request.app[CONF]["max_model_len"],
                "tokens": ids,
                "token_strs": None,
            }
        )
    if "messages" in body:
        text = _prompt_bytes(body, chat=True).decode()
    elif isinstance(body.get("prompt"), str):
        text = body["prompt"]
    else:
        raise BadRequest("prompt (a string) or messages is required", param="prompt")
    tokens = tokenize(text)
    return web.json_response(
        {
            "count": len(tokens),
            "max_model_len": request.app[CONF]["max_model_len"],
            "tokens": tokens,
            "token_strs": None,
        }
    )


async def _render(request: web.Request, chat: bool) -> web.Response:
    # vLLM (>= 0.20) renders a request into the GenerateRequest it would run, without running
    # it. vllm-router's cache_aware policy asks every worker for this on every request (and
    # falls back to /tokenize on a 404).
    body = await _body(request)
    model = _check_model(request, body)
    max_tokens = _max_tokens(body, chat)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], list):
        prompt = prompt[0]  # one prompt of token ids, as a batch of one
    tok = request.app[CONF]["tokenizer"]
    if tok is not None:
        ids = _prompt_ids({**body, "prompt": prompt} if not chat else body, chat, tok)
    elif not chat and isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
        _prompt_bytes({"prompt": prompt}, chat)  # validates the ids
        ids = list(prompt)
    else:
        ids = tokenize_bytes(_prompt_bytes(body, chat))
    return web.json_response(
        {
            "request_id": ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24],
            "token_ids": ids,
            "features": None,
            "sampling_params": {"max_tokens": max_tokens},
            "model": model,
            "stream": False,
        }
    )


async def render_chat_handler(request: web.Request) -> web.Response:
    return await _render(request, chat=True)


async def render_completion_handler(request: web.Request) -> web.Response:
    return await _render(request, chat=False)


async def metrics(request: web.Request) -> web.Response:
    return web.Response(
        body=generate_latest(request.app[METRICS].registry),
        headers={"Content-Type": CONTENT_TYPE_LATEST},
    )


async def stats(request: web.Request) -> web.Response:
    e = request.app[ENGINE]
    c = e.counters
    return web.json_response(
        {
            "replica_id": request.app[CONF]["replica_id"],
            "requests": c.requests,
            "prompt_tokens": c.prompt_tokens,
            "cached_tokens": c.cached_tokens,
            "cpu_cached_tokens": c.cpu_cached_tokens,
            "generation_tokens": c.generation_tokens,
            "running": len(e.running),
            "waiting": len(e.waiting),
            "kv_usage": e.cache.usage_fraction(),
            "ttft_s": [round(t, 5) for t in c.ttfts],
            "timings": c.timings,
            "cached_blocks": e.cache.cached_blocks(),
            "preemptions": c.preemptions,
            "kv_events": None
            if e.events is None
            else {
                "endpoint": e.events.endpoint,
                "replay_endpoint": e.events.replay_endpoint,
                "encoding": e.events.encoding,
                "published": e.events.published,
                "published_events": e.events.published_events,
            },
        }
    )


async def reset(request: web.Request) -> web.Response:
    request.app[ENGINE].reset()
    return web.json_response({"reset": True})


async def fault(request: web.Request) -> web.Response:
    """Simulator-only: `{"hang": true}` stops the engine stepping (requests wait, counters stand
    still, /health and /metrics still answer); `{"hang": false}` lets it go on."""
    body = await request.json()
    moving = request.app[ENGINE].moving
    if body.get("hang") is True:
        moving.clear()
    elif body.get("hang") is False:
        moving.set()
    return web.json_response({"hang": not moving.is_set()})


async def reset_prefix_cache(request: web.Request) -> web.Response:
    # vLLM's endpoint (a dev-mode one there). Running requests are preempted and recomputed,
    # as vLLM does when asked to reset them too; every cached block goes: AllBlocksCleared.
    preempted = request.app[ENGINE].reset_prefix_cache()
    return web.json_response({"reset": True, "preempted": preempted})


async def sleep(request: web.Request) -> web.Response:
    # vLLM's dev-mode /sleep?level=N: the KV cache goes (the weights too at level 2)
    try:
        request.app[ENGINE].sleep(int(request.query.get("level", "1")))
    except ValueError as exc:
        raise BadRequest(str(exc), param="level") from None
    return web.Response(status=200)


async def wake_up(request: web.Request) -> web.Response:
    request.app[ENGINE].wake_up()
    return web.Response(status=200)


async def is_sleeping(request: web.Request) -> web.Response:
    return web.json_response({"is_sleeping": request.app[ENGINE].sleep_level > 0})


async def detokenize_handler(request: web.Request) -> web.Response:
    body = await _body(request)
    _check_model(request, body)
    tok = request.app[CONF]["tokenizer"]
    vocab = VOCAB_SIZE if tok is None else tok.vocab_size
    ids = body.get("tokens")
    if not isinstance(ids, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab for t in ids
    ):
        raise BadRequest("tokens must be a list of token ids", param="tokens")
    if tok is None:
        # the byte tokenizer's ids are hashes: read them as a prompt of ids is read (4 bytes
        # each), so detokenize answers, but tokenize -> detokenize does not round-trip
        return web.json_response({"prompt": token_ids_to_bytes(ids).decode(errors="replace")})
    return web.json_response({"prompt": tok.decode(ids)})


async def version(request: web.Request) -> web.Response:
    return web.json_response({"version": VLLM_VERSION})


def build_app(
    *,
    model: str,
    served: list[str],
    engine: Engine,
    max_model_len: int,
    replica_id: str,
    tokenizer: ChatTokenizer | None = None,
    loras: list[LoRA] | None = None,
    enable_prompt_tokens_details: bool = False,
    responses_store: bool = False,
    responses_store_max_bytes: int = 256 * 1024 * 1024,
    embedding_dim: int = 256,
    max_audio_bytes: int = 25 * 1024 * 1024,
) -> web.Application:
    """Without a tokenizer the simulator always reports cached tokens (as it always has);
    with one it follows vLLM: only with enable_prompt_tokens_details, only when nonzero."""
    app = web.Application(middlewares=[json_errors], client_max_size=64 * 1024 * 1024)
    app[ENGINE] = engine
    m = EngineMetrics(model, engine)
    app[METRICS] = m
    if tokenizer is None:
        details = "always"
    else:
        details = "on" if enable_prompt_tokens_details else "off"
    app[CONF] = {
        "served": served,
        "max_model_len": max_model_len,
        "replica_id": replica_id,
        "started": int(time.time()),
        "tokenizer": tokenizer,
        "loras": {lora.name: lora for lora in loras or ()},
        "details": details,
    }

    def on_first(r: Request) -> None:
        m.admitted(r.prompt_tokens, r.cached_tokens)
        if r.first_token_at is not None:
            m.first_token(r.first_token_at - r.arrived)
            ttfts = engine.counters.ttfts
            if len(ttfts) < _MAX_TTFT_SAMPLES:
                ttfts.append(r.first_token_at - r.arrived)

    def on_finish(r: Request) -> None:
        if not r.cancelled:
            m.finished(time.perf_counter() - r.arrived, r.generated, "length")

    engine._on_first_token = on_first
    engine._on_finish = on_finish
    engine.on_preempt = lambda r: m.preempted()

    async def lifecycle(app: web.Application):
        if engine.events is not None:
            engine.events.start()
        engine.start()
        yield
        await engine.stop()
        if engine.events is not None:
            await engine.events.close()

    app.cleanup_ctx.append(lifecycle)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    app.router.add_post("/tokenize", tokenize_handler)
    app.router.add_post("/v1/chat/completions/render", render_chat_handler)
    app.router.add_post("/v1/completions/render", render_completion_handler)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/stats", stats)
    app.router.add_post("/reset", reset)
    app.router.add_post("/reset_prefix_cache", reset_prefix_cache)
    app.router.add_post("/sleep", sleep)
    app.router.add_post("/wake_up", wake_up)
    app.router.add_get("/is_sleeping", is_sleeping)
    app.router.add_post("/detokenize", detokenize_handler)
    app.router.add_post("/fault", fault)
    app.router.add_get("/version", version)
    # Imported here: these modules build on this one's request helpers.
    from . import audio, pooling, responses_api

    responses_api.add_routes(
        app, store_enabled=responses_store, store_max_bytes=responses_store_max_bytes
    )
    pooling.add_routes(app, embedding_dim=embedding_dim)
    audio.add_routes(app, max_audio_bytes=max_audio_bytes)
    return app
