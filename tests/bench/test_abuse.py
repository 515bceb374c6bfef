"""The abuse run's own parts: reading raw answers, judging them, the cases' bytes, the checks
at the engine, the faults' load, the bars, and /healthz watched from another process."""

from __future__ import annotations

import asyncio
import copy
import os
import threading
import time
from typing import Any

from aiohttp import web

from bench.abuse import bars, render
from bench.abuse import cases as C
from bench.abuse.client import KNOWN, exchange, first_answer, judge
from bench.abuse.run import judge_load, watch
from bench.harness.fleet import free_port

CTX = C.Ctx("m", "PLANTED-1", "HDRTAG-1", 1 << 20, "127.0.0.1:9")


def resp(status: int, headers: list[tuple[str, str]] | None = None, body: bytes = b"") -> bytes:
    hs = [*(headers or []), ("Content-Length", str(len(body)))]
    return (f"HTTP/1.1 {status} X\r\n".encode()
            + b"".join(f"{k}: {v}\r\n".encode() for k, v in hs) + b"\r\n" + body)


def test_the_first_answer_is_read_by_its_framing() -> None:
    a = first_answer(b"HTTP/1.1 100 Continue\r\n\r\n" + resp(404, body=b"{}") + resp(200))
    assert a is not None and (a.status, a.body, a.whole) == (404, b"{}", True)
    cut = first_answer(resp(200, body=b"hello")[:-2])
    assert cut is not None and not cut.whole and cut.body == b"hel"
    unframed = first_answer(b"HTTP/1.1 400 Bad\r\nContent-Type: text/plain\r\n\r\noops")
    assert unframed is not None and unframed.body == b"oops" and not unframed.whole
    assert first_answer(b"garbage\r\n\r\n") is None


def test_request_bytes_are_what_was_asked() -> None:
    raw = C.request("POST", "/p", [("Host", "x")], b"{}")
    assert raw == b"POST /p HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"
    assert C.request("POST", "/p", [("Content-Length", "9")], b"{}").count(b"Length") == 1
    assert C.chunked(b"abc", 2) == b"2\r\nab\r\n1\r\nc\r\n0\r\n\r\n"


async def test_exchange_reads_the_answer_and_sees_the_close() -> None:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n" + resp(417, [("Server", "x")], b"{}"))
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    case = C.Case("c", "n", (C.request("GET", "/", [("Host", "x")]),), ("417",), until="close")
    try:
        raw, closed, seconds = await exchange(server.sockets[0].getsockname()[1], case)
    finally:
        server.close()
    assert closed and seconds < 5
    o = judge(case, raw, closed, seconds, [])
    assert o.status == "417" and o.met and o.problems == ["Server: x"]
    assert o.notes == ["417 as none"]


def test_answers_must_not_tell_what_stands_behind_the_router() -> None:
    case = C.Case("c", "n", (), ("400",))
    ok = resp(400, [("Server", "prefix-router"), ("Content-Type", "application/json")], b"{}")
    assert judge(case, ok, True, 0.1, ["127.0.0.1:9"]).problems == []
    leaky = resp(502, [("x-routed-to", "a")], b"upstream http://127.0.0.1:9 failed\nTraceback")
    o = judge(case, leaky + ok, True, 0.1, ["127.0.0.1:9"])
    assert set(o.problems) == {"routing header x-routed-to",
                               "a traceback in the answer", "an engine's address in the answer"}
    assert o.status == "502" and not o.met


def test_slow_clients_are_judged_by_when_the_router_closed() -> None:
    slow = C.Case("slow", "s", (), ("408",), until="close", close_within=5)
    o = judge(slow, resp(408, [("Content-Type", "application/json")]), True, 7.0, [])
    assert o.met and o.problems == ["closed after 7.0s (bar 5s)"]
    assert judge(slow, b"", False, 9.0, []).problems == ["still open after 9.0s (bar 5s)"]
    assert judge(slow, b"", False, 9.0, []).status == "timeout"
    left = C.Case("leave", "l", (), ("left",), until="first-body-byte")
    assert judge(left, b"HTTP/1.1 200 OK\r\n\r\ndata", False, 1, []).status == "left"
    assert judge(left, resp(503), True, 1, []).status == "503"


def test_every_prompt_and_trick_carries_its_marker() -> None:
    for case in C.attack(CTX, 8, 2):
        body = case.pieces[0].split(b"\r\n\r\n", 1)[1]
        assert not body.startswith(b"{\"") or b"PLANTED-1" in body, case.name
    tricks = [c for c in C.headers(CTX) if c.cls == "header tricks"]
    assert all(b"HDRTAG-1" in c.pieces[0] for c in tricks if b"PRI" not in c.pieces[0])


def test_the_body_size_cases_sit_where_they_say() -> None:
    sizes = {c.name: len(c.pieces[0].split(b"\r\n\r\n", 1)[1]) for c in C.bodies(CTX)}
    assert sizes["a body exactly at the limit"] == 1 << 20
    assert sizes["one byte over the limit"] == (1 << 20) + 1
    assert (1 << 20) - 8192 < sizes["a prompt 4 KiB under the limit"] <= (1 << 20) - 4096


def test_probes_are_checked_at_the_engine() -> None:
    probes = {c.name: c for c in C.headers(CTX) if c.probe is not None}
    salted = probes["the salt header named in Connection still salts"]
    assert C.check_probe(salted, {salted.probe: {"headers": [], "cache_salt": "tenant-c"}}) == []
    assert C.check_probe(salted, {}) == ["did not reach an engine"]
    salt = probes["the gateway's salt replaces the body's"]
    rec = {"headers": [["x-cache-salt", "tenant-a"]], "cache_salt": "tenant-b"}
    assert C.check_probe(salt, {salt.probe: rec}) == ["cache_salt at the engine: 'tenant-b'"]
    hop = next(c for n, c in probes.items() if n.startswith("hop-by-hop"))
    assert C.check_probe(hop, {hop.probe: {"headers": [["TE", "1"]], "cache_salt": None}}) == [
        "te reached the engine", "X-Forwarded-For at the engine: []"]


def test_the_faults_load_is_judged_by_what_the_tap_saw() -> None:
    results = [{"rid": 1, "phase": "hung", "status": "200", "whole": True},
               {"rid": 2, "phase": "hung", "status": "200 + error event", "whole": False},
               {"rid": 3, "phase": "hung", "status": "504", "whole": False},
               {"rid": 4, "phase": "hung", "status": "503", "whole": False},
               {"rid": 5, "phase": "back", "status": "ClientOSError", "whole": False}]
    j = judge_load(results, allowed={2, 3})
    assert (j["hung"]["whole"], j["hung"]["allowed"], j["hung"]["failed"]) == (1, 2, 1)
    assert j["hung"]["five_xx"] == 1 and j["back"] == {
        "whole": 0, "allowed": 0, "failed": 1, "five_xx": 0, "statuses": {"ClientOSError": 1}}


ROUND: dict[str, Any] = {
    "store": "local", "started": "t", "load_before": [1.0, 1, 1], "load_after": [1.0, 1, 1],
    "settings": {"keepalive_timeout_s": 5},
    "outcomes": [{"cls": "JSON", "case": "x", "status": "400", "seconds": 0.1, "met": True,
                  "problems": [], "notes": []}],
    "faults": {"engine hung": {"seen_s": 1.0, "back_s": 2.0},
               "engine killed": {"seen_s": 0.2, "back_s": 1.0}},
    "load": judge_load([{"rid": 1, "phase": "p", "status": "200", "whole": True}], set()),
    "healthz": {"n": 9, "failures": 0, "p50_ms": 1.0, "p99_ms": 9.0, "max_ms": 9.0,
                "most_fds": 900}, "canary_connections": 0,
    "router": {"before": {"rss_mb": 60, "fds": 30},
               "after": {"rss_mb": 90, "peak_rss_mb": 100, "fds": 40}},
    "index": {"entries": 10, "bound": 100},
    "log": {"lines": 3, "tracebacks": 0, "error_lines": 0, "first_errors": [],
            "markers": 0},
}


def test_the_bars() -> None:
    assert all(ok for _b, _m, ok, _must in bars(ROUND))
    bad = copy.deepcopy(ROUND)
    bad["outcomes"].append({**bad["outcomes"][0], "status": "500", "met": False})
    bad["log"]["tracebacks"] = 1
    bad["router"]["after"]["peak_rss_mb"] = 600
    failed = [b for b, _m, ok, must in bars(bad) if must and not ok]
    assert failed == ["no 5xx answered to the attack", "no traceback in the router's log",
                      "router peak RSS within 512 MB (the CRD's memory limit)"]
    bad["load"]["p"]["failed"] = 1
    assert [b for b, _m, ok, _must in bars(bad) if b.startswith("faults") and not ok]
    bad["canary_connections"] = 1  # a client made the router call a port of the bench's
    assert [b for b, _m, ok, _must in bars(bad) if b.startswith("no client made") and not ok]
    assert "| **must** no 5xx answered to the attack | **no**: 1 of 2 |" in render(
        [bad], {"command": "c", "machine": "m", "host": "h", "version": "v"})


async def test_healthz_is_probed_from_another_process() -> None:
    """This loop held (as building an attack holds it) lengthens no probe of a server that is
    not held."""
    port, up, stop = free_port(), threading.Event(), threading.Event()

    async def healthz(request: web.Request) -> web.Response:
        return web.json_response({})

    def serve() -> None:  # the "router": a loop of its own, in a thread
        async def main() -> None:
            app = web.Application()
            app.router.add_get("/healthz", healthz)
            runner = web.AppRunner(app)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", port).start()
            up.set()
            await asyncio.to_thread(stop.wait)
            await runner.cleanup()

        asyncio.run(main())

    server = threading.Thread(target=serve)
    server.start()
    assert up.wait(30)
    done, started = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(watch(f"http://127.0.0.1:{port}", os.getpid(), done, started))
    try:
        # from the first answer on (the probe's process takes its time to start on a busy host)
        await asyncio.wait_for(started.wait(), 120)
        time.sleep(1.0)  # noqa: ASYNC251 - this loop held; the probes go on
        await asyncio.sleep(0.3)
        done.set()
        got = await task
    finally:
        stop.set()
        server.join(30)
    # probes went on while this loop was held: they piled up in the pipe meanwhile
    assert got["n"] >= 5 and got["failures"] == 0
    assert got["max_ms"] < 500  # an in-process probe would have measured the held second


# What aiohttp's own HTTP parser refuses before any of the router's code runs: the cases
# docs/router-http.md lists, each as the bench sends it.
PARSER_REFUSES = {
    "a request line that is not HTTP/1": b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes(24),
    "a request target over 8190 bytes": b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
    "a header line over 8190 bytes": b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 9000
    + b"\r\n\r\n",
    "more than 128 headers": b"GET / HTTP/1.1\r\nHost: x\r\n" + b"".join(
        b"X-%d: 1\r\n" % i for i in range(200)) + b"\r\n",
    "a bare CR in a value": b"GET / HTTP/1.1\r\nHost: x\r\nX-A: 1\rX-B: 1\r\n\r\n",
    "Content-Length and Transfer-Encoding": b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
    b"Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    "two different Content-Lengths": b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
    b"Content-Length: 2\r\nContent-Length: 5\r\n\r\n{}",
    "a bad chunk size": b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
    b"Transfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",
    "HTTP/1.1 without Host": b"GET /healthz HTTP/1.1\r\n\r\n",
}


async def test_aiohttps_own_answers_are_counted_as_the_known_exception() -> None:
    # A real router: these requests never reach its code; aiohttp answers them itself, in
    # text/plain, naming its version (no public hook changes that: docs/router-http.md). The
    # bench counts them apart instead of as broken contract.
    from prefix_router.app import serve
    from prefix_router.config import RouterSettings

    stop = asyncio.Event()
    bound: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(serve(RouterSettings.model_validate({"port": 0}), stop,
                                     bound.set_result))
    try:
        port = await asyncio.wait_for(bound, 30)
        for name, raw in PARSER_REFUSES.items():
            case = C.Case("parser", name, (raw,), ("400",), until="close")
            o = judge(case, *await exchange(port, case), [])
            assert (o.status, o.problems, o.notes, o.known) == ("400", [], [], [KNOWN]), name
        # the router's own 400 is no exception
        ours = C.Case("parser", "ours", (C.request("POST", "/v1/completions", [
            ("Host", "x")], b"{"),), ("400",), until="reply")
        o = judge(ours, *await exchange(port, ours), [])
        assert (o.status, o.problems, o.known) == ("400", [], [])
    finally:
        stop.set()
        await task
    counted = copy.deepcopy(ROUND)
    counted["outcomes"].append({**counted["outcomes"][0], "case": "y", "known": [KNOWN]})
    assert all(ok for _b, _m, ok, _must in bars(counted))
    assert [m for b, m, _ok, _must in bars(counted) if b.startswith("the known exception")] == [
        "y x1"]
