"""The router against real simulator processes: routing, streaming, errors, failover."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path

import aiohttp
import pytest
import waiting

from bench.harness.fleet import Fleet, free_port

pytestmark = pytest.mark.slow

MODEL = "test-model"

SYSTEM = "You are a careful assistant. " * 120  # ~3,500 bytes: many blocks


async def post(s: aiohttp.ClientSession, url: str, path: str, body: object, **kw):
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    async with s.post(
        url + path, data=data, headers={"Content-Type": "application/json"}, **kw
    ) as r:
        return r.status, r.headers, await r.read()


def chat(user: str, system: str = SYSTEM, **kw) -> dict:
    return {
        "model": MODEL,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
        "max_tokens": 8,
        **kw,
    }


async def test_shared_prefix_lands_on_the_owner_and_hits(fleet: Fleet, start_sims):
    sims = await start_sims(fleet, 4)
    router = await fleet.start_router("router", sims, policy="prefix", kv_capacity=100_000)
    async with aiohttp.ClientSession() as s:
        st, h1, b1 = await post(s, router.url, "/v1/chat/completions", chat("first question"))
        assert st == 200, b1
        assert h1["x-route-reason"] == "miss"
        st, h2, b2 = await post(s, router.url, "/v1/chat/completions", chat("second question"))
        assert st == 200, b2
        assert h2["x-routed-to"] == h1["x-routed-to"]
        assert h2["x-route-reason"] == "hit"
        usage = json.loads(b2)["usage"]
        assert usage["prompt_tokens_details"]["cached_tokens"] >= 800


async def test_multi_turn_next_turn_matches_the_generating_replica(fleet: Fleet, start_sims):
    sims = await start_sims(fleet, 4)
    router = await fleet.start_router("router", sims, policy="prefix", kv_capacity=100_000)
    async with aiohttp.ClientSession() as s:
        msgs = [{"role": "user", "content": "tell me a long story " * 40}]
        st, h1, b1 = await post(
            s,
            router.url,
            "/v1/chat/completions",
            {"model": MODEL, "messages": msgs, "max_tokens": 200},
        )
        assert st == 200
        r1 = json.loads(b1)
        answer = r1["choices"][0]["message"]["content"]
        msgs2 = [
            *msgs,
            {"role": "assistant", "content": answer},
            {"role": "user", "content": "and then?"},
        ]
        st, h2, b2 = await post(
            s,
            router.url,
            "/v1/chat/completions",
            {"model": MODEL, "messages": msgs2, "max_tokens": 8},
        )
        assert st == 200
        assert h2["x-routed-to"] == h1["x-routed-to"]
        cached = json.loads(b2)["usage"]["prompt_tokens_details"]["cached_tokens"]
        # the answer's tokens are cached too, not only the first prompt
        assert cached > r1["usage"]["prompt_tokens"] + 100


async def test_streaming_is_passed_through_chunk_by_chunk(fleet: Fleet, start_sims):
    sims = await start_sims(fleet, 1)
    router = await fleet.start_router("router", sims, policy="prefix", kv_capacity=100_000)
    body = chat("stream please", max_tokens=60, stream=True)
    async with aiohttp.ClientSession() as s:
        async with s.post(router.url + "/v1/chat/completions", json=body) as r:
            assert r.status == 200
            assert r.headers["Content-Type"].startswith("text/event-stream")
            arrivals = []
            events = []
            async for line in r.content:
                if line.startswith(b"data:"):
                    arrivals.append(time.perf_counter())
                    events.append(line[5:].strip())
    assert events[-1] == b"[DONE]"
    pieces = [
        json.loads(e)["choices"][0]["delta"].get("content", "")
        for e in events[:-1]
        if json.loads(e)["choices"]
    ]
    assert len("".join(pieces)) > 0
    # 60 decode steps of the fast profile take well over 50 ms; a buffering proxy would
    # deliver every event at once.
    assert arrivals[-1] - arrivals[0] > 0.05


async def test_bad_input_gets_openai_errors(fleet: Fleet, start_sims, tmp_path: Path):
    sims = await start_sims(fleet, 1)
    cfg = tmp_path / "router.yaml"
    cfg.write_text("max_body_bytes: 20000\n")
    router = await fleet.start_router(
        "router",
        sims,
        policy="prefix",
        kv_capacity=100_000,
        extra=["--config", str(cfg), "--model", MODEL],
    )
    cases = [
        ("/v1/chat/completions", b"{not json", 400),
        ("/v1/chat/completions", {"model": MODEL}, 400),
        ("/v1/completions", {"model": MODEL}, 400),
        ("/v1/completions", {"model": MODEL, "prompt": "x" * 30000}, 413),
        ("/v1/completions", {"model": "no-such-model", "prompt": "hi"}, 404),
        ("/v1/chat/completions", {"model": MODEL, "messages": "hi"}, 400),
        ("/v1/nothing-here", {"model": MODEL}, 404),
    ]
    async with aiohttp.ClientSession() as s:
        for path, body, want in cases:
            st, _h, raw = await post(s, router.url, path, body)
            assert st == want, (path, body, raw)
            err = json.loads(raw)["error"]
            assert err["message"] and err["type"]
        # engine-side validation errors pass through as the engine said them
        st, _h, raw = await post(
            s, router.url, "/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": -1}
        )
        assert st == 400
        async with s.get(router.url + "/v1/models") as r:
            assert r.status == 200
            assert [m["id"] for m in (await r.json())["data"]] == [MODEL]
    # Requests aiohttp's parser refuses before any handler runs get its own 400 (text, not
    # JSON: aiohttp offers no public hook for that body) and a closed connection.
    host, port = router.url.removeprefix("http://").split(":")
    body = b'{"model": "test-model", "prompt": "hi"}'
    raw_cases = [
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20_000 + b"\r\n",
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
        + b"".join(b"X-H%d: v\r\n" % i for i in range(200)),
        b"NOT AN HTTP REQUEST\r\n",
    ]
    for head in raw_cases:
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(head + b"Content-Length: %d\r\n\r\n" % len(body) + body)
        await writer.drain()
        reply = await asyncio.wait_for(reader.read(), 10)  # the router closes after it
        writer.close()
        status_line, _, rest = reply.partition(b"\r\n")
        headers, _, _payload = rest.partition(b"\r\n\r\n")
        assert status_line.split()[1] == b"400", (head[:60], reply[:300])
        assert b"connection: close" in headers.lower() or not reply.endswith(b"\r\n\r\n")


async def test_no_healthy_backend_is_503_with_retry_after(fleet: Fleet, start_sims):
    dead = f"http://127.0.0.1:{free_port()}"
    router = await fleet.start_router("router", [dead], policy="prefix", kv_capacity=1000, extra=[])
    async with aiohttp.ClientSession() as s:
        st, h, raw = await post(s, router.url, "/v1/completions", {"model": MODEL, "prompt": "x"})
        assert st == 503
        assert int(h["Retry-After"]) >= 1
        assert json.loads(raw)["error"]["message"]
        async with s.get(router.url + "/readyz") as r:
            assert r.status == 503


async def test_upstream_timeout_is_504(fleet: Fleet, start_sims, tmp_path: Path):
    # a real-time 70B profile with a long prompt and many tokens: far slower than 0.3 s
    sims = await start_sims(fleet, 1, profile="llama-3.1-70b-h100", time_scale=5.0)
    cfg = tmp_path / "router.yaml"
    cfg.write_text("upstream_timeout_s: 0.3\n")
    router = await fleet.start_router(
        "router", sims, policy="prefix", kv_capacity=100_000, extra=["--config", str(cfg)]
    )
    async with aiohttp.ClientSession() as s:
        st, _h, raw = await post(
            s,
            router.url,
            "/v1/completions",
            {"model": MODEL, "prompt": "slow " * 3000, "max_tokens": 400},
        )
        assert st == 504, raw
        assert json.loads(raw)["error"]["type"] == "timeout"


async def _slow_engines_routed(fleet: Fleet, start_sims, n: int):
    """`n` engines 20 times slower than the 70B profile (seconds of prefill) behind a router."""
    sims = await start_sims(fleet, n, profile="llama-3.1-70b-h100", time_scale=20.0)
    router = await fleet.start_router("router", sims, policy="prefix", kv_capacity=100_000)
    return sims, router


async def _stream_events(r: aiohttp.ClientResponse) -> list[bytes]:
    return [line[5:].strip() async for line in r.content if line.startswith(b"data:")]


async def test_stream_headers_precede_the_first_token(fleet: Fleet, start_sims):
    # 200 and the headers as soon as the engine took the request, while it still prefills
    # (seconds here): the client's work on them overlaps the prefill, as with the engine itself
    sims, router = await _slow_engines_routed(fleet, start_sims, 1)
    async with aiohttp.ClientSession() as s:
        t0 = time.perf_counter()
        async with s.post(
            router.url + "/v1/completions",
            json={"model": MODEL, "prompt": "slow " * 3000, "max_tokens": 2, "stream": True},
        ) as r:
            headers_after = time.perf_counter() - t0
            assert r.status == 200
            assert r.headers["Content-Type"].startswith("text/event-stream")
            assert r.headers["x-routed-to"] == sims[0]
            events = await _stream_events(r)
            first_after = time.perf_counter() - t0
    assert events[-1] == b"[DONE]"
    # a 3,750-token prefill at 79 us a token, 20 times slower: ~6 s
    assert first_after > 2.0
    assert headers_after < 1.0, (headers_after, first_after)


async def test_stream_retried_into_the_same_response_when_its_engine_dies(
    fleet: Fleet, start_sims
):
    # The engine answered 200 (so did the router) and died before the first token: the
    # stream is served whole by the other engine, the client sees one complete stream.
    sims, router = await _slow_engines_routed(fleet, start_sims, 2)
    async with aiohttp.ClientSession() as s:
        async with s.post(
            router.url + "/v1/chat/completions",
            json=chat("who serves me?", max_tokens=3, stream=True),
        ) as r:
            assert r.status == 200
            first = r.headers["x-routed-to"]
            victim = fleet.procs[sims.index(first)]
            os.killpg(victim.process.pid, signal.SIGKILL)
            events = await _stream_events(r)
        async with s.get(router.metrics) as m:
            assert "prefix_router_retries_total 1.0" in await m.text()
    assert events[-1] == b"[DONE]"
    objs = [json.loads(e) for e in events[:-1]]
    assert not [o for o in objs if "error" in o], objs
    text = "".join(c["delta"].get("content", "") for o in objs for c in o["choices"])
    assert len(text) == 3 * 4  # all three tokens, from the survivor


async def test_stream_no_engine_can_start_ends_with_an_error_event(fleet: Fleet, start_sims):
    # After the 200 went out, no engine starts the stream: it ends with an OpenAI error event
    # and [DONE] (vLLM's way of failing a stream), never hangs or cuts without a word.
    _sims, router = await _slow_engines_routed(fleet, start_sims, 1)
    async with aiohttp.ClientSession() as s:
        async with s.post(
            router.url + "/v1/chat/completions",
            json=chat("nobody will answer", max_tokens=3, stream=True),
        ) as r:
            assert r.status == 200
            os.killpg(fleet.procs[0].process.pid, signal.SIGKILL)
            events = await asyncio.wait_for(_stream_events(r), 10)
    assert events[-1] == b"[DONE]"
    err = json.loads(events[-2])["error"]
    assert err["type"] == "service_unavailable"
    assert "no backend could serve" in err["message"]


async def test_stream_upstream_timeout_is_an_error_event(
    fleet: Fleet, start_sims, tmp_path: Path
):
    sims = await start_sims(fleet, 1, profile="llama-3.1-70b-h100", time_scale=5.0)
    cfg = tmp_path / "router.yaml"
    cfg.write_text("upstream_timeout_s: 0.3\n")
    router = await fleet.start_router(
        "router", sims, policy="prefix", kv_capacity=100_000, extra=["--config", str(cfg)]
    )
    async with aiohttp.ClientSession() as s:
        async with s.post(
            router.url + "/v1/completions",
            json={"model": MODEL, "prompt": "slow " * 3000, "max_tokens": 400, "stream": True},
        ) as r:
            assert r.status == 200
            events = await asyncio.wait_for(_stream_events(r), 10)
    assert events[-1] == b"[DONE]"
    assert json.loads(events[-2])["error"]["type"] == "timeout"


async def test_a_slow_client_gets_a_long_stream_whole(fleet: Fleet, start_sims):
    # ~6 MB of SSE at once from a zero-latency engine to a client that reads nothing for a
    # while: the router holds the engine back (TCP) instead of buffering, and every event
    # arrives, in order, once the client reads.
    sims = await start_sims(fleet, 1, profile="zero", kv=200_000)
    router = await fleet.start_router("router", sims, policy="prefix", kv_capacity=200_000)
    n = 25_000
    reader, writer = await asyncio.open_connection("127.0.0.1", int(router.url.rsplit(":", 1)[1]))
    body = json.dumps({"model": MODEL, "prompt": "go", "max_tokens": n, "stream": True}).encode()
    writer.write(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%b" % (len(body), body)
    )
    await writer.drain()
    await asyncio.sleep(1.5)  # not reading: the client's socket buffer fills up
    raw = b""

    async def read_all() -> bytes:
        data = b""
        while not data.endswith(b"\r\n0\r\n\r\n"):
            more = await reader.read(1 << 20)
            assert more, "the router closed the stream before its end"
            data += more
        return data

    raw = await asyncio.wait_for(read_all(), 30)
    writer.close()
    head, _, chunked = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and b"chunked" in head.lower()
    payload = bytearray()
    rest = chunked
    while True:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            break
        payload += rest[:size]
        rest = rest[size + 2 :]
    events = [e[6:] for e in bytes(payload).split(b"\n\n") if e.startswith(b"data: ")]
    assert events[-1] == b"[DONE]"
    texts = [json.loads(e)["choices"][0]["text"] for e in events[:-1]]
    assert len(texts) == n and all(len(t) == 4 for t in texts)


async def test_failover_mid_load_loses_no_request(fleet: Fleet, start_sims):
    sims = await start_sims(fleet, 3, time_scale=3.0)
    router = await fleet.start_router("router", sims, policy="prefix", kv_capacity=100_000)
    victim = fleet.procs[0]
    results: list[int] = []

    async def client(s: aiohttp.ClientSession, k: int) -> None:
        for i in range(12):
            st, _h, _b = await post(
                s,
                router.url,
                "/v1/chat/completions",
                chat(f"client {k} question {i}", system=f"tenant {k % 6} " * 200, max_tokens=20),
            )
            results.append(st)

    async with aiohttp.ClientSession() as s:
        load = asyncio.gather(*(client(s, k) for k in range(12)))
        # the engine dies with requests of every client in flight, after some were served
        await waiting.until(lambda: len(results) >= 24, 60, "the first answers")
        os.killpg(victim.process.pid, signal.SIGKILL)
        await load
    assert len(results) == 144
    assert set(results) == {200}, results


async def test_client_disconnect_cancels_upstream(fleet: Fleet, start_sims):
    sims = await start_sims(fleet, 1, time_scale=5.0)
    router = await fleet.start_router("router", sims, policy="prefix", kv_capacity=100_000)
    async with aiohttp.ClientSession() as s:
        r = await s.post(
            router.url + "/v1/chat/completions",
            json=chat("go on forever", max_tokens=2000, stream=True),
        )
        assert r.status == 200
        await r.content.readline()
        r.close()  # the client goes away mid-stream
        deadline = time.monotonic() + 5
        running = None
        while time.monotonic() < deadline:
            async with s.get(sims[0] + "/stats") as st:
                stats = await st.json()
            running = stats["running"] + stats["waiting"]
            if running == 0:
                break
            await asyncio.sleep(0.1)
        assert running == 0


async def test_ejection_and_readmission(fleet: Fleet, start_sims, tmp_path: Path):
    sims = await start_sims(fleet, 2)
    cfg = tmp_path / "router.yaml"
    cfg.write_text(
        "health: {probe_interval_s: 0.2, eject_after_failures: 2, readmit_after_s: 0.5}\n"
    )
    router = await fleet.start_router(
        "router", sims, policy="prefix", kv_capacity=100_000, extra=["--config", str(cfg)]
    )
    victim = fleet.procs[0]
    port = int(victim.url.rsplit(":", 1)[1])
    async with aiohttp.ClientSession() as s:

        async def healthy() -> int:
            async with s.get(router.url + "/readyz") as r:
                return (await r.json())["healthy_backends"]

        assert await healthy() == 2
        os.killpg(victim.process.pid, signal.SIGKILL)
        await victim.process.wait()
        for _ in range(50):
            if await healthy() == 1:
                break
            await asyncio.sleep(0.1)
        assert await healthy() == 1
        # every request still succeeds, on the survivor
        for i in range(5):
            st, h, _b = await post(
                s,
                router.url,
                "/v1/completions",
                {"model": MODEL, "prompt": f"hello {i}" * 50, "max_tokens": 2},
            )
            assert st == 200 and h["x-routed-to"] == sims[1]
        # the backend comes back on the same port and is re-admitted
        await fleet.start_sim(
            "sim0b", model=MODEL, kv_capacity=100_000, profile="fast", time_scale=1.0, port=port
        )
        for _ in range(50):
            if await healthy() == 2:
                break
            await asyncio.sleep(0.1)
        assert await healthy() == 2


async def test_metrics_and_probes(fleet: Fleet, start_sims):
    sims = await start_sims(fleet, 2)
    router = await fleet.start_router("router", sims, policy="prefix", kv_capacity=100_000)
    async with aiohttp.ClientSession() as s:
        await post(s, router.url, "/v1/chat/completions", chat("one"))
        await post(s, router.url, "/v1/chat/completions", chat("two"))
        async with s.get(router.metrics) as r:
            text = await r.text()
        async with s.get(router.url + "/healthz") as r:
            assert r.status == 200
    for name in (
        "prefix_router_requests_total",
        "prefix_router_routing_decisions_total",
        "prefix_router_estimated_hit_ratio",
        "prefix_router_ttft_seconds_bucket",
        "prefix_router_backend_in_flight",
        "prefix_router_cache_prediction_error_tokens_bucket",
        "prefix_router_reported_cached_tokens_total",
    ):
        assert name in text, name
    assert 'decision="hit"' in text


def _gauge(text: str, name: str) -> list[float]:
    return [float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name)]


async def test_router_reads_the_engines_step_rhythm(fleet: Fleet, start_sims):
    # Streams through the router must show it the engine's decode-step rhythm (15 ms plus the
    # KV read on the 70B profile, longer on a busy machine), and their first tokens the lead.
    sims = await start_sims(fleet, 1, profile="llama-3.1-70b-h100")
    router = await fleet.start_router("router", sims, policy="prefix", kv_capacity=100_000)

    async def stream(s: aiohttp.ClientSession, i: int, max_tokens: int) -> None:
        body = chat(f"question {i}", max_tokens=max_tokens, stream=True)
        async with s.post(router.url + "/v1/chat/completions", json=body) as r:
            assert r.status == 200
            await r.read()

    async with aiohttp.ClientSession() as s:
        await stream(s, 0, 4)  # the system prompt is cached from here on
        background = [asyncio.create_task(stream(s, i, 150)) for i in range(1, 5)]
        await asyncio.sleep(0.3)
        for i in range(5, 45):  # short streams sent at every phase of the steps
            await stream(s, i, 1)
            await asyncio.sleep(0.007)
        await asyncio.gather(*background)
        async with s.get(router.metrics) as r:
            text = await r.text()
        async with s.get(sims[0] + "/metrics") as r:
            engine = await r.text()
    (step,) = _gauge(text, "prefix_router_backend_step_seconds{")
    (lead,) = _gauge(text, "prefix_router_backend_step_lead_seconds{")
    # the engine's own decode steps, as long as they really took on this machine now
    (steps,) = _gauge(engine, "engine_sim_decode_steps ")
    (seconds,) = _gauge(engine, "engine_sim_decode_step_seconds ")
    own = seconds / steps
    assert 0.75 * own < step < 1.25 * own, (step, own, text)
    # sending and hearing back: above nothing, under a step
    assert 0.0 < lead < own, (lead, own, text)
