"""OpenAI-style error bodies; every client-visible failure of the router goes through here."""

from __future__ import annotations

import json
from http import HTTPStatus

from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest

_TYPES = {
    400: "invalid_request_error",
    404: "not_found_error",
    413: "invalid_request_error",
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


def error_body(
    status: int, message: str, param: str | None = None, code: str | None = None
) -> bytes:
    return json.dumps(
        {
            "error": {
                "message": message,
                "type": _TYPES.get(status, "server_error"),
                "param": param,
                "code": code,
            }
        }
    ).encode()


def error_response(err: RequestError) -> web.Response:
    headers = {"Retry-After": str(err.retry_after)} if err.retry_after is not None else None
    resp = web.Response(
        status=err.status,
        body=error_body(err.status, err.message, err.param, err.code),
        content_type="application/json",
        headers=headers,
    )
    if err.close:
        resp.force_close()  # says `Connection: close`, so the client does not reuse it
    return resp


class _JsonErrorHandler(RequestHandler):
    """aiohttp answers a request it cannot parse (a header line over 8 KiB, more headers than it
    allows, a garbled request line) itself, before any handler or middleware runs, in text/plain.
    aiohttp has no hook for that body; this keeps its logging and its close, and says the same
    thing in OpenAI's error JSON, which every client of this API parses."""

    __slots__ = ()  # the same layout as RequestHandler, so a handler's class can be swapped

    def handle_error(
        self,
        request: BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        super().handle_error(request, status, exc, message)  # logs; raises if bytes went out
        try:
            phrase = HTTPStatus(status).phrase
        except ValueError:
            phrase = "bad request"
        # a 500's own message may be a traceback: the client gets only the phrase
        text = phrase if status >= 500 or not message else message
        return error_response(RequestError(status, text, close=True))


class JsonErrorServer(web.Server):
    """The low-level server whose connections answer unparseable requests with error JSON."""

    def __call__(self) -> RequestHandler:
        handler = super().__call__()
        handler.__class__ = _JsonErrorHandler
        return handler
