"""Request bodies a client compressed (Content-Encoding), inflated up to the body limit."""

from __future__ import annotations

import zlib

from .errors import RequestError

# zlib's window bits: gzip's header, or zlib's (deflate as HTTP names it), either accepted
_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": 32 + 15}


def inflate(raw: bytes, coding: str, limit: int) -> bytes:
    """The body `raw` decoded, never more than `limit` bytes of it (a 413 past that: a small
    body can inflate to gigabytes)."""
    wbits = _WBITS.get(coding)
    if wbits is None:
        raise RequestError(415, f"Content-Encoding {coding[:40]!r} is not supported "
                                "(gzip, deflate or none)", close=True)  # fmt: skip
    d = zlib.decompressobj(wbits)
    try:
        out = d.decompress(raw, limit + 1)
        if len(out) > limit or d.unconsumed_tail:
            raise RequestError(413, f"the request body inflates past the limit of {limit} bytes",
                               close=True)  # fmt: skip
        out += d.flush()
        if len(out) > limit:
            raise RequestError(413, f"the request body inflates past the limit of {limit} bytes",
                               close=True)  # fmt: skip
    except zlib.error as exc:
        raise RequestError(400, f"the request body is not valid {coding}: {exc}",
                           close=True) from None  # fmt: skip
    if not d.eof:
        raise RequestError(400, f"the request body is not a whole {coding} stream", close=True)
    return out
