"""Forward one routed request: try its backends in order, each try an Attempt (attempt.py).

A request is sent to the next candidate only while no engine can have answered it: it never
reached one (refused, no connection in time, closed before any byte) or one said 502/503.
One the engine took and did not answer within `upstream_timeout_s` is a 504, not sent again
(the engine may still be working on it).

Streams: the status line and headers go to the client as soon as an engine answers 200,
before its first token, as the engine sends them, so the client's own work on them overlaps
the engine's prefill. Until the first chunk of the body a failure is still retried on the
next candidate, into the same response; a stream that fails after that, or that no engine
can start, ends with an SSE error event then `data: [DONE]`, as vLLM ends a stream that
fails. Chunks pass through as they arrive (a bounded copy is kept to learn the answer).
A client that goes away cancels this handler (the app runs with handler cancellation),
which closes the upstream connection, which makes the engine abort the request.
"""

from __future__ import annotations

import asyncio
import logging

from aiohttp import web

from .attempt import Attempt, Ledger, Route
from .errors import RequestError, error_body
from .responses import (
    created_id,
    read_json,
    read_response_json,
    read_response_sse,
    read_sse,
)
from .upstream import (
    UpstreamClient,
    UpstreamConnectError,
    UpstreamConnectTimeout,
    UpstreamError,
    UpstreamResponse,
    UpstreamTimeout,
)

log = logging.getLogger("prefix_router.proxy")

# Request headers not passed on: hop-by-hop ones, and those the upstream client sets (Host,
# Content-Length; aiohttp has already decoded a body sent with a Content-Encoding).
_DROP_REQUEST = frozenset((
    "host", "content-length", "content-encoding", "connection", "keep-alive", "transfer-encoding",
    "te", "trailer", "upgrade", "proxy-authorization", "proxy-connection", "accept-encoding",
))  # fmt: skip
_PASS_RESPONSE = ("content-type", "x-request-id", "openai-processing-ms")
_MAX_SNIFF = 4 * 1024 * 1024
_FIRST_EVENT = 64 * 1024  # where a Responses stream's response.created must have ended
_RETRY_STATUS = frozenset((502, 503))


class _Retry(Exception):
    """This attempt failed before any engine could have answered: try the next candidate."""

    def __init__(self, outcome: str, why: object) -> None:
        super().__init__(f"{outcome}: {why}")
        self.outcome = outcome


def upstream_headers(request: web.Request) -> dict[str, str]:
    """The client's headers less the hop-by-hop ones (those named in its Connection header
    too), with the client's address appended to X-Forwarded-For."""
    h = request.headers
    drop = _DROP_REQUEST
    named = h.get("Connection")
    if named:
        drop = drop | {n.strip().lower() for n in named.split(",")}
    out = {k: v for k, v in h.items() if k.lower() not in drop and k.lower() != "x-forwarded-for"}
    # several X-Forwarded-For fields are one list (RFC 9110, 5.3): all of it, then the client
    # (named in Connection it is hop-by-hop: dropped like the others, then ours starts anew)
    given = () if "x-forwarded-for" in drop else h.getall("X-Forwarded-For", ())
    chain = [*given, *([request.remote] if request.remote else [])]
    if chain:
        out["X-Forwarded-For"] = ", ".join(chain)
    return out


class _Forward:
    """One request's forwarding: its candidates, and the client's stream once started."""

    __slots__ = ("headers", "ledger", "raw", "request", "route", "stream", "upstream")

    def __init__(
        self, request: web.Request, route: Route, raw: bytes, ledger: Ledger, up: UpstreamClient
    ) -> None:
        self.request = request
        self.route = route
        self.raw = raw
        self.ledger = ledger
        self.upstream = up
        self.headers = upstream_headers(request)
        self.stream: web.StreamResponse | None = None

    async def run(self) -> web.StreamResponse:
        led = self.ledger
        d = self.route.decision
        tried = 0
        last = "no backend could be tried"
        try:
            for backend in (d.backend, *d.order):
                if tried >= led.settings.max_attempts:
                    break
                b = led.backends.get(backend)
                if b is None or not b.healthy:
                    continue
                if tried:
                    led.metrics.retries.inc()
                tried += 1
                try:
                    with Attempt(led, self.route, backend) as attempt:
                        try:
                            return await self.attempt(attempt)
                        except asyncio.CancelledError:
                            attempt.failed("client_gone", at_fault=False)
                            raise
                except _Retry as exc:
                    last = str(exc) if led.settings.expose_routing else exc.outcome
                    log.warning("attempt on %s failed before the first byte: %s", backend, exc)
            raise RequestError(503, f"no backend could serve the request ({last})", retry_after=1)
        except RequestError as err:
            if self.stream is None:
                raise
            return await _end_with_error(self.stream, err)

    async def attempt(self, a: Attempt) -> web.StreamResponse:
        try:
            answer = await self.upstream.post(a.backend, self.request.path, self.raw, self.headers)
        except (UpstreamError, UpstreamTimeout) as exc:
            raise _unanswered(a, exc) from None
        try:
            status = answer.status
            if status in _RETRY_STATUS:
                await answer.read()
                raise _retry(a, f"status_{status}", f"status {status}")
            a.answered(status)
            if self.route.parsed.stream and status == 200:
                return await self.relay(a, answer)
            return await self.whole(a, answer)
        finally:
            answer.close()

    async def whole(self, a: Attempt, answer: UpstreamResponse) -> web.StreamResponse:
        try:
            body = await answer.read()
        except (UpstreamError, UpstreamTimeout) as exc:
            raise _unanswered(a, exc) from None
        a.first_byte(streamed=False)
        status = answer.status
        if self.stream is not None:
            # a retry that did not stream (an error status): the client's 200 is out
            a.failed(f"status_{status}", at_fault=False)
            raise RequestError(
                status if status >= 400 else 502,
                f"{self.name(a)} answered {status}: {body[:500].decode(errors='replace')}",
            )
        parsed = self.route.parsed
        stored = None
        if 200 <= status < 300 and parsed.responses is not None:
            stored = read_response_json(body)
            if stored[2]:
                await a.stored(stored[2])
        resp = web.Response(status=status, body=body, headers=self.response_headers(answer, a))
        if 200 <= status < 300:
            if stored is not None:
                a.done(*stored)
            else:
                a.done(*read_json(body, parsed.kind))
        else:
            # the engine refused the request (its answer goes to the client as it is); a
            # client's bad request must not eject an engine
            a.failed(f"status_{status}", at_fault=False)
        return resp

    async def relay(self, a: Attempt, answer: UpstreamResponse) -> web.StreamResponse:
        resp = self.stream
        if resp is None:
            resp = web.StreamResponse(status=200, headers=self.response_headers(answer, a))
            resp.headers.setdefault("Content-Type", "text/event-stream")
            resp.headers["Cache-Control"] = "no-cache"
            await resp.prepare(self.request)
            self.stream = resp
        chunks = answer.chunks()
        try:
            first = await anext(chunks, b"")
        except (UpstreamError, UpstreamTimeout) as exc:
            raise _unanswered(a, exc) from None
        if not first:
            raise _retry(a, "read_error", "the upstream closed the stream before any data")
        a.first_byte(streamed=True)
        sniff = bytearray(first)
        # a Responses stream's id is remembered at its first event, not its end: a background
        # response is read back or cancelled by id while it still streams
        named = self.route.parsed.responses is None
        try:
            named = named or await _named(a, sniff)
            await resp.write(first)
            async for data in chunks:
                a.chunk()
                if len(sniff) < _MAX_SNIFF:
                    sniff += data
                named = named or await _named(a, sniff)
                await resp.write(data)
        except (UpstreamError, UpstreamTimeout) as exc:
            # Bytes already reached the client: the stream can only be ended, with an error
            # event, so the client can tell a cut answer from a whole one.
            a.failed("stream_cut", f"stream cut: {exc!r}")
            log.warning("stream from %s cut after the first byte: %r", a.backend, exc)
            sep = b"" if sniff.endswith(b"\n\n") else b"\n\n"  # close a half-sent event
            err = RequestError(502, f"the stream from {self.name(a)} was cut")
            return await _end_with_error(resp, err, sep)
        except ConnectionResetError:
            # the client went away: leaving closes the upstream, so the engine aborts
            a.failed("client_gone", at_fault=False)
            return resp
        await resp.write_eof()
        parsed = self.route.parsed
        if parsed.responses is not None:
            a.done(*read_response_sse(bytes(sniff)))
        else:
            a.done(*read_sse(bytes(sniff), parsed.kind))
        return resp

    def response_headers(self, answer: UpstreamResponse, a: Attempt) -> dict[str, str]:
        h = answer.headers
        out = {k: h[k] for k in _PASS_RESPONSE if k in h}
        if self.ledger.settings.expose_routing:
            out["x-routed-to"] = a.backend
            out["x-route-reason"] = self.route.decision.reason
        return out

    def name(self, a: Attempt) -> str:
        """The engine as a client may be told of it."""
        return a.backend if self.ledger.settings.expose_routing else "the engine"


async def _named(a: Attempt, sniff: bytearray) -> bool:
    """Whether the stream's first event has come (and named its response to the attempt,
    before the client is sent it)."""
    if (rid := created_id(bytes(sniff[:_FIRST_EVENT]))) is not None:
        await a.stored(rid)
        return True
    return len(sniff) >= _FIRST_EVENT  # an id that late is not looked for again


def _retry(a: Attempt, outcome: str, why: object) -> _Retry:
    a.failed(outcome, f"{outcome}: {why}")
    return _Retry(outcome, why)


def _unanswered(a: Attempt, exc: UpstreamError | UpstreamTimeout) -> Exception:
    """A failure before any byte reached the client. A request that never reached the engine,
    or got nothing whole back, goes to the next candidate. One the engine took and sent nothing
    for that long is a 504: it counts against the backend (a hung engine is ejected like a
    dead one), but the request is not sent again."""
    if isinstance(exc, UpstreamConnectError | UpstreamConnectTimeout):
        return _retry(a, "connect_error", exc)
    if isinstance(exc, UpstreamError):
        return _retry(a, "read_error", exc)
    a.failed("timeout", f"timeout: {exc}")
    limit = a.ledger.settings.upstream_timeout_s
    log.warning("%s sent nothing for %gs: 504", a.backend, limit)
    return RequestError(504, f"the upstream did not answer within {limit:g}s")


async def _end_with_error(
    stream: web.StreamResponse, err: RequestError, before: bytes = b""
) -> web.StreamResponse:
    """The client's 200 and headers are out: end its stream with the error as an SSE event
    (after `before`), then `[DONE]`."""
    event = before + b"data: " + error_body(err.status, err.message, err.param, err.code)
    try:
        await stream.write(event + b"\n\ndata: [DONE]\n\n")
        await stream.write_eof()
    except ConnectionResetError:
        pass
    return stream


async def forward(
    request: web.Request, route: Route, raw: bytes, ledger: Ledger, upstream: UpstreamClient
) -> web.StreamResponse:
    return await _Forward(request, route, raw, ledger, upstream).run()
