"""Processes beside the router, apart from the attacking one. `--control PORT LISTEN=UPSTREAM
...`: a proxy in front of each engine simulator, recording what reached the engine (ids
`rid-N`: taken, held while hung, cut; headers and cache_salt of `hdrprobe-N`), and hanging an
engine on demand (POST /hang/<i>, /unhang/<i>): its /health answers, requests wait forever (a
stream gets its status line first, as vLLM's). `--probe URL`: GET URL/healthz every 50 ms, a
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


def fields(body: bytes) -> dict[str, Any]:
    with contextlib.suppress(ValueError, AttributeError):
        return dict(json.loads(body).items())
    return {}


def proxy(b: dict[str, Any], session: aiohttp.ClientSession) -> web.Application:
    """`b`: what the tap saw of one engine's traffic (its records), and whether it hangs."""
    async def handle(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        rid, doc = int(m[1]) if (m := RID.search(body)) else None, fields(body)
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

    app = web.Application(client_max_size=64 * 2**20)
    app.router.add_route("*", "/{tail:.*}", handle)
    return app


async def tap(control: int, pairs: list[str]) -> None:
    backends = [{"upstream": p.split("=", 1)[1], "hung": False, "seen": [], "held": [],
                 "cut": [], "probes": {}} for p in pairs]

    async def hang(request: web.Request) -> web.Response:
        backends[int(request.match_info["i"])]["hung"] = request.match_info["what"] == "hang"
        return web.json_response({})

    async def records(request: web.Request) -> web.Response:
        return web.json_response(backends)

    ctl = web.Application()
    ctl.router.add_post("/{what:hang|unhang}/{i:\\d+}", hang)
    ctl.router.add_get("/records", records)
    async with aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=2),
            connector=aiohttp.TCPConnector(limit=0), auto_decompress=False,
            skip_auto_headers=("User-Agent", "Accept-Encoding", "Content-Type")) as session:
        for port, app in [(control, ctl), *((int(p.split("=")[0]), proxy(b, session))
                                            for p, b in zip(pairs, backends, strict=True))]:
            runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", port, backlog=1024).start()
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
        asyncio.run(probe(sys.argv[2]) if sys.argv[1] == "--probe" else
                    tap(int(sys.argv[2]), sys.argv[3:]))
