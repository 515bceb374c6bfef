"""The hostile requests, as data: each case is the bytes a client sends (how, and when it
leaves) and the answers that are right for it. Building a case does no I/O; client.py sends
them.

Every prompt starts with the run's marker, so the router's log can be searched for client
bytes afterwards; header and path tricks carry a second marker of their own.
"""

from __future__ import annotations

import gzip
import json
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cache, partial
from typing import Any

MiB = 2**20
CRLF = b"\r\n"
LINGER_S = 10.0  # aiohttp's RequestHandler lingering_time (the router does not set it)
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"

# What a case may end in: an HTTP status ("400"), a class of them ("4xx"), or "closed" (the
# router ended the connection without an answer), "left" (the client left on purpose).
Expect = tuple[str, ...]
ProbeCheck = Callable[[dict[str, Any] | None], list[str]]


@dataclass(frozen=True)
class Ctx:
    """What the cases are built for: the router's model, the markers, the limits it runs with
    and a port nothing but the bench listens on (a client must never make the router call
    it)."""

    model: str
    marker: str  # in every prompt
    tag: str  # in header values and paths
    max_body: int
    canary_port: int


@dataclass(frozen=True)
class Case:
    cls: str
    name: str
    pieces: tuple[bytes, ...]
    expect: Expect
    gap: float = 0.0  # seconds between pieces
    until: str = "reply"  # what the client waits for: reply, close, sent, first-body-byte
    timeout: float = 30.0
    repeat: int = 1
    rst: bool = False
    head: bool = False
    # checked against what the engine received (the tap's record of this probe id)
    probe: int | None = None
    probe_check: ProbeCheck | None = field(default=None, compare=False)
    # the connection must be closed, and answered, by then (seconds from the first byte sent)
    close_within: float | None = None
    answer_within: float | None = None


def meets(status: int | str, expect: Expect) -> bool:
    """Whether an outcome is one the case allows."""
    s = str(status)
    return any(s == e or (e.endswith("xx") and s[:1] == e[0] and s.isdigit()) for e in expect)


def request(method: str, path: str, headers: Sequence[tuple[str, str]] = (),
            body: bytes = b"", *, version: str = "HTTP/1.1", length: bool = True) -> bytes:
    """One request's bytes; Content-Length is added for a body unless `length` is false."""
    lines = [f"{method} {path} {version}".encode()]
    lines += [f"{k}: {v}".encode("latin-1") for k, v in headers]
    if body and length:
        lines.append(b"Content-Length: %d" % len(body))
    return CRLF.join(lines) + CRLF + CRLF + body


def chunked(body: bytes, size: int = 65536) -> bytes:
    """`body` in the chunked transfer coding, ended."""
    pieces = (body[i : i + size] for i in range(0, len(body), size))
    return b"".join(b"%x\r\n" % len(p) + p + CRLF for p in pieces) + b"0\r\n\r\n"


def chat(ctx: Ctx, content: str, **extra: Any) -> dict[str, Any]:
    return {"model": ctx.model, "messages": [{"role": "user", "content": content}],
            "max_tokens": 4, **extra}


def text(ctx: Ctx, tag: str, size: int = 200) -> str:
    """A prompt of about `size` bytes, unique by `tag` from its first block on."""
    head = f"{ctx.marker} {tag} "
    return head + "lorem ipsum dolor " * max(0, (size - len(head)) // 18)


def post(path: str, body: bytes, headers: Sequence[tuple[str, str]] = (), *,
         ctype: str | None = "application/json", close: bool = True,
         version: str = "HTTP/1.1", length: bool = True) -> bytes:
    h = [("Host", "127.0.0.1")]
    if ctype:
        h.append(("Content-Type", ctype))
    h += list(headers)
    if close:
        h.append(("Connection", "close"))
    return request("POST", path, h, body, version=version, length=length)


def js(value: Any) -> bytes:
    return json.dumps(value).encode()


@cache
def bomb(size: int, wbits: int) -> bytes:
    """`size` zero bytes, compressed (gzip: wbits 31, deflate: 15) to about a thousandth."""
    z = zlib.compressobj(9, zlib.DEFLATED, wbits)
    zero = bytes(MiB)
    return b"".join([*(z.compress(zero) for _ in range(size // MiB)), z.flush()])


def body_size(ctx: Ctx) -> list[Case]:
    c, lim = "body size", ctx.max_body

    def padded_to(n: int) -> bytes:
        body = js(chat(ctx, text(ctx, "near-limit", 100)))
        return body[:-1] + b" " * (n - len(body)) + b"}"

    def huge_prompt(n: int, tag: str) -> bytes:
        skel = len(js(chat(ctx, "")))
        return js(chat(ctx, text(ctx, tag, n - skel - 8)))[:n]

    near = huge_prompt(lim - 4096, "near-limit-prompt")
    assert len(near) <= lim, len(near)
    over = padded_to(lim + 1)
    json_gz = gzip.compress(huge_prompt(lim - 4096, "gzip-near-limit"), 1)
    return [
        Case(c, "prompt body 4 KiB under the limit", (post(CHAT, near),), ("400",), repeat=6),
        Case(c, "the same with a gateway salt (the body is rewritten)",
             (post(CHAT, near, [("x-cache-salt", "tenant-a")]),), ("400",), repeat=4),
        Case(c, "short prompt padded to 4 KiB under the limit",
             (post(CHAT, padded_to(lim - 4096)),), ("200",), repeat=3),
        Case(c, "body exactly at the limit", (post(CHAT, padded_to(lim)),), ("200",)),
        Case(c, "one byte over the limit", (post(CHAT, over),), ("413",), repeat=2),
        Case(c, "Content-Length 1 GiB, 64 KiB sent",
             (request("POST", CHAT, [("Host", "x"), ("Content-Type", "application/json"),
                                     ("Content-Length", str(1024 * MiB))], b"{" + bytes(65535),
                      length=False),), ("413",), repeat=2),
        Case(c, "Content-Length of 20 digits",
             (request("POST", CHAT, [("Host", "x"), ("Content-Length", "9" * 20)], b"{}",
                      length=False),), ("400", "413", "closed")),
        Case(c, "chunked, 9 MiB in 64 KiB chunks",
             (post(CHAT, chunked(over + bytes(MiB)), [("Transfer-Encoding", "chunked")],
                   length=False),), ("413",), repeat=2),
        Case(c, f"gzip bomb: {128 * lim // MiB} MiB of zeros", (post(CHAT, bomb(128 * lim, 31), [
            ("Content-Encoding", "gzip")]),), ("413", "400"), repeat=2),
        Case(c, f"deflate bomb: {32 * lim // MiB} MiB of zeros", (post(CHAT, bomb(32 * lim, 15), [
            ("Content-Encoding", "deflate")]),), ("413", "400")),
        Case(c, "gzip of a prompt 4 KiB under the limit", (post(CHAT, json_gz, [
            ("Content-Encoding", "gzip")]),), ("400",), repeat=2),
    ]


def context(ctx: Ctx) -> list[Case]:
    c = "prompt over max_model_len"
    tokens = list(range(1, 100_001))
    many = {"model": ctx.model, "max_tokens": 4, "messages": [
        {"role": "user", "content": text(ctx, f"m{i}", 400)} for i in range(5000)]}
    return [
        Case(c, "200 KB prompt (over the engine's 32k, under twice it: the engine says)",
             (post(CHAT, js(chat(ctx, text(ctx, "ctx-200k", 200_000)))),), ("400",), repeat=3),
        Case(c, "1 MB prompt", (post(CHAT, js(chat(ctx, text(ctx, "ctx-1m", MiB)))),),
             ("400",), repeat=5),
        Case(c, "4 MB completions prompt", (post(COMPLETIONS, js({
            "model": ctx.model, "prompt": text(ctx, "ctx-4m", 4 * MiB), "max_tokens": 4})),),
             ("400",), repeat=3),
        Case(c, "100,000 token ids", (post(COMPLETIONS, js({
            "model": ctx.model, "prompt": tokens, "max_tokens": 4, "user": ctx.marker})),),
             ("400",), repeat=2),
        Case(c, "5,000 messages", (post(CHAT, js(many)),), ("400",), repeat=2),
        Case(c, "max_tokens over the context", (post(CHAT, js(chat(
            ctx, text(ctx, "ctx-maxtok"), max_tokens=10**6))),), ("400",), repeat=2),
    ]


def index_flood(ctx: Ctx, n: int) -> list[Case]:
    """Legal prompts of ~100 KB (25k tokens), each new from its first block: the index's
    memory budget is what bounds the router."""
    return [Case("index flood", "unique 100 KB prompt", (post(CHAT, js(chat(
        ctx, text(ctx, f"flood-{i}", 100_000), max_tokens=1))),), ("200",)) for i in range(n)]


def json_garbage(ctx: Ctx) -> list[Case]:
    c = "JSON"
    good = js(chat(ctx, text(ctx, "json")))
    p = text(ctx, "json").encode()

    def raw_chat(content: bytes, extra: bytes = b"") -> bytes:
        return (b'{"model": "' + ctx.model.encode() + b'", "max_tokens": 4' + extra +
                b', "messages": [{"role": "user", "content": "' + content + b'"}]}')

    cases = [
        ("empty body", b"", ("400",)),
        ("null", b"null", ("400",)),
        ("a list", b"[]", ("400",)),
        ("a string", b'"' + p + b'"', ("400",)),
        ("a number", b"1", ("400",)),
        ("truncated", good[: len(good) // 2], ("400",)),
        ("trailing garbage", good + b" }}", ("400",)),
        ("random bytes", bytes((i * 37 + 11) % 256 for i in range(4096)) + p, ("400",)),
        ("100,000 [ deep", b"[" * 100_000 + p, ("400",)),
        ("50,000 objects deep", b'{"a":' * 50_000 + p, ("400",)),
        ("900 lists deep in the prompt", b'{"model": "%s", "prompt": ' % ctx.model.encode()
         + b"[" * 900 + b"1" + b"]" * 900 + b', "x": "' + p + b'"}', ("400",)),
        ("900 lists deep in tools", raw_chat(p, b', "tools": [' + b"[" * 900 + b"]" * 900
                                               + b"]"), ("200", "400")),
        ("900 objects deep in a content part", b'{"model": "%s", "messages": [{"role": "user",'
         b' "content": [' % ctx.model.encode() + b'{"a":' * 900 + b'"' + p + b'"'
         + b"}" * 900 + b"]}]}", ("200", "400")),
        ("an integer of 5,000 digits", raw_chat(p, b', "n": ' + b"7" * 5000), ("400",)),
        ("max_tokens of 5,000 digits", raw_chat(p, b', "max_tokens": ' + b"9" * 5000), ("400",)),
        ("a float of 1e999999", raw_chat(p, b', "temperature": 1e999999'), ("200", "400")),
        ("NaN and -Infinity", raw_chat(p, b', "temperature": NaN, "top_p": -Infinity'),
         ("200", "400")),
        ("invalid UTF-8 in a string", raw_chat(p + b"\xff\xfe\xc0\xaf"), ("400",)),
        ("a lone surrogate", raw_chat(p + b"\\ud800"), ("400",)),
        ("a lone surrogate in the salt", raw_chat(p, b', "cache_salt": "\\udfff"'), ("400",)),
        ("NUL escapes", raw_chat(p + b"\\u0000\\u0000"), ("200",)),
        ("a byte-order mark", b"\xef\xbb\xbf" + good, ("200", "400")),
        ("UTF-16", json.dumps(chat(ctx, text(ctx, "json"))).encode("utf-16"), ("200", "400")),
        # the last one wins in the router and in the engine alike (both Python's json)
        ("duplicate keys", raw_chat(p, b', "messages": 5'), ("200", "400")),
        ("200,000 keys", b"{" + b", ".join(b'"k%d": 1' % i for i in range(200_000))
         + b', "model": "' + ctx.model.encode() + b'", "messages": [{"role": "user", '
         b'"content": "' + p + b'"}]}', ("200", "400")),
    ]
    return [Case(c, name, (post(CHAT, body),), expect, repeat=2) for name, body, expect in cases]


def wrong_types(ctx: Ctx) -> list[Case]:
    c = "wrong types"
    p = text(ctx, "types")
    m = [{"role": "user", "content": p}]
    chats: list[tuple[str, dict[str, Any], Expect]] = [
        ("model 5", {"model": 5, "messages": m}, ("400",)),
        ("model null", {"model": None, "messages": m}, ("400",)),
        ("model a list", {"model": [ctx.model], "messages": m}, ("400",)),
        ("model unknown", {"model": "no-such-model", "messages": m}, ("400", "404")),
        ("model of 100 KB", {"model": "m" * 100_000, "messages": m}, ("400", "404")),
        ("messages a string", {"model": ctx.model, "messages": p}, ("400",)),
        ("messages empty", {"model": ctx.model, "messages": [], "x": p}, ("400",)),
        ("message a number", {"model": ctx.model, "messages": [5, p]}, ("400",)),
        ("role 5", {"model": ctx.model, "messages": [{"role": 5, "content": p}]}, ("400",)),
        ("content 5", {"model": ctx.model, "messages": [{"role": "user", "content": 5},
                                                         {"role": "user", "content": p}]},
         ("400",)),
        ("content an object", {"model": ctx.model, "messages": [
            {"role": "user", "content": {"text": p}}]}, ("400",)),
        ("content part a number", {"model": ctx.model, "messages": [
            {"role": "user", "content": [5, p]}]}, ("400",)),
        ("stream 'yes'", {"model": ctx.model, "messages": m, "stream": "yes"}, ("400",)),
        ("stream 1", {"model": ctx.model, "messages": m, "stream": 1}, ("400",)),
        ("max_tokens '10'", {"model": ctx.model, "messages": m, "max_tokens": "10"}, ("400",)),
        ("max_tokens -1", {"model": ctx.model, "messages": m, "max_tokens": -1}, ("400",)),
        ("max_tokens 2**64", {"model": ctx.model, "messages": m, "max_tokens": 2**64}, ("400",)),
        ("max_tokens 1e308", {"model": ctx.model, "messages": m, "max_tokens": 1e308},
         ("400",)),
        ("n 1000", {"model": ctx.model, "messages": m, "n": 1000, "max_tokens": 2},
         ("200", "400")),
        ("temperature 'hot'", {"model": ctx.model, "messages": m, "temperature": "hot",
                               "max_tokens": 2}, ("200", "400")),
        ("tools a string", {"model": ctx.model, "messages": m, "tools": p}, ("400",)),
        ("cache_salt 5", {"model": ctx.model, "messages": m, "cache_salt": 5}, ("400",)),
        ("cache_salt an object", {"model": ctx.model, "messages": m, "cache_salt": {}},
         ("400",)),
        ("stream_options a string", {"model": ctx.model, "messages": m, "stream": True,
                                     "stream_options": p}, ("200", "400")),
        ("name an object", {"model": ctx.model, "messages": [
            {"role": "user", "content": p, "name": {"a": [1, 2]}}], "max_tokens": 2},
         ("200", "400")),
    ]
    completions: list[tuple[str, Any, Expect]] = [
        ("prompt 5", 5, ("400",)),
        ("prompt []", [], ("400",)),
        ("prompt [[]]", [[]], ("400",)),
        ("prompt [-1]", [-1], ("400",)),
        ("prompt [2**40]", [2**40], ("400",)),
        ("prompt [true]", [True], ("400",)),
        ("prompt [null]", [None], ("400",)),
        ("prompt an object", {"text": p}, ("400",)),
        ("prompt a batch of strings", [p, p + "2"], ("400",)),
    ]
    out = [Case(c, name, (post(CHAT, js(body)),), expect, repeat=2)
           for name, body, expect in chats]
    out += [Case(c, name, (post(COMPLETIONS, js({"model": ctx.model, "prompt": prompt,
                                                 "max_tokens": 2, "x": p})),), expect, repeat=2)
            for name, prompt, expect in completions]
    return out


def encodings(ctx: Ctx) -> list[Case]:
    c = "encodings"
    body = js(chat(ctx, text(ctx, "enc")))
    secret = text(ctx, "enc-secret", 400).encode()
    head = [("Host", "x"), ("Content-Type", "application/json"), ("Connection", "close")]

    def r(headers: list[tuple[str, str]], data: bytes) -> bytes:
        return request("POST", CHAT, head + headers, data, length=False)

    cases: list[tuple[str, bytes, Expect]] = [
        ("gzip that is not gzip", post(CHAT, secret, [("Content-Encoding", "gzip")]), ("400",)),
        ("truncated gzip", post(CHAT, gzip.compress(body)[:-12], [("Content-Encoding", "gzip")]),
         ("400",)),
        ("valid gzip", post(CHAT, gzip.compress(body), [("Content-Encoding", "gzip")]), ("200",)),
        ("valid deflate", post(CHAT, zlib.compress(body), [("Content-Encoding", "deflate")]),
         ("200",)),
        ("gzip, gzip", post(CHAT, gzip.compress(gzip.compress(body)),
                            [("Content-Encoding", "gzip, gzip")]), ("200", "400", "415")),
        ("br that is not br", post(CHAT, secret, [("Content-Encoding", "br")]),
         ("400", "415")),
        ("an unknown coding (xz)", post(CHAT, secret, [("Content-Encoding", "xz")]),
         ("400", "415")),
        ("valid chunked", r([("Transfer-Encoding", "chunked")], chunked(body, 7)), ("200",)),
        ("chunk extensions and a trailer",
         r([("Transfer-Encoding", "chunked")],
           b"%x;ext=1;q=\"x\"\r\n" % len(body) + body + b"\r\n0\r\nX-Trailer: 1\r\n\r\n"),
         ("200", "400")),
        ("chunk size 'zz'", r([("Transfer-Encoding", "chunked")],
                              b"zz\r\n" + secret + b"\r\n0\r\n\r\n"), ("400",)),
        ("chunk size of 20 hex digits", r([("Transfer-Encoding", "chunked")],
                                          b"f" * 20 + b"\r\n" + secret), ("400", "413")),
        ("chunk longer than its size", r([("Transfer-Encoding", "chunked")],
                                         b"4\r\n" + secret + b"\r\n0\r\n\r\n"), ("400",)),
        ("chunked and gzip, gzip broken", r([("Transfer-Encoding", "chunked"),
                                             ("Content-Encoding", "gzip")], chunked(secret)),
         ("400",)),
        ("Transfer-Encoding and Content-Length (smuggling)",
         r([("Content-Length", "4"), ("Transfer-Encoding", "chunked")],
           b"0\r\n\r\nGET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"), ("400",)),
        ("two different Content-Lengths", r([("Content-Length", str(len(body))),
                                             ("Content-Length", "5")], body), ("400",)),
        ("Content-Length -1", r([("Content-Length", "-1")], body), ("400",)),
        ("Content-Length 1e3", r([("Content-Length", "1e3")], body), ("400",)),
        ("Transfer-Encoding: gzip, chunked", r([("Transfer-Encoding", "gzip, chunked")],
                                               chunked(gzip.compress(body))),
         ("200", "400", "501")),
        ("Transfer-Encoding: xchunked", r([("Transfer-Encoding", "xchunked")], body),
         ("400", "501")),
        ("Transfer-Encoding: chunked, identity", r([("Transfer-Encoding", "chunked, identity")],
                                                   chunked(body)), ("400", "501", "200")),
        ("chunked over HTTP/1.0", request("POST", CHAT, [*head, ("Transfer-Encoding", "chunked")],
                                          chunked(body), version="HTTP/1.0", length=False),
         ("200", "400")),
        ("charset=latin-1 with invalid UTF-8", post(CHAT, body.replace(b"lorem", b"l\xf6rem"),
                                                    ctype="application/json; charset=latin-1"),
         ("400",)),
        ("no Content-Type", post(CHAT, body, ctype=None), ("200",)),
        ("Content-Type text/plain", post(CHAT, body, ctype="text/plain"), ("200",)),
        ("multipart form", post(CHAT, b"--b\r\nContent-Disposition: form-data; name=a\r\n\r\n"
                                + secret + b"\r\n--b--\r\n",
                                ctype="multipart/form-data; boundary=b"), ("400",)),
    ]
    return [Case(c, name, (data,), expect, repeat=2) for name, data, expect in cases]


def slow(ctx: Ctx, keepalive_s: float, body_s: float) -> list[Case]:
    """Slow clients: each connection must be closed by the router's timeouts."""
    c = "slow clients"
    body = js(chat(ctx, text(ctx, "slow", 2000)))
    head = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
            b"\r\nContent-Length: %d\r\n\r\n" % len(body))
    idle = request("GET", "/healthz", [("Host", "x")])
    ka = keepalive_s * 1.5 + 2
    bd = body_s * 1.5 + 2
    # After its 408 the router's server (aiohttp) goes on reading what the client sends for
    # up to its lingering time, 10 s, before it closes.
    bd_close = bd + LINGER_S
    tick = 0.5
    return [
        Case(c, "silent connection", (), ("closed",), until="close", timeout=ka + 10,
             repeat=8, close_within=ka),
        Case(c, "headers a byte at a time", tuple(head[i : i + 1] for i in range(len(head))),
             ("closed",), gap=tick, until="close", timeout=ka + 10, repeat=6, close_within=ka),
        Case(c, "body a byte at a time", (head, *(body[i : i + 1] for i in range(200))),
             ("408",), gap=tick, until="close", timeout=bd_close + 10, repeat=6,
             close_within=bd_close, answer_within=bd),
        Case(c, "idle keep-alive after one request", (idle,), ("200",), until="close",
             timeout=ka + 10, repeat=8, close_within=ka),
        Case(c, "Expect: 100-continue, then no body", (request("POST", CHAT, [
            ("Host", "x"), ("Content-Type", "application/json"), ("Expect", "100-continue"),
            ("Content-Length", str(len(body)))]),), ("408",), until="close",
             timeout=bd_close + 10, repeat=3, close_within=bd_close, answer_within=bd),
        Case(c, "chunked body never ended", (request("POST", CHAT, [
            ("Host", "x"), ("Transfer-Encoding", "chunked")], b"10\r\n" + body[:16] + b"\r\n",
            length=False),), ("408",), until="close", timeout=bd_close + 10, repeat=3,
             close_within=bd_close, answer_within=bd),
    ]


def many_connections(n: int, keepalive_s: float) -> list[Case]:
    ka = keepalive_s * 1.5 + 5
    return [Case("many connections", f"{n} silent connections at once", (), ("closed",),
                 until="close", timeout=ka + 20, repeat=n, close_within=ka)]


def burst(ctx: Ctx, n: int) -> list[Case]:
    return [Case("many connections", f"{n} requests at once",
                 (post(CHAT, js(chat(ctx, text(ctx, f"burst-{i % 8}", 2000)))),), ("200",))
            for i in range(n)]


def headers(ctx: Ctx) -> list[Case]:
    c = "header tricks"
    body = js(chat(ctx, text(ctx, "hdr")))
    t = ctx.tag
    base = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    tail = b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body

    def with_(lines: bytes) -> bytes:
        return base + lines + tail

    cases: list[tuple[str, bytes, Expect]] = [
        ("bare LF line ends", with_(b"").replace(b"\r\n", b"\n"), ("200", "400")),
        ("bare CR in a value", with_(f"X-A: {t}\rX-B: 1\r\n".encode()), ("400",)),
        ("NUL in a value", with_(f"X-A: {t}\0x\r\n".encode()), ("400",)),
        ("obs-fold continuation", with_(f"X-A: {t}\r\n  folded\r\n".encode()), ("200", "400")),
        ("space before the colon", with_(f"X-A : {t}\r\n".encode()), ("400",)),
        ("a name with a slash", with_(f"X/A: {t}\r\n".encode()), ("400",)),
        ("no Host", post(CHAT, body).replace(b"Host: 127.0.0.1\r\n", b""), ("200", "400")),
        ("two Hosts", with_(b"Host: y\r\n"), ("200", "400")),
        ("a 64 KiB header", with_(b"X-Big: " + t.encode() + b"a" * 65536 + b"\r\n"),
         ("400", "431")),
        ("500 headers", with_(b"".join(b"X-H%d: %s\r\n" % (i, t.encode()) for i in range(500))),
         ("200", "400", "431")),
        ("Upgrade: h2c", with_(b"Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n"
                               b"HTTP2-Settings: AAMAAABkAAQAAP__\r\n"), ("200", "400")),
        ("Upgrade: websocket", with_(b"Upgrade: websocket\r\nConnection: Upgrade\r\n"
                                     b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"),
         ("200", "400")),
        ("HTTP/2 preface", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes(24), ("400", "closed")),
        ("HTTP/1.0 without Host", post(CHAT, body, version="HTTP/1.0").replace(
            b"Host: 127.0.0.1\r\n", b""), ("200",)),
        ("HTTP/1.2", post(CHAT, body, version="HTTP/1.2"), ("200", "400", "505")),
        ("HTTP/9.9", post(CHAT, body, version="HTTP/9.9"), ("400", "505")),
        ("HTTP/0.9 request line", b"GET /healthz\r\n\r\n", ("200", "400", "closed")),
        ("a garbage request line", f"{t} \x01\x02\r\n\r\n".encode(), ("400", "closed")),
        ("tabs in the request line", b"POST\t/v1/chat/completions\tHTTP/1.1\r\nHost: x\r\n"
         b"Content-Length: %d\r\n\r\n" % len(body) + body, ("400",)),
        ("a 100 KiB URL", request("GET", "/healthz?" + t + "a" * 100_000, [("Host", "x")]),
         ("400", "414")),
        ("x-cache-salt with CR LF inside",
         with_(f"x-cache-salt: a\r\nX-Injected: {t}\r\n".encode()), ("200",)),
        ("x-cache-salt of 8 KB", with_(b"x-cache-salt: " + t.encode() + b"s" * 8000 + b"\r\n"),
         ("200",)),
        # aiohttp reads a header's bytes as UTF-8 with surrogate escapes: a lone surrogate
        ("x-cache-salt non-ASCII (latin-1)", with_(b"x-cache-salt: caf\xe9\r\n"), ("200", "400")),
        ("x-cache-salt empty", with_(b"x-cache-salt: \r\n"), ("200", "400")),
    ]
    return [Case(c, name, (data,), expect, repeat=2) for name, data, expect in cases]


def hop_by_hop(ctx: Ctx, first_id: int) -> list[Case]:
    """Probes whose headers the tap records at the engine; each is checked there: the headers
    that must not reach it, the X-Forwarded-For it must get, the cache_salt it must get."""
    hop = ("keep-alive", "te", "trailer", "upgrade", "proxy-authorization", "proxy-connection")
    xff = "198.18.0.7"
    probes: list[tuple[str, list[tuple[str, str]], dict[str, Any]]] = [
        ("a header named in Connection", [("Connection", "keep-alive, X-Secret-Hop"),
                                          ("X-Secret-Hop", ctx.tag), ("X-Kept", "yes")],
         {"absent": ("x-secret-hop",), "kept": "x-kept"}),
        ("the standard hop-by-hop headers", [
            ("Keep-Alive", "timeout=5"), ("TE", "trailers"), ("Trailer", "X-T"),
            ("Proxy-Authorization", f"Basic {ctx.tag}"), ("Proxy-Connection", "close")],
         {"absent": hop}),
        ("X-Forwarded-For is appended to", [("X-Forwarded-For", xff)],
         {"xff": [f"{xff}, 127.0.0.1"]}),
        ("X-Forwarded-For in capitals", [("X-FORWARDED-FOR", xff)],
         {"xff": [f"{xff}, 127.0.0.1"]}),
        ("two X-Forwarded-For headers", [("X-Forwarded-For", xff),
                                         ("X-Forwarded-For", "198.18.0.8")],
         {"xff": [f"{xff}, 198.18.0.8, 127.0.0.1"]}),
        ("X-Forwarded-For named in Connection", [("Connection", "X-Forwarded-For"),
                                                 ("X-Forwarded-For", xff)],
         {"xff": ["127.0.0.1"]}),
        ("the salt header named in Connection still salts", [
            ("Connection", "x-cache-salt"), ("x-cache-salt", "tenant-hop")],
         {"salt": ("tenant-hop",), "absent": ("x-cache-salt",)}),
        ("the gateway's salt replaces the body's", [("x-cache-salt", "tenant-a")],
         {"salt": ("tenant-a",), "body": {"cache_salt": "tenant-b"}}),
        ("two salt headers", [("X-Cache-Salt", "tenant-a"), ("x-cache-salt", "tenant-b")],
         {"salt": ("tenant-a", "tenant-b"), "body": {"cache_salt": "tenant-c"}}),
    ]
    out = []
    for n, (name, hs, want) in enumerate(probes):
        body = js(chat(ctx, text(ctx, f"hdrprobe-{first_id + n}"), **want.get("body", {})))
        out.append(Case("hop-by-hop and forwarding", name, (post(CHAT, body, hs),), ("200",),
                        probe=first_id + n, probe_check=partial(_at_engine, want)))
    return out


def _at_engine(want: dict[str, Any], rec: dict[str, Any] | None) -> list[str]:
    """What is wrong with a probe's record at the engine (the tap's), against `want`."""
    if rec is None:
        return ["did not reach an engine"]
    names = [k.lower() for k, _v in rec["headers"]]
    got = [v for k, v in rec["headers"] if k.lower() == "x-forwarded-for"]
    out = [f"{h} reached the engine" for h in want.get("absent", ()) if h in names]
    if "kept" in want and want["kept"] not in names:
        out.append("an end-to-end header was dropped")
    if "xff" in want and got != want["xff"]:
        out.append(f"X-Forwarded-For at the engine: {got}")
    if "salt" in want and rec["cache_salt"] not in want["salt"]:
        out.insert(0, f"cache_salt at the engine: {rec['cache_salt']!r}")
    return out


def expect_tricks(ctx: Ctx) -> list[Case]:
    c = "Expect"
    body = js(chat(ctx, text(ctx, "expect")))

    def e(value: str, *, path: str = CHAT, data: bytes = body, version: str = "HTTP/1.1",
          clen: int | None = None) -> bytes:
        h = [("Host", "x"), ("Content-Type", "application/json"), ("Expect", value),
             ("Content-Length", str(len(data) if clen is None else clen)),
             ("Connection", "close")]
        return request("POST", path, h, data, version=version, length=False)

    cases: list[tuple[str, bytes, Expect]] = [
        ("100-continue with its body", e("100-continue"), ("200",)),
        ("418-teapot", e("418-teapot"), ("417",)),
        (f"{ctx.tag} (a long unknown expectation)", e(ctx.tag + "x" * 4000), ("417",)),
        ("100-continue, foo", e("100-continue, foo"), ("417",)),
        ("100-continue over the limit", e("100-continue", data=b"", clen=ctx.max_body + 1),
         ("413",)),
        ("100-continue on an unknown path", e("100-continue", path="/v1/nope"), ("404",)),
        ("100-continue over HTTP/1.0", e("100-continue", version="HTTP/1.0"), ("200",)),
        ("100-continue on GET /healthz", request("GET", "/healthz", [
            ("Host", "x"), ("Expect", "100-continue"), ("Connection", "close")]), ("200",)),
    ]
    return [Case(c, name, (data,), expect, repeat=3) for name, data, expect in cases]


def methods(ctx: Ctx) -> list[Case]:
    c = "methods and paths"
    t = ctx.tag
    h = [("Host", "x"), ("Connection", "close")]
    body = js(chat(ctx, text(ctx, "paths")))
    canary = f"127.0.0.1:{ctx.canary_port}"
    out: list[tuple[str, bytes, Expect, bool]] = [
        (f"{m} {CHAT}", request(m, CHAT, h), ("405",), False)
        for m in ("GET", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE")]
    out += [
        ("POST /healthz", post("/healthz", body), ("405",), False),
        ("POST /metrics", post("/metrics", body), ("405",), False),
        ("HEAD /healthz", request("HEAD", "/healthz", h), ("200",), True),
        ("BREW /v1/completions", request("BREW", COMPLETIONS, h), ("400", "405", "501"), False),
        ("post in lower case", post(CHAT, body).replace(b"POST", b"post", 1), ("400", "405"),
         False),
        ("CONNECT to another port", request("CONNECT", canary, [("Host", canary)]),
         ("400", "404", "405", "closed"), False),
        ("an absolute URI naming another host", post(f"http://{canary}{CHAT}", body,
                                                     [("X-T", t)]).replace(
            b"Host: 127.0.0.1", f"Host: {canary}".encode()), ("200", "400", "404"), False),
        ("OPTIONS *", request("OPTIONS", "*", h), ("400", "404", "405"), False),
        ("a trailing slash", post(CHAT + "/", body), ("404",), False),
        ("/../../etc/passwd", request("GET", "/../../etc/passwd", h), ("400", "404"), False),
        ("/%2e%2e/%2e%2e/etc/passwd", request("GET", "/%2e%2e/%2e%2e/etc/passwd", h),
         ("400", "404"), False),
        ("/v1/../metrics", request("GET", "/v1/../metrics", h), ("200", "400", "404"), False),
        ("a NUL in the path", request("GET", f"/v1/{t}%00", h), ("400", "404"), False),
        ("an unknown path", request("GET", f"/admin/{t}", h), ("404",), False),
        ("a path of 16 KiB", request("GET", "/" + t + "a" * 16_000, h), ("400", "404", "414"),
         False),
        ("a query on the API", post(CHAT + "?x=" + t, body), ("200",), False),
    ]
    return [Case(c, name, (data,), expect, repeat=3, head=head)
            for name, data, expect, head in out]


def leaving(ctx: Ctx) -> list[Case]:
    c = "clients leaving"
    long = {"max_tokens": 30_000, "stream": True}
    cases = [
        Case(c, "a stream left after its first bytes",
             (post(CHAT, js(chat(ctx, text(ctx, "leave-stream", 2000), **long))),),
             ("left", "200"), until="first-body-byte", repeat=20),
        Case(c, "left once the request is sent",
             (post(CHAT, js(chat(ctx, text(ctx, "leave-sent", 2000), **long))),),
             ("left",), until="sent", repeat=20),
        Case(c, "left with a reset half way through the body",
             (post(CHAT, js(chat(ctx, text(ctx, "leave-rst", 20_000))))[:10_000],),
             ("left",), until="sent", rst=True, repeat=10),
        Case(c, "a long non-streamed answer left unread",
             (post(CHAT, js(chat(ctx, text(ctx, "leave-whole", 2000), max_tokens=30_000))),),
             ("left",), until="sent", repeat=10),
    ]
    return cases
