"""Processes beside the router, apart from the attacking one. `LISTEN=UPSTREAM ...`: a proxy in
front of each engine simulator, recording what reached the engine (ids `rid-N`: taken, held
while hung, cut; headers and cache_salt of `hdrprobe-N`; GET /_tap/records), and hanging it on
demand (POST /_tap/hang, /_tap/unhang): its /health answers, requests wait forever (a stream
gets its status line first, as vLLM's). `--probe URL`: GET URL/healthz every 50 ms, a
line each (seconds, ok): the attacker's own CPU cannot delay a probe."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import sys
import time
from typing import Any

import aiohttp
from aiohttp import web

RID, PROBE = re.compile(rb"rid-(\d+)"), re.compile(rb"hdrprobe-(\d+)")
HOP = ("host", "content-length", "transfer-encoding", "connection", "keep-alive")


def proxy(b: dict[str, Any], session: aiohttp.ClientSession) -> web.Application:
    """`b`: what the tap saw of one engine's traffic (its records), and whether it hangs."""
    async def handle(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        rid, doc = int(m[1]) if (m := RID.search(body)) else None, {}
        with contextlib.suppress(ValueError, AttributeError):
            doc = dict(json.loads(body).items())
        b["seen"] += [rid] if rid is not None else []
        if m := PROBE.search(body):
            b["probes"][int(m[1])] = {"headers": [[k, v] for k, v in request.headers.items()],
                                      "cache_salt": doc.get("cache_salt")}
        if b["hung"] and request.path.startswith("/v1/"):
            b["held"] += [rid] if rid is not None else []
            if doc.get("stream") is True:
                await web.StreamResponse(headers={"Content-Type": "text/event-stream"}).prepare(
                    request)
            await asyncio.Event().wait()  # until the router gives up (handler cancelled)
        started = None
        try:
            async with session.request(request.method, b["upstream"] + request.path_qs,
                                       data=body or None, headers={
                    k: v for k, v in request.headers.items() if k.lower() not in HOP}) as up:
                started = web.StreamResponse(status=up.status, headers={
                    k: up.headers[k] for k in ("Content-Type",) if k in up.headers})
                started.content_length = up.content_length  # None: chunked, as the engine's
                await started.prepare(request)
                async for chunk in up.content.iter_any():
                    await started.write(chunk)
                await started.write_eof()
                return started
        except (aiohttp.ClientError, OSError) as exc:
            if rid is not None and not isinstance(exc, aiohttp.ClientConnectorError):
                b["cut"].append(rid)
            if request.transport is not None:  # unanswered: how a dead engine looks
                request.transport.abort()
            return started or web.Response(status=502)

    async def control(request: web.Request) -> web.Response:  # POST hang, unhang; GET records
        if request.method == "POST":
            b["hung"] = request.match_info["what"] == "hang"
        return web.json_response(b)

    app = web.Application(client_max_size=64 * 2**20)
    app.router.add_route("*", "/_tap/{what}", control)
    app.router.add_route("*", "/{tail:.*}", handle)
    return app


async def tap(pairs: list[str]) -> None:
    async with aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=2),
            connector=aiohttp.TCPConnector(limit=0), auto_decompress=False,
            skip_auto_headers=("User-Agent", "Accept-Encoding", "Content-Type")) as session:
        for port, upstream in (p.split("=", 1) for p in pairs):
            runner = web.AppRunner(proxy({"upstream": upstream, "hung": False, "seen": [], "held": [
                ], "cut": [], "probes": {}}, session), handler_cancellation=True, access_log=None)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", int(port), backlog=1024).start()
        await asyncio.Event().wait()


async def probe(url: str) -> None:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as s:
        while True:
            t0, ok = time.monotonic(), False
            with contextlib.suppress(aiohttp.ClientError, TimeoutError, OSError):
                async with s.get(url + "/healthz", timeout=aiohttp.ClientTimeout(5)) as r:
                    ok = r.status == 200 and bool(await r.read())
            took = time.monotonic() - t0
            print(f"{took:.6f} {int(ok)}", flush=True)
            await asyncio.sleep(max(0.0, 0.05 - took))


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(probe(sys.argv[2]) if sys.argv[1] == "--probe" else tap(sys.argv[1:]))
