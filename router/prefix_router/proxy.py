"""Forward one routed request: try its backends in order, each try an Attempt (attempt.py).

A request is sent to the next candidate only while no engine can have answered it: it never
reached one (refused, no connection in time, closed before any byte) or one said 502/503.
One the engine took and did not answer within `upstream_timeout_s` is a 504, not sent again
(the engine may still be working on it); one cut because its engine hangs (its progress
counters stood still while requests waited there: progress.py) goes to the next candidate.

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
import re

from aiohttp import web

from .attempt import Attempt, Ledger, Route
from .errors import RequestError, error_body
from .responses import created_id, read_json, read_response_json, read_response_sse, read_sse
from .upstream import (
    UpstreamClient,
    UpstreamConnectError,
    UpstreamConnectTimeout,
    UpstreamError,
    UpstreamHung,
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
# how a stream's last event ends: chat and completions' `[DONE]`, the Responses API's
# terminal events (it sends no `[DONE]`)
_LAST_EVENTS = (b"data: [DONE]", b"response.completed", b"response.failed",
                b"response.incomplete")
_RETRY_STATUS = frozenset((502, 503))


def _ends_answer(tail: bytes) -> bool:
    """Whether the stream's last bytes hold its last event."""
    end = tail[-512:]
    return any(e in end for e in _LAST_EVENTS)


class _Retry(Exception):
    """This attempt failed before any engine could have answered: try the next candidate."""

    def __init__(self, outcome: str, why: object) -> None:
        super().__init__(f"{outcome}: {why}")
        self.outcome = outcome


def upstream_headers(request: web.Request) -> dict[str, str]:
    """The client's headers less the hop-by-hop ones (those named in its Connection header
    too), with the forwarding headers by one rule (docs/router-http.md): the lists, Forwarded
    and X-Forwarded-For, keep every hop the client sent and get the router's peer appended
    (only the last entry is the router's word); the single values, X-Real-IP,
    X-Forwarded-Host and X-Forwarded-Proto, are the router's own, whatever the client sent."""
    h = request.headers
    drop = _DROP_REQUEST
    named = h.get("Connection")
    if named:
        drop = drop | {n.strip().lower() for n in named.split(",")}
    out = {k: v for k, v in h.items() if k.lower() not in drop and k.lower() not in _FORWARDING}
    peer = request.remote
    # several fields of one list header are one list (RFC 9110, 5.3): all of it, then the
    # peer (named in Connection it is hop-by-hop: dropped like the others, ours starts anew)
    for name, ours in (("X-Forwarded-For", peer), ("Forwarded", _forwarded_element(request))):
        given = () if name.lower() in drop else h.getall(name, ())
        chain = [*given, *([ours] if ours else [])]
        if chain:
            out[name] = ", ".join(chain)
    if peer:
        out["X-Real-IP"] = peer
    if "Host" in h:  # HTTP/1.0 may send none; aiohttp's request.host would look one up
        out["X-Forwarded-Host"] = h["Host"]
    out["X-Forwarded-Proto"] = request.scheme
    return out


_FORWARDING = frozenset(
    ("forwarded", "x-forwarded-for", "x-real-ip", "x-forwarded-host", "x-forwarded-proto")
)
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")


def _forwarded_element(request: web.Request) -> str:
    """This hop as RFC 7239 writes it: for= the peer, host= the Host it asked for, proto=."""
    pairs: list[tuple[str, str]] = []
    if request.remote:
        # an IPv6 address is written in brackets, and quoted (RFC 7239, 6)
        pairs.append(("for", f"[{request.remote}]" if ":" in request.remote else request.remote))
    if "Host" in request.headers:
        pairs.append(("host", request.headers["Host"]))
    pairs.append(("proto", request.scheme))
    return ";".join(f"{k}={_quoted(v)}" for k, v in pairs)


def _quoted(value: str) -> str:
    if _TOKEN.fullmatch(value):
        return value
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


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
                if not led.backends.takes(backend):
                    continue
                if tried:
                    led.metrics.retries.inc()
                tried += 1
                try:
                    with led.backends.trying(backend), \
                            Attempt(led, self.route, backend) as attempt:
                        try:
                            return await self.attempt(attempt)
                        except asyncio.CancelledError:
                            if not attempt.whole:
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
        resp = web.Response(status=status, body=body, headers=self.response_headers(answer, a))
        if 200 <= status < 300:
            parsed = self.route.parsed
            if parsed.responses is not None:
                text, usage, rid = read_response_json(body)
                if rid:
                    await a.stored(rid)  # before the client can name it
                a.done(text, usage)
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
        self.ledger.backends.answered(a.backend)  # a stream on probation need not end first
        sniff = bytearray(first)
        # a Responses stream names its response in its first event: known before it is passed
        stored = self.route.parsed.responses is None or await self._stored(a, sniff)
        tail = first
        try:
            await resp.write(first)
            async for data in chunks:
                a.chunk()
                tail = data
                if len(sniff) < _MAX_SNIFF:
                    sniff += data
                if not stored:
                    stored = await self._stored(a, sniff)
                await resp.write(data)
        except asyncio.CancelledError:
            # A client that read the answer's last event may close before the stream's end
            # reaches it (many do): the answer was delivered whole, and counts so.
            if _ends_answer(tail):
                self._done(a, sniff)
            raise
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
            if _ends_answer(tail):
                self._done(a, sniff)
            else:
                a.failed("client_gone", at_fault=False)
            return resp
        self._done(a, sniff)
        try:
            await resp.write_eof()
        except ConnectionResetError:
            pass  # the client had the whole answer and left before the stream's last chunk
        return resp

    def _done(self, a: Attempt, sniff: bytearray) -> None:
        parsed = self.route.parsed
        if parsed.responses is not None:
            a.done(*read_response_sse(bytes(sniff))[:2])
        else:
            a.done(*read_sse(bytes(sniff), parsed.kind))

    async def _stored(self, a: Attempt, sniff: bytearray) -> bool:
        """Whether the stream's response id was seen (and its engine remembered)."""
        rid = created_id(bytes(sniff))
        if rid is None:
            return len(sniff) >= _MAX_SNIFF  # not within the sniffed bytes: give up
        await a.stored(rid)
        return True

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
    if isinstance(exc, UpstreamHung):  # cut by the router: the engine will not answer it
        return _retry(a, "hung", exc)
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
