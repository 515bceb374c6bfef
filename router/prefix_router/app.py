"""HTTP entry: the aiohttp application, its handlers and its lifecycle.

A request's path, top to bottom: `completions` (here) -> parse_for_routing (parsing.py) ->
RouterCore.route (core.py: eligible backends, prefix key in keying.py, decision in
scheduling/) -> forward (proxy.py: one Attempt per backend tried, attempt.py: load and index
records).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence

import aiohttp
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from .config import RouterSettings
from .core import RouterCore, build_core
from .discovery import Discovery, FileDiscovery, StaticDiscovery
from .encoding import inflate
from .errors import CLIENT_MISTAKES, RequestError, errors_as_json, expect_continue, server_header
from .health import HealthLoop
from .offload import Offload
from .parsing import Kind, parse_for_routing
from .passthrough import GETS, JSON_POSTS, MULTIPART_POSTS, Passthrough
from .proxy import forward
from .upstream import UpstreamClient

log = logging.getLogger("prefix_router")


SETTINGS: web.AppKey[RouterSettings] = web.AppKey("settings", RouterSettings)
CORE: web.AppKey[RouterCore] = web.AppKey("core", RouterCore)
UPSTREAM = web.AppKey("upstream", UpstreamClient)
DRAINING: web.AppKey[asyncio.Event] = web.AppKey("draining", asyncio.Event)
PASSTHROUGH: web.AppKey[Passthrough] = web.AppKey("passthrough", Passthrough)
# time.monotonic() when the router started serving: its index's warm-up is bounded from it
STARTED: web.AppKey[float] = web.AppKey("started", float)


def make_discovery(s: RouterSettings) -> Discovery:
    if s.discovery.mode == "kubernetes":
        from .kube_discovery import KubernetesDiscovery

        return KubernetesDiscovery(s.discovery)
    if s.discovery.mode == "file":
        assert s.discovery.file
        return FileDiscovery(s.discovery.file)
    return StaticDiscovery(s.discovery.backends)


def make_upstream(s: RouterSettings) -> UpstreamClient:
    return UpstreamClient(s.connect_timeout_s, s.upstream_timeout_s)


async def _read_body(
    request: web.Request, limit: int, timeout: float, offload: Offload
) -> bytes:
    length = request.content_length
    if length is not None and length > limit:
        raise RequestError(
            413, f"the request body ({length} bytes) is over the limit of {limit} bytes"
        )
    try:
        async with asyncio.timeout(timeout):
            raw = await request.read()
    except TimeoutError:
        raise RequestError(408, f"the request body did not arrive within {timeout:g}s",
                           close=True) from None  # fmt: skip
    except web.HTTPRequestEntityTooLarge:
        raise RequestError(413, f"the request body is over the limit of {limit} bytes") from None
    except web.RequestPayloadError as exc:
        raise RequestError(400, f"the request body cannot be read: {exc}", close=True) from None
    coding = request.headers.get("Content-Encoding", "identity").strip().lower()
    if coding == "identity":
        return raw
    # inflated here, bounded and off the loop: aiohttp's server does it on the loop, as the
    # bytes arrive (a small deflate body of zeros held every other client for seconds)
    return await offload.run(len(raw) * 64, inflate, raw, coding, limit)


async def _completions(request: web.Request, kind: Kind) -> web.StreamResponse:
    app = request.app
    s = app[SETTINGS]
    core = app[CORE]
    offload = core.offload
    raw = await _read_body(request, s.max_body_bytes, s.body_timeout_s, offload)
    salt = request.headers.get(s.salt_header) if s.salt_header else None
    # with a tokenizer the prompt's messages are rendered later: they must stay in this process
    apart = not core.keyer.renders
    parsed, raw = await offload.run(len(raw), parse_for_routing, raw, kind, salt,
                                    s.salt_header_wins, apart, apart=apart)  # fmt: skip
    previous = parsed.responses and parsed.responses["previous_response_id"]
    if previous:
        # a Responses API follow-up: only the engine that stored its history can answer
        route = await core.pinned(parsed, previous)
    else:
        route = await core.route(parsed, request.headers, len(raw))
    return await forward(request, route, raw, core.ledger, app[UPSTREAM])


async def completions(request: web.Request) -> web.StreamResponse:
    return await _completions(request, "completions")


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _completions(request, "chat")


async def responses(request: web.Request) -> web.StreamResponse:
    return await _completions(request, "responses")


async def stored_response(request: web.Request) -> web.StreamResponse:
    """GET, DELETE or cancel of a stored response: at the engine holding it, or a 404."""
    core = request.app[CORE]
    response_id = request.match_info["response_id"]
    holder = await core.responses.holder(response_id)
    core.check_holder(holder, response_id, "response_id")
    assert holder is not None
    data = None
    if request.method == "POST":
        s = request.app[SETTINGS]
        data = await _read_body(request, s.max_body_bytes, s.body_timeout_s, core.offload)
    return await request.app[PASSTHROUGH].to(request, request.method, data, holder)


async def passthrough_json(request: web.Request) -> web.StreamResponse:
    s = request.app[SETTINGS]
    raw = await _read_body(request, s.max_body_bytes, s.body_timeout_s, request.app[CORE].offload)
    return await request.app[PASSTHROUGH].json_post(request, raw)


async def passthrough_multipart(request: web.Request) -> web.StreamResponse:
    return await request.app[PASSTHROUGH].multipart_post(request)


async def passthrough_get(request: web.Request) -> web.StreamResponse:
    return await request.app[PASSTHROUGH].get(request)


async def models(request: web.Request) -> web.Response:
    backends = request.app[CORE].backends
    s = request.app[SETTINGS]
    names = sorted(s.models) if s.models else sorted(backends.served_models())
    if not names and not backends.healthy():
        raise RequestError(503, "no healthy backend is available", retry_after=1)
    data = [{"id": n, "object": "model", "owned_by": "prefix-router"} for n in names]
    return web.json_response({"object": "list", "data": data})


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    core = request.app[CORE]
    healthy = len(core.backends.healthy())
    draining = request.app[DRAINING].is_set()
    # a new replica routes its first request on the fleet's caches: with KV events, once it
    # read every engine's replay, bounded (an engine whose replay never answers waits no one)
    started = request.app.get(STARTED)
    waited = started is not None and time.monotonic() - started >= core.settings.events.ready_wait_s
    warm = core.index.warm() or waited
    body = {
        "ready": healthy > 0 and not draining and warm,
        "draining": draining,
        "index": "warm" if warm else "warming",
        "backends": len(core.backends.all()),
        "healthy_backends": healthy,
        "store": "degraded" if core.store.stats().degraded else "ok",
    }
    return web.Response(
        status=200 if body["ready"] else 503, text=json.dumps(body),
        content_type="application/json",
    )


def _metrics_page(app: web.Application) -> web.Response:
    core = app[CORE]
    core.metrics.show_store(core.index.entries(), core.store.stats())
    return web.Response(
        body=generate_latest(core.metrics.registry), headers={"Content-Type": CONTENT_TYPE_LATEST}
    )


async def metrics(request: web.Request) -> web.Response:
    return _metrics_page(request.app)


def build_app(settings: RouterSettings, discovery: Discovery | None = None) -> web.Application:
    app = web.Application(middlewares=[errors_as_json], client_max_size=settings.max_body_bytes)
    logging.getLogger("aiohttp.server").addFilter(CLIENT_MISTAKES)  # once: filters are a set
    if not settings.expose_routing:
        app.on_response_prepare.append(server_header)
    app[SETTINGS] = settings
    app[DRAINING] = asyncio.Event()
    core = app[CORE] = build_core(settings)
    passthrough = app[PASSTHROUGH] = Passthrough(core)
    backends = core.backends
    the_discovery = discovery or make_discovery(settings)

    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        upstream = app[UPSTREAM] = make_upstream(settings)
        backends.on_gone(upstream.forget)
        backends.on_hung(upstream.abort)  # what waits on a hung engine goes to another
        # health probes and scrapes: off the forwarding path, with their own timeouts
        probes = aiohttp.ClientSession(skip_auto_headers=("User-Agent",))
        await core.start()
        await passthrough.start()
        health = HealthLoop(settings.health, backends, core.load, core.index, core.metrics, probes,
                            on_metrics=core.states.scraped,
                            gauges=core.dispatch.saturation.engine_report)  # fmt: skip

        def on_change(urls: Sequence[str]) -> None:
            backends.set_members(urls)

        await the_discovery.start(on_change, backends.mark_leaving)
        app[STARTED] = time.monotonic()
        await health.probe_once()
        health.start()
        try:
            yield
        finally:
            await health.stop()
            await the_discovery.stop()
            await core.close()
            await passthrough.close()
            await upstream.close()
            await probes.close()

    app.cleanup_ctx.append(lifecycle)
    app.router.add_post("/v1/completions", completions, expect_handler=expect_continue)
    app.router.add_post(
        "/v1/chat/completions", chat_completions, expect_handler=expect_continue
    )
    app.router.add_post("/v1/responses", responses, expect_handler=expect_continue)
    app.router.add_get("/v1/responses/{response_id}", stored_response)
    app.router.add_delete("/v1/responses/{response_id}", stored_response)
    app.router.add_post("/v1/responses/{response_id}/cancel", stored_response)
    for path in JSON_POSTS:
        app.router.add_post(path, passthrough_json, expect_handler=expect_continue)
    for path in MULTIPART_POSTS:
        app.router.add_post(path, passthrough_multipart, expect_handler=expect_continue)
    for path in GETS:
        app.router.add_get(path, passthrough_get)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    if settings.metrics_port is None:
        app.router.add_get("/metrics", metrics)
    return app


def metrics_app(app: web.Application) -> web.Application:
    """/metrics alone, for a port of its own (settings.metrics_port)."""
    m = web.Application()

    async def show(request: web.Request) -> web.Response:
        return _metrics_page(app)

    m.router.add_get("/metrics", show)
    return m


async def serve(
    settings: RouterSettings,
    stop: asyncio.Event,
    ready: Callable[[int], None] | None = None,
    metrics_ready: Callable[[int], None] | None = None,
) -> None:
    """Serve until `stop` is set, then drain: readiness fails at once (the pod leaves its
    Service's endpoints), the listener keeps serving for `drain_grace_s` (clients that have
    not heard yet are still served), then closes, and requests in flight get up to
    `shutdown_timeout_s` to finish. `ready` gets the bound port (useful with port 0), after
    `metrics_ready` the bound metrics port (when /metrics has a port of its own)."""
    app = build_app(settings)
    # handler_cancellation: a client that disconnects cancels its handler, and so its upstream
    runner = web.AppRunner(
        app, handler_cancellation=True, access_log=None,
        shutdown_timeout=settings.shutdown_timeout_s,
        keepalive_timeout=settings.keepalive_timeout_s,
        # bodies come as sent: inflated by the router itself, bounded and off the loop
        auto_decompress=False,
        # after an answer that closes the connection, the rest of a slow body is not waited
        # for: aiohttp's default reads on for 10 s
        lingering_time=1.0,
    )
    await runner.setup()
    site = web.TCPSite(runner, settings.host, settings.port, backlog=1024, reuse_address=True)
    await site.start()
    side = None
    if settings.metrics_port is not None:
        side = web.AppRunner(metrics_app(app), access_log=None)
        await side.setup()
        await web.TCPSite(side, settings.host, settings.metrics_port).start()
        bound = side.addresses[0][1] if side.addresses else settings.metrics_port
        log.info("/metrics on %s:%d", settings.host, bound)
        if metrics_ready:
            metrics_ready(bound)
    port = runner.addresses[0][1] if runner.addresses else settings.port
    log.info(
        "prefix-router listening on %s:%d policy=%s backends=%d",
        settings.host, port, settings.policy, len(app[CORE].backends.all()),
    )
    if ready:
        ready(port)
    try:
        await stop.wait()
        app[DRAINING].set()
        app[CORE].dispatch.drain()  # what waits for an engine goes to another replica now
        log.info("draining: not ready; serving for %gs more", settings.drain_grace_s)
        await asyncio.sleep(settings.drain_grace_s)
        log.info("closing the listener; requests in flight get %gs", settings.shutdown_timeout_s)
    finally:
        await runner.cleanup()
        if side is not None:
            await side.cleanup()
