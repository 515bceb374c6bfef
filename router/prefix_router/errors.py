"""OpenAI-style error bodies; every client-visible failure of the router goes through here,
and the log lines about clients' mistakes (without their bytes)."""

from __future__ import annotations

import asyncio
import functools
import json
import logging
from collections.abc import Awaitable, Callable

import aiohttp
from aiohttp import ClientPayloadError, web
from aiohttp.http_exceptions import HttpProcessingError

log = logging.getLogger("prefix_router")

# OpenAI's error types, where not the default: invalid_request_error (4xx), server_error (5xx).
_TYPES = {
    404: "not_found_error",
    429: "rate_limit_error",
    502: "upstream_error",
    503: "service_unavailable",
    504: "timeout",
}


class RequestError(Exception):
    """A request the router refuses; carries what the client is told."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        retry_after: int | None = None,
        close: bool = False,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.retry_after = retry_after
        # The connection cannot carry another request (its body could not be read to its end).
        self.close = close

    def __reduce__(self) -> tuple[object, ...]:
        # raised in the parsing process (offload.py) and re-raised here: keep every field
        return (functools.partial(RequestError, param=self.param, code=self.code,
                                  retry_after=self.retry_after, close=self.close),
                (self.status, self.message))  # fmt: skip


def error_body(
    status: int, message: str, param: str | None = None, code: str | None = None
) -> bytes:
    return json.dumps(
        {
            "error": {
                "message": message,
                "type": _TYPES.get(
                    status, "invalid_request_error" if status < 500 else "server_error"
                ),
                "param": param,
                "code": code,
            }
        }
    ).encode()


def error_response(err: RequestError, headers: dict[str, str] | None = None) -> web.Response:
    if err.retry_after is not None:
        headers = {**(headers or {}), "Retry-After": str(err.retry_after)}
    resp = web.Response(
        status=err.status,
        body=error_body(err.status, err.message, err.param, err.code),
        content_type="application/json",
        headers=headers,
    )
    if err.close:
        resp.force_close()  # says `Connection: close`, so the client does not reuse it
    return resp


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
        allow = {k: v for k, v in exc.headers.items() if k.lower() == "allow"}
        return error_response(RequestError(exc.status, message), allow)
    except (asyncio.CancelledError, ConnectionResetError):
        raise
    except Exception:
        log.exception("unexpected error on %s %s", request.method, request.path)
        return error_response(RequestError(500, "internal router error"))


async def expect_continue(request: web.Request) -> web.StreamResponse | None:
    """`Expect: 100-continue` is answered so the client sends its body; any other
    expectation gets a 417 in OpenAI's error JSON (aiohttp's own answer is text/plain)."""
    expect = request.headers.get("Expect", "")
    if expect.lower() == "100-continue":
        limit = request.client_max_size
        if request.content_length is not None and request.content_length > limit:
            # refused before the client uploads it
            return error_response(RequestError(
                413, f"the request body ({request.content_length} bytes) is over the limit "
                f"of {limit} bytes", close=True))
        if request.version >= aiohttp.HttpVersion11:
            await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        return None
    return error_response(RequestError(417, f"unknown expectation: {expect[:100]!r}"))


async def server_header(request: web.Request, response: web.StreamResponse) -> None:
    """Clients are not told which server software, or which version, answers them."""
    response.headers["Server"] = "prefix-router"


class _ClientMistakes(logging.Filter):
    """aiohttp logs a request it cannot parse (a garbled line, a broken chunked or gzip
    body) with its traceback, whose text can hold the client's bytes: the prompt. A client's
    mistake is an INFO line naming its kind, without them."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        cause = exc
        while cause is not None and not isinstance(cause, _MISTAKES):
            cause = cause.__cause__ or cause.__context__
        if cause is not None:
            record.msg = "refused a malformed request: %s"
            record.args = (type(cause).__name__,)
            record.exc_info = None
            record.exc_text = None
            record.levelno, record.levelname = logging.INFO, "INFO"
        return True


_MISTAKES = (HttpProcessingError, web.RequestPayloadError, ClientPayloadError)
CLIENT_MISTAKES = _ClientMistakes()
