"""The hostile requests, as data: the bytes a client sends, how it leaves, the answers right for
it. Prompts hold the run's marker, header and path tricks a second: the log is searched."""

from __future__ import annotations

import gzip
import json
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

MiB, CRLF, CHAT = 2**20, b"\r\n", "/v1/chat/completions"
Headers = Sequence[tuple[str, str]]


@dataclass(frozen=True)
class Ctx:
    model: str
    marker: str  # in every prompt
    tag: str  # in header values and paths
    max_body: int
    canary: str = ""  # host:port only the bench listens on: no client may make the router call it


@dataclass(frozen=True)
class Case:
    cls: str
    name: str
    pieces: tuple[bytes, ...]
    expect: tuple[str, ...]  # statuses, "closed" (by the router) or "left" (by the client)
    repeat: int = 2
    gap: float = 0.0  # seconds between pieces
    until: str = "reply"  # what the client waits for: reply, close, sent, first-body-byte
    probe: int | None = None  # a header probe: the tap records what reached the engine
    want: tuple[tuple[str, Any], ...] = ()  # what the engine must have got (check_probe)
    close_within: float | None = None  # the router closes it by then (s from the first byte)


def request(method: str, path: str, headers: Headers = (), body: bytes = b"") -> bytes:
    """One request's bytes; Content-Length added for a body whose headers do not frame it."""
    lines = [f"{method} {path} HTTP/1.1".encode()]
    lines += [f"{k}: {v}".encode("latin-1") for k, v in headers]
    framed = any(k.lower() in ("content-length", "transfer-encoding") for k, _v in headers)
    lines += [b"Content-Length: %d" % len(body)] if body and not framed else []
    return CRLF.join(lines) + CRLF + CRLF + body


def post(body: bytes, headers: Headers = (), path: str = CHAT) -> bytes:
    h = [("Host", "127.0.0.1"), ("Content-Type", "application/json"), *headers]
    return request("POST", path, [*h, ("Connection", "close")], body)


def chat(ctx: Ctx, content: str, **extra: Any) -> bytes:
    return json.dumps({"model": ctx.model, "messages": [{"role": "user", "content": content}],
                       "max_tokens": 4, **extra}).encode()


def text(ctx: Ctx, tag: str, size: int = 200) -> str:
    """A prompt of at most `size` bytes, unique by `tag` from its first block on."""
    head = f"{ctx.marker} {tag} "
    return head + "lorem ipsum dolor " * max(0, (size - len(head)) // 18)


def rows(cls: str, table: list[tuple[str, bytes, str]]) -> list[Case]:
    """Cases from (name, bytes sent, the answers allowed, blank-separated) rows."""
    return [Case(cls, name, (data,), tuple(expect.split())) for name, data, expect in table]


def chunked(body: bytes, size: int = 65536) -> bytes:
    pieces = (body[i : i + size] for i in range(0, len(body), size))
    return b"".join(b"%x\r\n" % len(p) + p + CRLF for p in pieces) + b"0\r\n\r\n"


def bodies(ctx: Ctx) -> list[Case]:
    """Bodies up to and over the limit, prompts over the engine's max_model_len, and client
    mistakes (JSON, types, encodings): each a 4xx in JSON, no traceback logged."""
    lim, short, p = ctx.max_body, chat(ctx, text(ctx, "short")), text(ctx, "json")
    good, gz, ch = chat(ctx, p), [("Content-Encoding", "gzip")], [("Transfer-Encoding", "chunked")]
    huge = chat(ctx, text(ctx, "huge", lim - 4096 - len(chat(ctx, ""))))
    bomb = zlib.compressobj(9, zlib.DEFLATED, 31)  # gzip: a thousandth of the zeros it holds
    zeros = b"".join([*(bomb.compress(bytes(MiB)) for _ in range(128 * lim // MiB)), bomb.flush()])

    def padded(n: int) -> bytes:  # the short prompt, blanks up to n bytes
        return short[:-1] + b" " * (n - len(short)) + b"}"

    def raw(extra: bytes) -> bytes:
        return post(good[:-1] + extra + b"}")

    return rows("body size", [
        ("a prompt 4 KiB under the limit", post(huge), "400"),
        ("a body exactly at the limit", post(padded(lim)), "200"),
        ("one byte over the limit", post(padded(lim + 1)), "413"),
        ("Content-Length 1 GiB, 64 KiB sent", post(b"{" + bytes(65535), [
            ("Content-Length", str(1024 * MiB))]), "413"),
        ("chunked, 1 MiB over the limit", post(chunked(padded(lim + MiB)), ch), "413"),
        (f"gzip bomb: {128 * lim // MiB} MiB of zeros", post(zeros, gz), "413 400"),
        ("gzip of a prompt 4 KiB under the limit", post(gzip.compress(huge, 1), gz), "400"),
    ]) + rows("prompt over max_model_len", [
        ("a 200 KB prompt (the engine's 32k tokens < it < twice that)",
         post(chat(ctx, text(ctx, "200k", 200_000))), "400"),
        ("max_tokens over the context", post(chat(ctx, text(ctx, "mt"), max_tokens=10**6)), "400"),
    ]) + rows("JSON", [
        ("empty body", post(b""), "400"),
        ("truncated", post(good[: len(good) // 2]), "400"),
        ("random bytes", post(bytes(i * 37 % 256 for i in range(4096)) + p.encode()), "400"),
        ("an integer of 5,000 digits", raw(b', "n": ' + b"7" * 5000), "400"),
        ("invalid UTF-8 in a string", raw(b', "user": "\xff\xfe\xc0\xaf"'), "400"),
        ("a lone surrogate in the salt", raw(b', "cache_salt": "\\udfff"'), "400"),
        ("model 5", post(chat(ctx, p, model=5)), "400"),
        ("stream 'yes'", post(chat(ctx, p, stream="yes")), "400"),
        ("cache_salt 5", post(chat(ctx, p, cache_salt=5)), "400"),
    ]) + rows("encodings", [
        ("gzip that is not gzip", post(p.encode(), gz), "400"),
        ("valid gzip", post(gzip.compress(good), gz), "200"),
        ("Transfer-Encoding and Content-Length (smuggling)", post(
            b"0\r\n\r\nGET /metrics HTTP/1.1\r\n\r\n", [("Content-Length", "4"), *ch]),
         "400"),
        ("two different Content-Lengths", post(good, [("Content-Length", str(len(good))), (
            "Content-Length", "5")]), "400"),
    ])


def check_probe(case: Case, records: dict[int, dict[str, Any]]) -> list[str]:
    """What is wrong with what reached the engine for a header probe (the tap's records)."""
    if (rec := records.get(case.probe)) is None:  # type: ignore[arg-type]
        return ["did not reach an engine"]
    want, names = dict(case.want), [k.lower() for k, _v in rec["headers"]]
    xff = [v for k, v in rec["headers"] if k.lower() == "x-forwarded-for"]
    out = [f"{h} reached the engine" for h in want.get("absent", ()) if h in names]
    if "xff" in want and want["xff"] != xff:
        out.append(f"X-Forwarded-For at the engine: {xff}")
    if "salt" in want and want["salt"] != rec["cache_salt"]:
        out.append(f"cache_salt at the engine: {rec['cache_salt']!r}")
    return out


def headers(ctx: Ctx) -> list[Case]:
    """Header tricks, the error contract (417, 405, 404 in JSON); probes of what reaches the
    engine: hop-by-hop headers dropped, X-Forwarded-For appended to, the gateway's salt wins."""
    body, t, xff = chat(ctx, text(ctx, "hdr")), ctx.tag.encode(), "198.18.0.7"
    h = [("Host", "x"), ("Connection", "close")]

    def with_(lines: bytes) -> bytes:
        return post(body).replace(b"Connection", lines + b"Connection", 1)

    probes: list[tuple[str, Headers, dict[str, Any]]] = [
        ("hop-by-hop headers, named in Connection too; X-Forwarded-For appended to", [
            ("Connection", "keep-alive, X-Hop"), ("X-Hop", ctx.tag), ("Keep-Alive", "timeout=5"),
            ("TE", "trailers"), ("Proxy-Authorization", ctx.tag), ("X-FORWARDED-FOR", xff),
            ("X-Forwarded-For", "::1")], {"absent": ["x-hop", "keep-alive", "te",
                                                     "proxy-authorization"],
                                          "xff": [f"{xff}, ::1, 127.0.0.1"]}),
        ("the salt header named in Connection still salts", [("Connection", "x-cache-salt"), (
            "x-cache-salt", "tenant-c")], {"salt": "tenant-c", "absent": ["x-cache-salt"]}),
        ("the gateway's salt replaces the body's", [("x-cache-salt", "tenant-a")],
         {"salt": "tenant-a", "body": {"cache_salt": "tenant-b"}}),
    ]
    return rows("error contract: Expect, methods, paths", [
        ("Expect: 100-continue with its body", post(body, [("Expect", "100-continue")]), "200"),
        ("Expect: 418-teapot", post(body, [("Expect", "418-teapot")]), "417"),
        ("Expect: 100-continue over the limit", post(b"", [("Expect", "100-continue"), (
            "Content-Length", str(ctx.max_body + 1))]), "413"),
        (f"GET {CHAT}", request("GET", CHAT, h), "405"),
        ("a path of 16 KiB", request("GET", f"/{ctx.tag}{'a' * 16_000}", h), "400 404 414"),
    ]) + rows("header tricks", [
        ("bare CR in a value", with_(b"X-A: %s\rX-B: 1\r\n" % t), "400"),
        ("a 64 KiB header", with_(b"X-Big: " + t + b"a" * 65536 + b"\r\n"), "400 431"),
        ("HTTP/2 preface", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes(24), "400 closed"),
        ("CONNECT to another port", request("CONNECT", ctx.canary, [
            ("Host", ctx.canary), ("X-T", ctx.tag)]), "400 404 405 closed"),
        ("an absolute URI and Host naming another host", post(body, [("X-T", ctx.tag)], path=(
            f"http://{ctx.canary}{CHAT}")).replace(b"127.0.0.1", ctx.canary.encode(), 1),
         "200 400 404"),
        ("x-cache-salt with CR LF inside", with_(b"x-cache-salt: a\r\nX-I: %s\r\n" % t), "200"),
    ]) + [Case("hop-by-hop and forwarding", name, (post(chat(
        ctx, text(ctx, f"hdrprobe-{i}"), **w.get("body", {})), hs),), ("200",), 1,
        probe=i, want=tuple(w.items())) for i, (name, hs, w) in enumerate(probes)]


def attack(ctx: Ctx, burst: int = 200, flood: int = 160) -> list[Case]:
    """The attack but the slow clients, in order; last, many at once, the index flood (unique
    100 KB prompts: only the index's memory budget bounds it), clients leaving mid-request."""
    long = {"max_tokens": 30_000, "stream": True}
    return [
        *bodies(ctx), *headers(ctx),
        *(Case("many connections", f"{burst} requests at once", (post(chat(
            ctx, text(ctx, f"burst-{i}", 2000))),), ("200",), burst // 8) for i in range(8)),
        *(Case("index flood", "a unique 100 KB prompt", (post(chat(
            ctx, text(ctx, f"flood-{i}", 100_000), max_tokens=1)),), ("200",), 1)
          for i in range(flood)),
        *(Case("clients leaving", f"a long stream left {until}", (post(chat(ctx, text(
            ctx, f"leave-{until}"), **long)),), ("left",), 10, until=until)
          for until in ("first-body-byte", "sent")),
    ]


def slow(ctx: Ctx, keepalive_s: float, body_s: float, silent: int) -> list[Case]:
    """Slow clients and silent connections, sent while the rest goes on: the router's timeouts
    must close each (after a 408 aiohttp lingers up to the router's 1 s)."""
    body = chat(ctx, text(ctx, "slow", 2000))
    head = post(body)[: -len(body)].replace(b"Connection: close\r\n", b"")
    ka, bd = keepalive_s * 1.5 + 2, body_s * 1.5 + 4
    return [Case("slow clients", name, pieces, (expect,), n, 0.5, "close", close_within=bar)
            for name, pieces, expect, n, bar in [
        ("headers a byte at a time", tuple(bytes([b]) for b in head), "closed", 3, ka),
        ("the body a byte at a time", (head, *(bytes([b]) for b in body[:200])), "408", 3, bd),
        ("idle keep-alive after one request", (request("GET", "/healthz", [("Host", "x")]),),
         "200", 4, ka)]] + [
        Case("many connections", f"{silent} silent connections at once", (), ("closed",), silent,
             until="close", close_within=ka + 3),
    ]
