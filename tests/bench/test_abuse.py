"""The abuse run's own parts: reading raw replies, judging answers, scanning logs and /proc,
judging the faults' load, the bars, and what the tap records."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from bench.abuse import cases as C
from bench.abuse.cases import chunked, request
from bench.abuse.client import (
    Outcome,
    Reply,
    Response,
    answer_problems,
    exchange,
    head_status,
    judge,
    parse_replies,
    status_of,
)
from bench.abuse.report import bars, by_case, by_class, held, is_5xx
from bench.abuse.run import (
    LoadResult,
    busiest,
    judge_load,
    latency_summary,
    scan_log,
    tcp_table,
    traceback_excerpts,
)
from bench.abuse.tap import is_stream, probe_record, rid_of
from bench.harness.promtext import sample_sum


def resp(status: int, headers: list[tuple[str, str]] | None = None, body: bytes = b"") -> bytes:
    hs = [*(headers or []), ("Content-Length", str(len(body)))]
    return (f"HTTP/1.1 {status} X\r\n".encode()
            + b"".join(f"{k}: {v}\r\n".encode() for k, v in hs) + b"\r\n" + body)


def test_replies_are_split_by_their_framing() -> None:
    two = resp(200, body=b"hello") + resp(404, body=b"{}")
    done, interim, rest = parse_replies(two, closed=False)
    assert [(r.status, r.body) for r in done] == [(200, b"hello"), (404, b"{}")]
    assert interim == [] and rest == b""
    # a 100 Continue first, then a chunked answer with a trailer
    body = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    body += chunked(b"abcdefghij", 4)[:-2] + b"X-T: 1\r\n\r\n"
    done, interim, rest = parse_replies(body, closed=False)
    assert interim == [100] and done[0].body == b"abcdefghij" and rest == b""


def test_an_incomplete_or_unframed_reply() -> None:
    cut = resp(200, body=b"hello")[:-2]
    assert parse_replies(cut, closed=True)[0] == []
    unframed = b"HTTP/1.1 400 Bad\r\nContent-Type: text/plain\r\n\r\noops"
    assert parse_replies(unframed, closed=False)[0] == []  # may go on until the close
    assert parse_replies(unframed, closed=True)[0][0].body == b"oops"
    assert parse_replies(resp(204), closed=False, head=True)[0][0].status == 204


def test_request_bytes_are_what_was_asked() -> None:
    raw = request("POST", "/p", [("Host", "x")], b"{}")
    assert raw == b"POST /p HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"
    assert b"Content-Length" not in request("POST", "/p", [], b"{}", length=False)
    assert chunked(b"abc", 2) == b"2\r\nab\r\n1\r\nc\r\n0\r\n\r\n"


async def test_exchange_reads_the_answer_and_sees_the_close() -> None:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n" + resp(417, [("Server", "x")], b"{}"))
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        got = await exchange(port, [request("GET", "/", [("Host", "x")])], until="close",
                             timeout=10)
    finally:
        server.close()
    assert got.status == 417 and got.interim == [100] and got.closed and not got.timed_out
    assert got.answered is not None and got.answered <= got.seconds


def test_meets() -> None:
    assert C.meets("400", ("400",)) and C.meets("404", ("4xx",)) and C.meets("closed", ("closed",))
    assert not C.meets("500", ("4xx", "200")) and not C.meets("closed", ("4xx",))


def _reply(*responses: Response, **kw: Any) -> Reply:
    return Reply(responses=list(responses), **kw)


def test_answers_must_not_tell_what_stands_behind_the_router() -> None:
    ok = Response(400, [("Server", "prefix-router"), ("Content-Type", "application/json")],
                  b"{}")
    assert answer_problems(_reply(ok), ["127.0.0.1:9"]) == ([], [])
    leaky = Response(502, [("Server", "Python/3.11 aiohttp/3.14.5"), ("x-routed-to", "a")],
                     b"upstream http://127.0.0.1:9 failed\nTraceback")
    problems, notes = answer_problems(_reply(leaky, ok), ["127.0.0.1:9"])
    assert set(problems) == {"2 answers to one request", "routing header x-routed-to",
                             "Server: Python/3.11 aiohttp/3.14.5", "a traceback in the answer",
                             "an engine's address in the answer", "502 from the router"}
    assert notes == ["502 as no content type"]


def test_judging_a_case() -> None:
    slow = C.Case("slow", "s", (), ("408",), until="close", close_within=5, answer_within=3)
    late = _reply(Response(408, [("Content-Type", "application/json")], b"{}"), closed=True,
                  seconds=7.0, answered=4.0)
    o = judge(slow, late, [])
    assert o.status == "408" and o.met
    assert o.problems == ["closed after 7.0s (bar 5s)", "answered after 4.0s (bar 3s)"]
    left = C.Case("leave", "l", (), ("left",), until="first-body-byte")
    assert status_of(left, _reply(partial=b"HTTP/1.1 200 OK\r\n\r\ndata")) == "left"
    assert status_of(left, _reply(partial=b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 503 X\r\n")) \
        == "503"
    assert head_status(b"garbage") is None
    plain = C.Case("x", "x", (), ("closed",))
    assert status_of(plain, _reply(closed=True)) == "closed"
    assert status_of(plain, _reply(timed_out=True)) == "timeout"


def test_every_prompt_and_header_trick_carries_its_marker() -> None:
    ctx = C.Ctx("m", "PLANTED-1", "HDRTAG-1", 8 * C.MiB, 9)
    for case in C.wrong_types(ctx) + C.context(ctx) + C.leaving(ctx) + C.expect_tricks(ctx):
        body = case.pieces[0].split(b"\r\n\r\n", 1)[1]
        assert not body or b"PLANTED-1" in body, case.name
    assert all(len(c.pieces[0]) <= ctx.max_body + 2048 for c in C.headers(ctx))
    tag = next(c for c in C.headers(ctx) if c.name == "a 64 KiB header")
    assert b"HDRTAG-1" in tag.pieces[0]


def test_the_body_size_cases_sit_where_they_say() -> None:
    ctx = C.Ctx("m", "P", "H", 1 << 20, 9)
    sizes = {c.name: len(c.pieces[0].split(b"\r\n\r\n", 1)[1]) for c in C.body_size(ctx)
             if "bomb" not in c.name and "gzip" not in c.name}
    assert sizes["body exactly at the limit"] == 1 << 20
    assert sizes["one byte over the limit"] == (1 << 20) + 1
    assert (1 << 20) - 8192 < sizes["prompt body 4 KiB under the limit"] <= (1 << 20) - 4096


def test_probes_are_checked_at_the_engine() -> None:
    ctx = C.Ctx("m", "P", "H", 1 << 20, 9)
    probes = {c.name: c for c in C.hop_by_hop(ctx, 1)}
    xff = probes["X-Forwarded-For is appended to"]
    assert xff.probe_check({"headers": [["X-Forwarded-For", "198.18.0.7, 127.0.0.1"]],
                            "cache_salt": None}) == []
    assert xff.probe_check(None) == ["did not reach an engine"]
    salt = probes["the gateway's salt replaces the body's"]
    assert salt.probe_check({"headers": [], "cache_salt": "tenant-b"}) \
        == ["cache_salt at the engine: 'tenant-b'"]


def test_the_tap_reads_ids_and_probes() -> None:
    body = json.dumps({"stream": True, "cache_salt": "t", "messages": [
        {"content": "x rid-42 hdrprobe-7"}]}).encode()
    assert rid_of(body) == 42 and rid_of(b"{}") is None
    assert is_stream(body) and not is_stream(b"{") and not is_stream(b'{"stream": 1}')
    rec = probe_record([("X-A", "1"), ("X-A", "2")], body)
    assert rec == {"id": 7, "headers": [["X-A", "1"], ["X-A", "2"]], "cache_salt": "t"}


def test_the_log_scan() -> None:
    text = "\n".join([
        "2026-01-01 00:00:00,000 INFO aiohttp.server refused a malformed request: BadHttpMessage",
        "2026-01-01 00:00:00,000 INFO aiohttp.server refused a malformed request: BadHttpMessage",
        "2026-01-01 00:00:01,000 ERROR prefix_router unexpected error on POST /v1/x",
        "Traceback (most recent call last):",
        '  File "x.py", line 1, in f',
        "ValueError: PLANTED-1 in here",
        "2026-01-01 00:00:02,000 WARNING prefix_router.proxy http://127.0.0.1:5 sent nothing "
        "for 10s: 504",
    ])
    s = scan_log(text, {"prompt": "PLANTED-1", "other": "HDRTAG"})
    assert s["tracebacks"] == 1 and s["error_lines"] == 1
    assert s["markers"] == {"prompt": 1, "other": 0}
    assert s["levels"] == {"INFO": 2, "ERROR": 1, "WARNING": 1}
    assert s["kinds"]["INFO aiohttp.server refused a malformed request: BadHttpMessage"] == 2
    assert "WARNING prefix_router.proxy # sent nothing for #s: #" in s["kinds"]
    (excerpt,) = traceback_excerpts(text)
    assert excerpt.startswith("2026") and excerpt.endswith("ValueError: PLANTED-1 in here")


def test_proc_and_metrics_text() -> None:
    tcp = ("  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  "
           "timeout inode\n"
           "   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000 0 0 "
           "1234 1 0\n"
           "   1: 0100007F:1F90 0100007F:D431 01 00000000:00000000 00:00000000 00000000 0 0 "
           "5678 1 0\n")
    assert tcp_table(tcp) == {1234: (8080, 0, "LISTEN"), 5678: (8080, 54321, "ESTABLISHED")}
    page = 'm{b="x"} 2.0\nm{b="y"} 1.0\nm_total 9\n# m 7\n'
    assert sample_sum(page, "m") == 3.0
    s = latency_summary([0.001, 0.002, 0.1], 2)
    assert s == {"n": 3, "failures": 2, "p50_ms": 2.0, "p99_ms": 100.0, "max_ms": 100.0}


def test_the_faults_load_is_judged_by_what_the_tap_saw() -> None:
    results = [LoadResult(1, "hung", True, 200, whole=True),
               LoadResult(2, "hung", True, 200, error_event=True),
               LoadResult(3, "hung", False, 504),
               LoadResult(4, "hung", False, 503),
               LoadResult(5, "back", False, "ClientOSError")]
    j = judge_load(results, allowed={2, 3})
    assert j["hung"]["whole"] == 1 and j["hung"]["allowed_failures"] == 2
    assert j["hung"]["failures"] == 1 and j["hung"]["five_xx"] == 1
    assert j["hung"]["statuses"] == {"200": 1, "200 + error event": 1, "504": 1, "503": 1}
    assert j["back"]["failures"] == 1 and j["back"]["five_xx"] == 0
    assert busiest([{"seen": [1, 2, 9]}, {"seen": [3, 4, 5, 6]}], since=2) == 1


def _round(**over: Any) -> dict[str, Any]:
    outcomes = [Outcome("JSON", "x", "400", 0.1, True).__dict__,
                Outcome("JSON", "y", "500", 0.1, False, None, ["500 from the router"]).__dict__,
                Outcome("slow", "s", "closed", 6.0, True, None, ["closed after 6.0s (bar 5s)"],
                        ["400 as text/plain"]).__dict__]
    r: dict[str, Any] = {
        "store": "local", "started": "t", "load_before": "l", "load_after": "l",
        "settings": {"keepalive_timeout_s": 5}, "outcomes": outcomes, "timings_s": {"a": 1},
        "faults": {"load": judge_load([LoadResult(1, "p", False, 200, whole=True)], set()),
                   "engine hung": {"seconds_to_eject": 1.0},
                   "engine killed": {"seconds_to_eject": 1, "seconds_to_readmit": 2}},
        "leak_check": {"seconds": 0.1, "drained": True}, "settle": {"seconds": 0.1},
        "router": {"before": {"rss_mb": 60, "peak_rss_mb": 60, "fds": 30},
                   "after": {"rss_mb": 90, "peak_rss_mb": 100, "fds": 40},
                   "peak_rss_mb": 100, "max_fds": 900, "alive_at_end": True,
                   "sigterm": {"exit_code": 0, "seconds": 0.2}},
        "index": {"entries": 10, "bound": 100}, "redis": None,
        "healthz": {"attack": latency_summary([0.001, 0.05])}, "canary_connections": 0,
        "log": scan_log("", {"prompt marker": "P", "header/path marker": "H"}), "errors": []}
    return r | over


def test_the_bars() -> None:
    r = _round()
    assert [c["unmet"] for c in by_case(r["outcomes"])] == [0, 1, 0]
    (json_cls, slow_cls) = by_class(r["outcomes"])
    assert json_cls["five_xx"] == 1 and json_cls["problems"] == 0 and slow_cls["problems"] == 1
    verdict = {b: ok for b, _m, ok, _must in bars(r)}
    assert verdict["no 5xx answered to the attack"] is False
    assert verdict["no traceback in the router's log"] is True
    assert not held(r, must_only=True)
    assert held(_round(outcomes=r["outcomes"][:1]), must_only=True)
    assert is_5xx("504") and not is_5xx("50") and not is_5xx("closed")


def test_the_redis_bars() -> None:
    base = _round()
    r = _round(store="redis", redis={
        "before": {}, "after the attack": {"commands_over_10ms": 3, "over_50ms": 1,
                                           "slowest_ms": 120.0, "keys": 9, "used_memory_mb": 1},
        "store lost during the attack": ["prefix_router.redis shared store unavailable "
                                         "(network:MaxConnectionsError): routing on local state"]},
        faults={**base["faults"], "redis killed": {"seconds_to_degraded": 0.1,
                                                   "seconds_to_reconnect": 0.5}})
    verdict = {b: (ok, m) for b, m, ok, _must in bars(r)}
    lost = verdict["Redis stays up for the router through the attack (no `shared store "
                   "unavailable` before Redis is killed)"]
    assert lost == (False, "1 times: network:MaxConnectionsError): routing on local state")
    assert verdict["no Redis command over 100 ms (one Redis serves every router)"][0] is False
    assert verdict["faults: Redis killed and back, nothing failed"][0] is True



async def test_healthz_is_probed_from_another_process_and_counted_by_phase() -> None:
    """The probe runs apart: this loop held (as building an attack holds it) lengthens no
    probe of a router that is not held; and each probe counts under the phase it began in."""
    import os
    import threading
    import time

    from aiohttp import web
    from waiting import until

    from bench.abuse.run import Watch
    from bench.harness.fleet import free_port

    async def healthz(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    port, up, stop = free_port(), threading.Event(), threading.Event()

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
    watch = Watch(f"http://127.0.0.1:{port}", os.getpid())
    task = asyncio.ensure_future(watch.healthz())

    def probed(phase: str, n: int) -> bool:
        return len(watch.latencies.get(phase, ())) >= n

    try:
        await until(lambda: probed("attack: start", 3), 30, "three probes", interval=0.01)
        watch.phase = "attack: held"
        # this loop held, as building an attack holds it; the server's is not
        time.sleep(1.0)  # noqa: ASYNC251
        await until(lambda: probed("attack: held", 5), 30, "probes of the held phase",
                    interval=0.01)  # fmt: skip
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        stop.set()
        server.join(30)
    held = watch.latencies["attack: held"]
    assert len(held) >= 15  # probes went on while this loop was held
    assert max(held) < 0.5  # an in-process probe measured the whole second
    assert set(watch.summary()) >= {"attack: start", "attack: held", "attack"}
