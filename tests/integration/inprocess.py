"""The router and stub engines run in the test's own event loop, for faults only a stub can
be made to show in order (a stream held open, a request that hangs)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

from aiohttp import web
from aiohttp.test_utils import TestServer

from prefix_router.app import serve
from prefix_router.config import RouterSettings

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


async def serve_router(s: RouterSettings) -> tuple[str, str, asyncio.Event, asyncio.Task[None]]:
    """The router as `prefix-router` runs it: its URL, its /metrics page, how to stop it."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    bound: asyncio.Future[int] = loop.create_future()
    metrics: asyncio.Future[int] = loop.create_future()
    task = asyncio.create_task(serve(s, stop, bound.set_result, metrics.set_result))
    url = f"http://127.0.0.1:{await asyncio.wait_for(bound, 30)}"
    return url, f"http://127.0.0.1:{await asyncio.wait_for(metrics, 30)}/metrics", stop, task


@contextlib.asynccontextmanager
async def stub_engine(chat: Handler) -> AsyncIterator[str]:
    """An engine whose /health answers and whose chat completions `chat` answers: its URL."""

    async def health(request: web.Request) -> web.Response:
        return web.json_response({})

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_post("/v1/chat/completions", chat)
    server = TestServer(app)
    await server.start_server()
    try:
        yield str(server.make_url("")).rstrip("/")
    finally:
        await server.close()
