"""The endpoints with no prompt prefix worth routing by, passed through to an engine.

Each goes to the least-loaded healthy engine serving the body's `model` (several models can
sit behind one router), with the chat path's limits (`max_body_bytes`, `body_timeout_s`),
timeouts, OpenAI-style errors, hop-by-hop rules and metrics: the request counts as load on
its engine from send to end, and an engine that refuses the connection or answers 502/503
before taking it is followed by the next one. Multipart uploads (audio) are streamed to the
engine: only the form fields before the file are read here, to learn the model.

These go through aiohttp's client, not the router's own upstream client (upstream/): that
one is built for the prefix-routed POSTs (keep-alive pools measured on the hot path) and
sends whole bodies, while these need other methods and streamed uploads.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import AsyncIterator, Sequence

import aiohttp
import msgspec
from aiohttp import web

from .backends import Backend
from .core import RouterCore
from .errors import RequestError
from .proxy import upstream_headers
from .scheduling.filters import eligible

log = logging.getLogger("prefix_router.passthrough")

# vLLM's paths (its OpenAI-compatible server), JSON bodies
JSON_POSTS = (
    "/v1/embeddings", "/v1/rerank", "/rerank", "/v2/rerank", "/v1/score", "/score",
    "/pooling", "/classify", "/tokenize", "/detokenize",
)  # fmt: skip
MULTIPART_POSTS = ("/v1/audio/transcriptions", "/v1/audio/translations")
GETS = ("/version",)

_PASS_RESPONSE = ("content-type", "x-request-id")
_RETRY_STATUS = frozenset((502, 503))
_MODEL_FIELD = re.compile(rb'content-disposition:[^\r\n]*\bname="model"', re.IGNORECASE)
_FILE_PART = re.compile(rb'content-disposition:[^\r\n]*\bfilename=', re.IGNORECASE)


class _Model(msgspec.Struct):
    model: str | None = None


_MODEL = msgspec.json.Decoder(_Model)


def model_of_json(raw: bytes) -> str | None:
    try:
        return _MODEL.decode(raw).model
    except msgspec.ValidationError:
        raise RequestError(400, "'model' must be a string", param="model") from None
    except msgspec.DecodeError as exc:
        raise RequestError(400, f"the request body is not a JSON object: {exc}") from None


def model_of_form(head: bytes) -> tuple[str | None, bool]:
    """(the `model` field's value, whether the head is complete enough to tell): the fields
    a multipart body carries before its file part."""
    m = _MODEL_FIELD.search(head)
    f = _FILE_PART.search(head)
    if f is not None and (m is None or f.start() < m.start()):
        return None, True  # the file comes first
    if m is not None:
        start = head.find(b"\r\n\r\n", m.end())
        end = head.find(b"\r\n--", start + 4) if start >= 0 else -1
        if end >= 0:
            return head[start + 4 : end].decode(errors="replace").strip(), True
    return None, False


def least_loaded(core: RouterCore, backends: Sequence[Backend]) -> list[str]:
    load = core.load
    return [b.url for b in sorted(backends, key=lambda b: (load.inflight(b.url), b.url))]


class Passthrough:
    """The client session these use, and their handlers."""

    def __init__(self, core: RouterCore) -> None:
        self.core = core
        self.session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        s = self.core.settings
        timeout = aiohttp.ClientTimeout(
            sock_connect=s.connect_timeout_s, sock_read=s.upstream_timeout_s
        )
        # no cookies, nothing the client did not send, bodies passed as they come
        self.session = aiohttp.ClientSession(
            timeout=timeout, auto_decompress=False, cookie_jar=aiohttp.DummyCookieJar(),
            skip_auto_headers=("User-Agent", "Accept-Encoding"),
        )

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()

    async def json_post(self, request: web.Request, raw: bytes) -> web.StreamResponse:
        model = model_of_json(raw)
        return await self._relay(request, "POST", raw, model, retry=True)

    async def to(
        self, request: web.Request, method: str, data: bytes | None, backend: str
    ) -> web.StreamResponse:
        """To the one engine that can answer (it holds what the request names)."""
        with self.core.backends.trying(backend):
            resp = await self._try(request, backend, method, data, upstream_headers(request))
        if isinstance(resp, web.StreamResponse):
            return resp
        raise RequestError(503, f"the engine holding it could not answer ({resp})",
                           retry_after=1)  # fmt: skip

    async def get(self, request: web.Request) -> web.StreamResponse:
        return await self._relay(request, "GET", None, None, retry=True)

    async def multipart_post(self, request: web.Request) -> web.StreamResponse:
        s = self.core.settings
        limit = s.max_body_bytes
        if request.content_length is not None and request.content_length > limit:
            raise RequestError(
                413, f"the request body ({request.content_length} bytes) is over the limit "
                f"of {limit} bytes"
            )
        if not request.content_type.startswith("multipart/form-data"):
            raise RequestError(400, "the request body must be multipart/form-data")
        head = bytearray()
        model: str | None = None
        try:
            async with asyncio.timeout(s.body_timeout_s):
                while True:
                    model, told = model_of_form(bytes(head))
                    if told or request.content.at_eof():
                        break
                    chunk = await request.content.readany()
                    if not chunk:
                        break
                    head += chunk
                    if len(head) > limit:
                        raise RequestError(413, f"the request body is over {limit} bytes")
        except TimeoutError:
            raise RequestError(
                408, f"the request body did not arrive within {s.body_timeout_s:g}s", close=True
            ) from None

        served = s.models or self.core.backends.served_models()
        if model is None and len(served) > 1:
            # the file comes first: the model would be known only once it is all read here
            raise RequestError(
                400, "the form's 'model' field must come before its file when the router "
                "serves several models", param="model",
            )

        async def body() -> AsyncIterator[bytes]:
            sent = len(head)
            yield bytes(head)
            async for chunk in request.content.iter_any():
                sent += len(chunk)
                if sent > limit:
                    raise RequestError(413, f"the request body is over {limit} bytes")
                yield chunk

        # the body is read once: it goes to another engine only if none of it was sent
        return await self._relay(request, "POST", body(), model, retry=False)

    async def _relay(
        self, request: web.Request, method: str, data: bytes | AsyncIterator[bytes] | None,
        model: str | None, retry: bool,
    ) -> web.StreamResponse:
        core = self.core
        s = core.settings
        if model:
            backends = eligible(core.backends, frozenset(s.models), model)
        else:  # none named (GET /version, say): any engine answers
            backends = core.backends.healthy()
            if not backends:
                raise RequestError(503, "no healthy backend is available", retry_after=1)
        # the client's Content-Type passes (a multipart boundary with it); aiohttp frames the
        # body: Content-Length for bytes, chunked for a stream
        headers = upstream_headers(request)
        last = "no backend could be tried"
        tried = 0
        for backend in least_loaded(core, backends):
            if tried >= s.max_attempts:
                break
            if not core.backends.takes(backend):
                continue  # on probation with a request already there
            tried += 1
            with core.backends.trying(backend):
                resp = await self._try(request, backend, method, data, headers)
            if isinstance(resp, web.StreamResponse):
                return resp
            last = resp
            if not retry and resp != "connect_error":
                break
        raise RequestError(503, f"no backend could serve the request ({last})", retry_after=1)

    async def _try(
        self, request: web.Request, backend: str, method: str,
        data: bytes | AsyncIterator[bytes] | None, headers: dict[str, str],
    ) -> web.StreamResponse | str:
        """The engine's answer passed on, or the outcome that lets the next engine try."""
        core = self.core
        assert self.session is not None
        load, metrics = core.load, core.metrics
        load.start(backend, 0.0)
        metrics.set_inflight(backend, load.own_inflight(backend))
        url = backend.rstrip("/") + request.rel_url.raw_path_qs
        stream: web.StreamResponse | None = None
        try:
            async with self.session.request(method, url, data=data, headers=headers,
                                            allow_redirects=False) as up:  # fmt: skip
                if up.status in _RETRY_STATUS:
                    metrics.count_request(backend, f"status_{up.status}")
                    core.backends.report_failure(backend, f"status {up.status}")
                    return f"status_{up.status}"
                out = {k: up.headers[k] for k in _PASS_RESPONSE if k in up.headers}
                stream = web.StreamResponse(status=up.status, headers=out)
                await stream.prepare(request)
                async for chunk in up.content.iter_any():
                    await stream.write(chunk)
                await stream.write_eof()
                ok = 200 <= up.status < 300
                metrics.count_request(backend, "ok" if ok else f"status_{up.status}")
                if ok:
                    core.backends.report_success(backend)
                return stream
        except RequestError:
            raise  # the client's body over the limit, met while it was streamed
        except aiohttp.ClientConnectorError as exc:
            metrics.count_request(backend, "connect_error")
            core.backends.report_failure(backend, f"connect_error: {exc}")
            return "connect_error"
        except (TimeoutError, aiohttp.ClientError) as exc:
            outcome = "timeout" if isinstance(exc, TimeoutError) else "read_error"
            metrics.count_request(backend, outcome)
            core.backends.report_failure(backend, outcome)
            if stream is not None:  # bytes reached the client: the answer can only be cut
                log.warning("%s on %s after the answer began: %r", outcome, backend, exc)
                return stream
            if outcome == "timeout":
                limit = core.settings.upstream_timeout_s
                raise RequestError(
                    504, f"the upstream did not answer within {limit:g}s"
                ) from None
            return outcome
        finally:
            load.first_byte(backend, 0.0)
            load.finish(backend)
            metrics.set_inflight(backend, load.own_inflight(backend))
