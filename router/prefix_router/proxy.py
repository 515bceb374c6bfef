"""Forward one planned request upstream, retrying on the next candidate before the first byte.

Upstream requests go through `UpstreamClient` (upstream.py), a lean keep-alive HTTP/1.1
client, not aiohttp's. Streaming responses are passed through chunk by chunk as they arrive (no
buffering on the way to the client; a copy is kept, bounded, to learn the answer afterwards).
A client that goes away cancels this handler (the app runs with handler cancellation), which
closes the upstream connection, which makes the engine abort the request.

A stream's status line and headers go to the client as soon as an engine answers 200, before
its first token, as the engine itself sends them: the client's own work on them then overlaps
the engine's prefill instead of adding to the time to the first token (measured with
`python -m bench first-chunk`, bench/results/first-chunk/). Until the first chunk of the body
a failure is still retried on the next candidate, into the same response; a stream that no
engine can start after that ends with an SSE error event (`data: {"error": ...}` then
`data: [DONE]`, as vLLM ends a stream that fails), since its 200 is already sent.
"""

from __future__ import annotations

import asyncio
import logging
import time

import aiohttp
from aiohttp import web

from .errors import RequestError, error_body
from .responses import read_json, read_sse
from .routing import Plan, Router
from .upstream import UpstreamClient, UpstreamConnectTimeout, UpstreamError, UpstreamResponse

log = logging.getLogger("prefix_router.proxy")

# Request headers not to pass on (hop-by-hop, or set by the upstream client: Host and
# Content-Length; aiohttp has already decoded a body sent with a Content-Encoding).
_DROP_REQUEST = frozenset(
    h.lower()
    for h in (
        "host",
        "content-length",
        "content-encoding",
        "connection",
        "keep-alive",
        "transfer-encoding",
        "te",
        "trailer",
        "upgrade",
        "proxy-authorization",
        "proxy-connection",
        "accept-encoding",
    )
)
_PASS_RESPONSE = ("content-type", "x-request-id", "openai-processing-ms")
_MAX_SNIFF = 4 * 1024 * 1024
# Bytes waiting for a slow client above which the engine is no longer read (and TCP slows it
# down), and below which reading resumes.
_CLIENT_HIGH_WATER = 256 * 1024
_CLIENT_LOW_WATER = 64 * 1024
_DRAIN_POLL_S = 0.005
_RETRY_STATUS = frozenset((502, 503))


class _Retryable(Exception):
    pass


class _Client:
    """The client's side of one request: its stream, once its headers were sent, and whether
    the attempt in progress has had its first byte counted (`router.first_byte`, once)."""

    __slots__ = ("first", "stream")

    def __init__(self) -> None:
        self.stream: web.StreamResponse | None = None
        self.first = False


def _timeout(router: Router, backend: str, exc: TimeoutError) -> RequestError:
    """A read timeout: the engine took the request and sent nothing for that long. It counts
    against the backend (a hung engine is ejected like a dead one), but the request is not
    sent again: the engine may still be working on it."""
    router.backends.report_failure(backend, f"timeout: {exc}")
    router.metrics.count_request(backend, "timeout")
    return RequestError(
        504, f"the upstream did not answer within {router.settings.upstream_timeout_s}s"
    )


def _never_reached(router: Router, backend: str, exc: Exception) -> _Retryable:
    """No connection, or none that carried the request: it counts against the backend, and
    the request is as safe to send to the next candidate as if never sent."""
    router.backends.report_failure(backend, f"connect: {exc!r}")
    router.metrics.count_request(backend, "connect_error")
    return _Retryable(f"{type(exc).__name__}: {exc}")


def upstream_headers(request: web.Request) -> dict[str, str]:
    return {k: v for k, v in request.headers.items() if k.lower() not in _DROP_REQUEST}


async def forward(
    request: web.Request,
    plan: Plan,
    raw: bytes,
    router: Router,
    client: UpstreamClient,
) -> web.StreamResponse:
    s = router.settings
    tried: list[str] = []
    headers = upstream_headers(request)
    path = request.path
    candidates = [plan.decision.backend, *plan.decision.order]
    last_error = "no backend could be tried"
    to = _Client()
    try:
        for backend in candidates:
            if len(tried) >= s.max_attempts:
                break
            b = router.backends.get(backend)
            if b is None or not b.healthy:
                continue
            if tried:
                router.metrics.retries.inc()
            tried.append(backend)
            try:
                return await _attempt(
                    request, plan, raw, router, client, backend, headers, path, to
                )
            except _Retryable as exc:
                last_error = str(exc)
                log.warning("attempt on %s failed before the first byte: %s", backend, exc)
                continue
        raise RequestError(
            503, f"no backend could serve the request ({last_error})", retry_after=1
        )
    except RequestError as err:
        if to.stream is None:
            raise
        return await _end_with_error(to.stream, err)


async def _end_with_error(
    stream: web.StreamResponse, err: RequestError, before: bytes = b""
) -> web.StreamResponse:
    """The client's 200 and headers are out: end its stream with the error, as an SSE event
    (after `before`), then `[DONE]`."""
    event = before + b"data: " + error_body(err.status, err.message, err.param, err.code)
    event += b"\n\n"
    try:
        await stream.write(event + b"data: [DONE]\n\n")
        await stream.write_eof()
    except (ConnectionResetError, aiohttp.ClientConnectionResetError):
        pass
    return stream


async def _attempt(
    request: web.Request,
    plan: Plan,
    raw: bytes,
    router: Router,
    client: UpstreamClient,
    backend: str,
    headers: dict[str, str],
    path: str,
    to: _Client,
) -> web.StreamResponse:
    metrics = router.metrics
    prefill = router.dispatch(plan, backend)
    to.first = False
    try:
        sent = time.monotonic()
        if router.is_news(plan, backend):
            # now: a request already queued behind this one must see the new owner
            router.own(plan, backend, news=True)
        else:
            # A hit's record only refreshes its blocks (~35 us for a 2,000-token prompt): it
            # runs when this task first waits (on the answer, or on a new connection), not
            # between the client and the engine.
            asyncio.get_running_loop().call_soon(router.own, plan, backend, False)
        try:
            upstream = await client.post(backend, path, raw, headers)
        except UpstreamConnectTimeout as exc:  # a TimeoutError, but one that never reached it
            raise _never_reached(router, backend, exc) from None
        except TimeoutError as exc:
            raise _timeout(router, backend, exc) from None
        except (UpstreamError, OSError) as exc:
            raise _never_reached(router, backend, exc) from None
        async with upstream:
            if upstream.status in _RETRY_STATUS:
                body = await upstream.read()
                router.backends.report_failure(backend, f"status {upstream.status}")
                metrics.count_request(backend, f"status_{upstream.status}")
                raise _Retryable(f"status {upstream.status}: {body[:200]!r}")
            if plan.parsed.stream and upstream.status == 200:
                return await _stream(
                    request, plan, router, upstream, backend, prefill, to, sent
                )
            try:
                body = await upstream.read()
            except TimeoutError as exc:
                raise _timeout(router, backend, exc) from None
            except UpstreamError as exc:
                # Nothing was sent to the client yet, so another backend can still serve it.
                router.backends.report_failure(backend, f"read: {exc!r}")
                metrics.count_request(backend, "read_error")
                raise _Retryable(f"{type(exc).__name__}: {exc}") from None
            to.first = True
            router.first_byte(backend, prefill)
            metrics.ttft.observe(time.perf_counter() - plan.started)
            outcome = "ok" if upstream.status < 400 else f"status_{upstream.status}"
            if to.stream is not None:
                # a retry that did not stream (an error status): the client's 200 is out
                metrics.count_request(backend, outcome)
                raise RequestError(
                    upstream.status if upstream.status >= 400 else 502,
                    f"{backend} answered {upstream.status}: {body[:500].decode(errors='replace')}",
                )
            resp = web.Response(
                status=upstream.status,
                body=body,
                headers=_response_headers(upstream, plan, backend),
            )
            metrics.count_request(backend, outcome)
            if upstream.status == 200:
                router.backends.report_success(backend)
                answer, usage = read_json(body, plan.parsed.kind)
                router.learn(plan, backend, answer, usage)
            return resp
    finally:
        if not to.first:
            router.first_byte(backend, prefill)
        router.finished(backend)


class _Relay:
    """After the first chunk, the rest of a stream goes from the engine's connection straight
    to the client's transport, in the upstream connection's callback (upstream.relay): HTTP/1.1
    chunked framing as aiohttp writes it, a bounded copy kept to learn the answer. Why: a
    task switch and a write through aiohttp per token was most of the router's CPU. `bench
    run` (system-prompts, 24 req/s, 60 s, `router_cpu_ms_per_request`, 2026-12-04): 4.80 ms
    a request before, 3.71 ms relayed; what is left is mostly the two socket calls per token."""

    __slots__ = ("backend", "chunked", "gone", "router", "sniff", "transport")

    def __init__(
        self,
        request: web.Request,
        resp: web.StreamResponse,
        first: bytes,
        router: Router,
        backend: str,
    ) -> None:
        self.transport = request.transport
        self.router = router
        self.backend = backend
        # aiohttp chose chunked framing when it prepared the response (HTTP/1.1, no length);
        # an HTTP/1.0 client gets the raw bytes and the end of the connection.
        self.chunked = resp.headers.get("Transfer-Encoding", "").lower() == "chunked"
        self.sniff = bytearray(first)
        self.gone = False

    def write(self, data: bytes) -> bool:
        self.router.beat(self.backend)
        t = self.transport
        if t is None or t.is_closing():
            self.gone = True
            return False
        if self.chunked:
            t.write(b"%x\r\n%b\r\n" % (len(data), data))
        else:
            t.write(data)
        if len(self.sniff) < _MAX_SNIFF:
            self.sniff += data
        return t.get_write_buffer_size() <= _CLIENT_HIGH_WATER

    async def drained(self) -> None:
        # Polling, not aiohttp's drain: that waiter lives in its private writer (the public
        # StreamResponse.drain is deprecated). Only a client slower than the engine gets here.
        t = self.transport
        while (  # noqa: ASYNC110
            t is not None and not t.is_closing() and t.get_write_buffer_size() > _CLIENT_LOW_WATER
        ):
            await asyncio.sleep(_DRAIN_POLL_S)
        if t is None or t.is_closing():
            self.gone = True


def _response_headers(upstream: UpstreamResponse, plan: Plan, backend: str) -> dict[str, str]:
    out = {k: upstream.headers[k] for k in _PASS_RESPONSE if k in upstream.headers}
    out["x-routed-to"] = backend
    out["x-route-reason"] = plan.decision.reason
    return out


async def _stream(
    request: web.Request,
    plan: Plan,
    router: Router,
    upstream: UpstreamResponse,
    backend: str,
    prefill: float,
    to: _Client,
    sent: float,
) -> web.StreamResponse:
    metrics = router.metrics
    resp = to.stream
    if resp is None:
        resp = web.StreamResponse(
            status=upstream.status, headers=_response_headers(upstream, plan, backend)
        )
        resp.headers.setdefault("Content-Type", "text/event-stream")
        resp.headers["Cache-Control"] = "no-cache"
        await resp.prepare(request)
        to.stream = resp
    # Until the first chunk a failure can still be retried elsewhere, into this response.
    try:
        chunk = await upstream.readany()
    except TimeoutError as exc:
        raise _timeout(router, backend, exc) from None
    except UpstreamError as exc:
        router.backends.report_failure(backend, f"stream: {exc!r}")
        metrics.count_request(backend, "read_error")
        raise _Retryable(f"{type(exc).__name__}: {exc}") from None
    if not chunk:
        router.backends.report_failure(backend, "empty stream")
        raise _Retryable("the upstream closed the stream before any data")
    to.first = True
    router.first_byte(backend, prefill)
    router.first_token(backend, sent)
    metrics.ttft.observe(time.perf_counter() - plan.started)
    relay: _Relay | None = None
    try:
        await resp.write(chunk)
        relay = _Relay(request, resp, chunk, router, backend)
        upstream.relay(relay.write)
        while not await upstream.relayed():
            # the client reads slower than the engine writes: wait for it, then go on
            if relay.gone:
                raise ConnectionResetError("the client went away")
            await relay.drained()
            upstream.resume()
        if relay.gone:
            raise ConnectionResetError("the client went away")
        sniff = relay.sniff
    except (UpstreamError, TimeoutError) as exc:
        # Bytes already reached the client; the stream can only be ended, not retried. It
        # ends with an error event, as vLLM ends a stream that fails, so the client can tell
        # a cut answer from a whole one.
        router.backends.report_failure(backend, f"stream cut: {exc!r}")
        log.warning("stream from %s cut after the first byte: %r", backend, exc)
        metrics.count_request(backend, "stream_cut")
        sent_so_far = relay.sniff if relay is not None else chunk
        # an event the engine had half sent is closed first, so the error is an event of its own
        sep = b"" if sent_so_far.endswith(b"\n\n") else b"\n\n"
        err = RequestError(502, f"the stream from {backend} was cut: {exc}")
        await _end_with_error(resp, err, sep)
        return resp
    except (asyncio.CancelledError, ConnectionResetError):
        # The client went away (its handler cancelled, or a write to it failed): leaving
        # `async with upstream` closes the upstream connection, so the engine aborts.
        metrics.count_request(backend, "client_gone")
        raise
    metrics.count_request(backend, "ok")
    try:
        await resp.write_eof()
    except (ConnectionResetError, aiohttp.ClientConnectionResetError):
        pass
    router.backends.report_success(backend)
    answer, usage = read_sse(bytes(sniff), plan.parsed.kind)
    router.learn(plan, backend, answer, usage)
    return resp
