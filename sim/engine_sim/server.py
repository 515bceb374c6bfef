"""The HTTP face of one simulated replica: vLLM's OpenAI-compatible endpoints on aiohttp."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from .engine import Engine, EngineError, Request
from .kvcache import PrefixCache
from .metrics import EngineMetrics
from .profiles import Profile
from .protocol import (
    ApiError,
    ChunkWriter,
    GenerateRequest,
    bad,
    full_response,
    new_id,
    parse_generate,
    parse_json,
    parse_tokenize,
)

log = logging.getLogger("engine_sim.server")


@dataclass
class SimConfig:
    model: str = "sim-model"
    served_model_names: list[str] = field(default_factory=list)
    profile: Profile | None = None
    kv_capacity_tokens: int | None = None
    block_size: int = 16
    max_num_seqs: int = 64
    time_scale: float = 1.0
    replica_id: str = "sim"
    max_model_len: int = 32768

    @property
    def served(self) -> list[str]:
        return self.served_model_names or [self.model]


ENGINE: web.AppKey[Engine] = web.AppKey("engine", Engine)
METRICS: web.AppKey[EngineMetrics] = web.AppKey("metrics", EngineMetrics)
CONFIG: web.AppKey[SimConfig] = web.AppKey("config", SimConfig)


def _json(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(
        body=json.dumps(data).encode(),
        status=status,
        content_type="application/json",
        headers=headers,
    )


def _error(err: ApiError) -> web.Response:
    return _json(err.body(), status=err.status)


@web.middleware
async def _errors(request: web.Request, handler: Any) -> web.StreamResponse:
    """Bad input never becomes a 500; unknown paths answer like vLLM's FastAPI does."""
    try:
        return await handler(request)
    except ApiError as e:
        return _error(e)
    except EngineError as e:
        return _error(bad(str(e)))
    except web.HTTPNotFound:
        return _json({"detail": "Not Found"}, status=404)
    except web.HTTPMethodNotAllowed:
        return _json({"detail": "Method Not Allowed"}, status=405)
    except web.HTTPException:
        raise
    except Exception:
        # A bug of ours, not the client's: still an OpenAI-shaped body, and logged.
        log.exception("unexpected error on %s %s", request.method, request.path)
        return _error(ApiError(500, "Internal server error"))


async def _body(request: web.Request) -> dict[str, Any]:
    return parse_json(await request.read())


# ---- generation -----------------------------------------------------------------------


async def _generate(request: web.Request, kind: str) -> web.StreamResponse:
    cfg = request.app[CONFIG]
    engine = request.app[ENGINE]
    req = parse_generate(await _body(request), kind, cfg.served, cfg.max_model_len)
    handle = engine.submit(req.prompt_ids, req.max_tokens, req.seed)
    if req.stream:
        return await _stream(request, engine, req, handle, cfg.replica_id)
    pieces = [piece async for piece in engine.stream(handle)]
    body = full_response(
        req,
        new_id(kind),
        "".join(pieces),
        handle.prompt_tokens,
        len(pieces),
        handle.cached_tokens,
    )
    headers = {"x-replica-id": cfg.replica_id, "x-cached-tokens": str(handle.cached_tokens)}
    return _json(body, headers=headers)


async def _stream(
    request: web.Request, engine: Engine, req: GenerateRequest, handle: Request, replica_id: str
) -> web.StreamResponse:
    resp = web.StreamResponse(
        headers={
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-cache",
            "x-replica-id": replica_id,
        }
    )
    writer = ChunkWriter(req, new_id(req.kind))
    pieces = engine.stream(handle)
    sent = 0
    try:
        await resp.prepare(request)
        if req.kind == "chat":
            await resp.write(writer.role())
        async for piece in pieces:
            sent += 1
            await resp.write(writer.piece(piece, last=sent == req.max_tokens))
        if req.include_usage:
            await resp.write(writer.usage(handle.prompt_tokens, sent, handle.cached_tokens))
        await resp.write(writer.done())
        await resp.write_eof()
    except ConnectionError:
        # The client went away mid-stream; closing the iterator below aborts the request.
        pass
    finally:
        await pieces.aclose()
        engine.abort(handle)
    return resp


async def completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, "completion")


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, "chat")


# ---- the rest -------------------------------------------------------------------------


async def models(request: web.Request) -> web.Response:
    cfg = request.app[CONFIG]
    data = [
        {
            "id": name,
            "object": "model",
            "created": 0,
            "owned_by": "vllm",
            "root": cfg.model,
            "parent": None,
            "max_model_len": cfg.max_model_len,
        }
        for name in cfg.served
    ]
    return _json({"object": "list", "data": data})


async def health(request: web.Request) -> web.Response:
    return web.Response(status=200)


async def tokenize_(request: web.Request) -> web.Response:
    cfg = request.app[CONFIG]
    tokens = parse_tokenize(await _body(request), cfg.served)
    return _json(
        {
            "count": len(tokens),
            "max_model_len": cfg.max_model_len,
            "tokens": tokens,
            "token_strs": None,
        }
    )


async def metrics(request: web.Request) -> web.Response:
    body = request.app[METRICS].render()
    return web.Response(body=body, headers={"Content-Type": "text/plain; version=0.0.4"})


async def stats(request: web.Request) -> web.Response:
    engine = request.app[ENGINE]
    s = engine.stats
    return _json(
        {
            "replica_id": request.app[CONFIG].replica_id,
            "requests": s.requests,
            "prompt_tokens": s.prompt_tokens,
            "cached_tokens": s.cached_tokens,
            "generation_tokens": s.generation_tokens,
            "aborted": s.aborted,
            "running": engine.num_running,
            "waiting": engine.num_waiting,
            "kv_usage": engine.cache.usage_fraction(),
            "cached_blocks": engine.cache.num_cached_blocks(),
            "evicted_blocks": engine.cache.evictions,
            "kv_capacity_tokens": engine.cache.capacity_tokens,
            "block_size": engine.cache.block_size,
        }
    )


async def reset(request: web.Request) -> web.Response:
    request.app[ENGINE].reset()
    return _json({"status": "ok"})


async def reset_prefix_cache(request: web.Request) -> web.Response:
    request.app[ENGINE].cache.reset()
    return web.Response(status=200)


# ---- the app --------------------------------------------------------------------------


def build_engine(cfg: SimConfig) -> tuple[Engine, EngineMetrics]:
    if cfg.profile is None:
        raise ValueError("SimConfig.profile is required")
    capacity = cfg.kv_capacity_tokens or cfg.profile.default_kv_capacity_tokens
    cache = PrefixCache(capacity, cfg.block_size)
    m = EngineMetrics(cfg.served[0], cfg.block_size, cache.capacity_blocks)
    engine = Engine(cfg.profile, cache, cfg.max_num_seqs, time_scale=cfg.time_scale, observer=m)
    m.bind(engine)
    return engine, m


def make_app(cfg: SimConfig) -> web.Application:
    # Bodies up to 64 MiB: prompts near max_model_len as token id lists are megabytes of JSON.
    app = web.Application(middlewares=[_errors], client_max_size=64 * 1024 * 1024)
    engine, m = build_engine(cfg)
    app[CONFIG] = cfg
    app[ENGINE] = engine
    app[METRICS] = m

    async def lifecycle(app: web.Application) -> Any:
        engine.start()
        yield
        await engine.stop()

    app.cleanup_ctx.append(lifecycle)
    r = app.router
    r.add_post("/v1/completions", completions)
    r.add_post("/v1/chat/completions", chat_completions)
    r.add_get("/v1/models", models)
    r.add_get("/health", health)
    r.add_post("/tokenize", tokenize_)
    r.add_get("/metrics", metrics)
    r.add_get("/stats", stats)
    r.add_post("/reset", reset)
    r.add_post("/reset_prefix_cache", reset_prefix_cache)
    return app
