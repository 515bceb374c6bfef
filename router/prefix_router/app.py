"""HTTP entry: the aiohttp application, its handlers and its lifecycle.

A request's path, top to bottom: `completions` (here) -> parse_request (parsing.py) ->
Router.plan (routing.py: prefix key, lookup, policy) -> forward (proxy.py: upstream, stream,
retry) -> Router.learn (routing.py: record).
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

import aiohttp
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from .backends import BackendSet
from .config import RouterSettings
from .discovery import Discovery, FileDiscovery, StaticDiscovery
from .errors import JsonErrorServer, RequestError, error_body, error_response
from .health import HealthLoop
from .load import LoadTracker
from .metrics import RouterMetrics
from .parsing import Kind, parse_request
from .proxy import forward
from .routing import Router
from .store import LocalStore, TableStore
from .upstream import UpstreamClient

log = logging.getLogger("prefix_router")

ROUTER: web.AppKey[Router] = web.AppKey("router", Router)
# SESSION: health probes and other calls off the hot path; UPSTREAM: forwarding (proxy.py).
SESSION: web.AppKey[aiohttp.ClientSession] = web.AppKey("session", aiohttp.ClientSession)
UPSTREAM: web.AppKey[UpstreamClient] = web.AppKey("upstream", UpstreamClient)
SETTINGS: web.AppKey[RouterSettings] = web.AppKey("settings", RouterSettings)


def make_store(s: RouterSettings) -> TableStore:
    if s.store.mode == "redis":
        from .redis_store import RedisStore  # only imported where a shared store is configured

        return RedisStore(s)
    return LocalStore(
        s.block_size, s.kv_capacity_tokens, s.ttl_seconds, s.max_table_entries, s.max_owners
    )


def make_discovery(s: RouterSettings) -> Discovery:
    if s.discovery.mode == "kubernetes":
        from .kube_discovery import KubernetesDiscovery

        return KubernetesDiscovery(s.discovery)
    if s.discovery.mode == "file":
        assert s.discovery.file
        return FileDiscovery(s.discovery.file)
    return StaticDiscovery(s.discovery.backends)


@web.middleware
async def errors_as_json(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    try:
        return await handler(request)
    except RequestError as err:
        return error_response(err)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        message = exc.reason or "error"
        if exc.status == 404:
            message = f"no route for {request.method} {request.path}"
        elif exc.status == 405:
            allowed = exc.headers.get("Allow", "")
            message = f"{request.method} is not allowed on {request.path} (allowed: {allowed})"
        return web.Response(
            status=exc.status,
            body=error_body(exc.status, message),
            content_type="application/json",
            headers={k: v for k, v in exc.headers.items() if k.lower() == "allow"},
        )
    except (asyncio.CancelledError, ConnectionResetError):
        raise
    except Exception:
        log.exception("unexpected error on %s %s", request.method, request.path)
        return web.Response(
            status=500,
            body=error_body(500, "internal router error"),
            content_type="application/json",
        )


async def _read_body(request: web.Request, limit: int) -> bytes:
    length = request.content_length
    if length is not None and length > limit:
        raise RequestError(
            413, f"the request body ({length} bytes) is over the limit of {limit} bytes"
        )
    try:
        return await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise RequestError(413, f"the request body is over the limit of {limit} bytes") from None
    except web.RequestPayloadError as exc:
        # e.g. a Content-Encoding the body does not decode with
        raise RequestError(400, f"the request body cannot be read: {exc}", close=True) from None


async def _completions(request: web.Request, kind: Kind) -> web.StreamResponse:
    app = request.app
    s = app[SETTINGS]
    router = app[ROUTER]
    raw = await _read_body(request, s.max_body_bytes)
    salt = request.headers.get(s.salt_header) if s.salt_header else None
    parsed = parse_request(raw, kind, salt)
    plan = await router.plan(parsed)
    return await forward(request, plan, raw, router, app[UPSTREAM])


async def completions(request: web.Request) -> web.StreamResponse:
    return await _completions(request, "completions")


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _completions(request, "chat")


async def models(request: web.Request) -> web.Response:
    router = request.app[ROUTER]
    s = request.app[SETTINGS]
    names = sorted(s.models) if s.models else sorted(router.backends.served_models())
    if not names and not router.backends.healthy():
        raise RequestError(503, "no healthy backend is available", retry_after=1)
    data = [{"id": n, "object": "model", "owned_by": "prefix-router"} for n in names]
    return web.json_response({"object": "list", "data": data})


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    router = request.app[ROUTER]
    healthy = len(router.backends.healthy())
    body = {
        "ready": healthy > 0,
        "backends": len(router.backends.all()),
        "healthy_backends": healthy,
        "store": "degraded" if router.store.degraded else "ok",
    }
    return web.Response(
        status=200 if healthy else 503, text=json.dumps(body), content_type="application/json"
    )


async def metrics(request: web.Request) -> web.Response:
    router = request.app[ROUTER]
    router.metrics.table_entries.set(router.store.entries())
    router.metrics.store_degraded.set(1 if router.store.degraded else 0)
    trips = router.metrics.store_round_trips
    trips.labels("request").set(getattr(router.store, "round_trips", 0))
    trips.labels("timer").set(getattr(router.store, "timer_round_trips", 0))
    router.metrics.store_slow_lookups.set(getattr(router.store, "slow_lookups", 0))
    router.metrics.store_budget.set(getattr(router.store, "budget_ms", 0.0) / 1000.0)
    router.metrics.set_working_set(getattr(router.store, "working_set_tokens", None))
    return web.Response(
        body=generate_latest(router.metrics.registry), headers={"Content-Type": CONTENT_TYPE_LATEST}
    )


def build_app(
    settings: RouterSettings, discovery: Discovery | None = None, store: TableStore | None = None
) -> web.Application:
    app = web.Application(middlewares=[errors_as_json], client_max_size=settings.max_body_bytes)
    app[SETTINGS] = settings
    backends = BackendSet(settings.health.eject_after_failures, settings.health.readmit_after_s)
    the_store = store or make_store(settings)
    router = Router(settings, backends, the_store, LoadTracker(), RouterMetrics())
    app[ROUTER] = router
    if hasattr(the_store, "load_source"):
        the_store.load_source = router.load  # type: ignore[attr-defined]
    backends.on_gone(the_store.drop_backend)
    backends.on_gone(router.load.forget)
    backends.on_gone(router.left)
    the_discovery = discovery or make_discovery(settings)

    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        connector = aiohttp.TCPConnector(
            limit=0, limit_per_host=0, keepalive_timeout=60, enable_cleanup_closed=True
        )
        timeout = aiohttp.ClientTimeout(
            total=None,
            sock_connect=settings.connect_timeout_s,
            sock_read=settings.upstream_timeout_s,
        )
        session = aiohttp.ClientSession(
            connector=connector,
            timeout=timeout,
            auto_decompress=False,
            skip_auto_headers=("User-Agent",),
        )
        app[SESSION] = session
        upstream = UpstreamClient(settings.connect_timeout_s, settings.upstream_timeout_s)
        app[UPSTREAM] = upstream
        backends.on_gone(upstream.forget)
        await the_store.start()
        health = HealthLoop(
            settings.health, backends, router.load, the_store, router.metrics, session
        )

        def on_change(urls: Sequence[str]) -> None:
            added, _removed = backends.set_members(urls)
            router.joined(added)

        await the_discovery.start(on_change)
        await health.probe_once()
        health.start()
        try:
            yield
        finally:
            await health.stop()
            await the_discovery.stop()
            await the_store.close()
            await upstream.close()
            await session.close()

    app.cleanup_ctx.append(lifecycle)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    return app


async def serve(settings: RouterSettings, ready: Callable[[int], None] | None = None) -> None:
    """Run until cancelled. `ready` gets the bound port (useful with port 0)."""
    app = build_app(settings)
    # handler_cancellation: a client that disconnects cancels its handler, and so its upstream.
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    # aiohttp builds its server in setup() and offers no factory for it
    runner.server.__class__ = JsonErrorServer  # type: ignore[union-attr]
    site = web.TCPSite(runner, settings.host, settings.port, backlog=1024, reuse_address=True)
    await site.start()
    sock = site._server.sockets[0] if site._server and site._server.sockets else None  # type: ignore[union-attr]
    port = sock.getsockname()[1] if isinstance(sock, socket.socket) else settings.port
    log.info(
        "prefix-router listening on %s:%d policy=%s backends=%d",
        settings.host,
        port,
        settings.policy,
        len(app[ROUTER].backends.all()),
    )
    if ready:
        ready(port)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
