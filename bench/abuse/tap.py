"""A recording, fault-injecting HTTP proxy in front of each engine simulator, in a process of
its own: `python -m bench.abuse.tap --control PORT --pair LISTEN=UPSTREAM ...`.

The router's side of the wire is what the abuse run checks: which headers and which
`cache_salt` reached an engine, and which requests an engine took when it hung or died.
The simulators cannot say, so every one sits behind this tap, which passes requests through
and records, per backend, the request ids (`rid-N` in a prompt) it saw, held or cut, and the
headers of header probes (`hdrprobe-N`).

Faults it makes (POST /hang/<i>, /unhang/<i> on the control port): a hung engine, whose
/health still answers while every request it takes waits forever (a stream gets its status
line first, as vLLM sends it). An engine killed for real (its simulator SIGKILLed by the
bench) is mirrored as the router would see it: no connection (the tap aborts it unanswered),
and a request in flight cut off.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
from collections.abc import Iterable

import aiohttp
from aiohttp import web

RID = re.compile(rb"rid-(\d+)")
PROBE = re.compile(rb"hdrprobe-(\d+)")
_HOP = frozenset(("host", "content-length", "transfer-encoding", "connection", "keep-alive"))
_BACK = ("Content-Type",)


class Backend:
    """One simulator behind the tap, and what the tap saw of its traffic."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.hung = False
        self.seen: list[int] = []
        self.held: list[int] = []
        self.cut: list[int] = []
        self.probes: dict[int, dict[str, object]] = {}


def rid_of(body: bytes) -> int | None:
    m = RID.search(body)
    return int(m.group(1)) if m else None


def _json(body: bytes) -> dict[str, object]:
    with contextlib.suppress(ValueError):
        if isinstance(parsed := json.loads(body), dict):
            return parsed
    return {}


def probe_record(headers: Iterable[tuple[str, str]], body: bytes) -> dict[str, object] | None:
    """What a header probe brought to the engine: its headers (every one, in order, repeats
    kept) and the body's cache_salt."""
    m = PROBE.search(body)
    return None if not m else {"id": int(m.group(1)), "headers": [[k, v] for k, v in headers],
                               "cache_salt": _json(body).get("cache_salt")}


def is_stream(body: bytes) -> bool:
    return _json(body).get("stream") is True


def make_app(b: Backend, session: aiohttp.ClientSession) -> web.Application:
    async def handle(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        rid = rid_of(body) if request.method == "POST" else None
        if rid is not None:
            b.seen.append(rid)
        probe = probe_record(request.headers.items(), body) if request.method == "POST" else None
        if probe is not None:
            b.probes[int(probe["id"])] = probe  # type: ignore[call-overload]
        if b.hung and request.path.startswith("/v1/"):
            if rid is not None:
                b.held.append(rid)
            if is_stream(body):
                await web.StreamResponse(headers={"Content-Type": "text/event-stream"}).prepare(
                    request)
            await asyncio.Event().wait()  # until the router gives up (handler cancelled)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        started: web.StreamResponse | None = None
        try:
            async with session.request(request.method, b.upstream + request.path_qs,
                                       data=body or None, headers=headers) as up:
                started = web.StreamResponse(status=up.status, headers={
                    k: up.headers[k] for k in _BACK if k in up.headers})
                if up.content_length is not None:
                    started.content_length = up.content_length
                await started.prepare(request)
                async for chunk in up.content.iter_any():
                    await started.write(chunk)
                await started.write_eof()
                return started
        except (aiohttp.ClientError, OSError) as exc:
            if rid is not None and not isinstance(exc, aiohttp.ClientConnectorError):
                b.cut.append(rid)
            if request.transport is not None:  # unanswered: how a dead engine looks
                request.transport.abort()
            return started or web.Response(status=502)

    app = web.Application(client_max_size=64 * 2**20)
    app.router.add_route("*", "/{tail:.*}", handle)
    return app


def control_app(backends: list[Backend]) -> web.Application:
    async def hang(request: web.Request) -> web.Response:
        backends[int(request.match_info["i"])].hung = request.match_info["what"] == "hang"
        return web.json_response({"ok": True})

    async def records(request: web.Request) -> web.Response:
        return web.json_response([{"upstream": b.upstream, "hung": b.hung, "seen": b.seen,
                                   "held": b.held, "cut": b.cut, "probes": b.probes}
                                  for b in backends])

    app = web.Application()
    app.router.add_post("/{what:hang|unhang}/{i:\\d+}", hang)
    app.router.add_get("/records", records)
    app.router.add_get("/health", lambda r: asyncio.sleep(0, web.json_response({})))
    return app


async def serve(control: int, pairs: list[tuple[int, str]]) -> None:
    session = aiohttp.ClientSession(
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=2),
        connector=aiohttp.TCPConnector(limit=0), auto_decompress=False,
        skip_auto_headers=("User-Agent", "Accept-Encoding", "Content-Type"))
    backends = [Backend(up) for _port, up in pairs]
    runners = []
    for (port, _up), b in zip(pairs, backends, strict=True):
        r = web.AppRunner(make_app(b, session), handler_cancellation=True, access_log=None)
        await r.setup()
        await web.TCPSite(r, "127.0.0.1", port, backlog=1024).start()
        runners.append(r)
    r = web.AppRunner(control_app(backends), access_log=None)
    await r.setup()
    await web.TCPSite(r, "127.0.0.1", control).start()
    try:
        await asyncio.Event().wait()
    finally:
        for r in runners:
            await r.cleanup()
        await session.close()


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.abuse.tap", description=__doc__)
    p.add_argument("--control", type=int, required=True)
    p.add_argument("--pair", action="append", required=True, metavar="PORT=UPSTREAM_URL")
    args = p.parse_args()
    pairs = [(int(port), up) for port, up in (x.split("=", 1) for x in args.pair)]
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args.control, pairs))


if __name__ == "__main__":
    main()
