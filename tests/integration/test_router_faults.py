"""The router's answers to odd input and to engines that fail in ways other than dying:
one that never accepts a connection, one that takes requests and never answers, one that
stops in the middle of a stream. All real processes and sockets on 127.0.0.1."""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import signal
import socket
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from bench.harness.fleet import Fleet, free_port
from bench.harness.promtext import sample_sum

pytestmark = pytest.mark.slow

MODEL = "test-model"


async def _metrics(s: aiohttp.ClientSession, url: str) -> str:
    async with s.get(url) as r:
        return await r.text()


async def test_odd_bodies_and_methods_get_openai_errors(fleet: Fleet, start_sims):
    sims = await start_sims(fleet, 1)
    router = await fleet.start_router("router", sims, policy="prefix", kv_capacity=100_000)
    js = {"Content-Type": "application/json"}
    ok = json.dumps({"model": MODEL, "prompt": "hello " * 40, "max_tokens": 2}).encode()
    cases: list[tuple[bytes, dict[str, str], int]] = [
        (b"[" * 100_000 + b"]" * 100_000, js, 400),  # nested past any parser's stack
        (b'{"model": "test-model", "prompt": "ab\\ud800cd"}', js, 400),  # a lone surrogate
        (b'{"model": "test-model", "prompt": "x", "cache_salt": "\\udc00"}', js, 400),
        (ok, {**js, "Content-Encoding": "gzip"}, 400),  # says gzip, is not
        (gzip.compress(ok), {**js, "Content-Encoding": "gzip"}, 200),  # is gzip: read, then sent on
    ]
    async with aiohttp.ClientSession() as s:
        for data, headers, want in cases:
            async with s.post(router.url + "/v1/completions", data=data, headers=headers) as r:
                raw = await r.read()
                assert r.status == want, (data[:60], headers, raw)
                if want != 200:
                    assert json.loads(raw)["error"]["message"]
        async with s.get(router.url + "/v1/completions") as r:
            assert r.status == 405
            assert "POST" in r.headers["Allow"]
            assert "not allowed" in (await r.json())["error"]["message"]
        async with s.get(router.url + "/v1/nothing-here") as r:
            assert r.status == 404
            assert "no route" in (await r.json())["error"]["message"]
        assert sample_sum(await _metrics(s, router.metrics), "prefix_router_requests_total") >= 1


@pytest.fixture
def never_accepting() -> Iterator[str]:
    """A port whose listen queue is full and never served: a connect to it hangs (the kernel
    drops the SYN), as to a host that went away without a reset."""
    port = free_port()
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", port))
    srv.listen(0)
    fillers = []
    for _ in range(4):
        c = socket.socket()
        c.setblocking(False)
        try:
            c.connect(("127.0.0.1", port))
        except BlockingIOError:
            pass
        fillers.append(c)
    yield f"http://127.0.0.1:{port}"
    for c in fillers:
        c.close()
    srv.close()


async def test_a_connect_timeout_is_retried_on_the_next_backend(
    fleet: Fleet, start_sims, never_accepting: str, tmp_path: Path
):
    sims = await start_sims(fleet, 1)
    cfg = tmp_path / "router.yaml"
    # probes seldom and many failures before ejection: the requests meet the dead host
    cfg.write_text(
        "connect_timeout_s: 0.3\n"
        "health: {probe_interval_s: 60, probe_timeout_s: 0.2, eject_after_failures: 20}\n"
    )
    router = await fleet.start_router(
        "router",
        [never_accepting, *sims],
        policy="round-robin",
        kv_capacity=100_000,
        extra=["--config", str(cfg)],
    )
    async with aiohttp.ClientSession() as s:
        for i in range(4):
            async with s.post(
                router.url + "/v1/completions",
                json={"model": MODEL, "prompt": f"hi {i} " * 30, "max_tokens": 2},
            ) as r:
                assert r.status == 200, await r.text()
                assert r.headers["x-routed-to"] == sims[0]
        text = await _metrics(s, router.metrics)
    assert (
        sample_sum(
            text, "prefix_router_requests_total", backend=never_accepting, outcome="connect_error"
        )
        >= 1
    )
    assert sample_sum(text, "prefix_router_retries_total") >= 1


async def test_an_engine_that_never_answers_is_ejected(fleet: Fleet, start_sims, tmp_path: Path):
    # Engine 0 answers its health probe at once but takes seconds for a request (the 70B
    # profile 20 times slowed), so every request to it times out; engine 1 is quick.
    slow = await start_sims(fleet, 1, profile="llama-3.1-70b-h100", time_scale=20.0)
    quick = await fleet.start_sim(
        "quick", model=MODEL, kv_capacity=100_000, profile="fast", time_scale=1.0
    )
    cfg = tmp_path / "router.yaml"
    cfg.write_text(
        "upstream_timeout_s: 0.3\n"
        "health: {probe_interval_s: 60, eject_after_failures: 2, readmit_after_s: 60}\n"
    )
    router = await fleet.start_router(
        "router",
        [slow[0], quick.url],
        policy="round-robin",
        kv_capacity=100_000,
        extra=["--config", str(cfg)],
    )
    statuses = []
    async with aiohttp.ClientSession() as s:
        for i in range(8):
            async with s.post(
                router.url + "/v1/completions",
                json={"model": MODEL, "prompt": f"slow {i} " * 3000, "max_tokens": 4},
            ) as r:
                statuses.append(r.status)
                if r.status == 504:
                    assert (await r.json())["error"]["type"] == "timeout"
        async with s.get(router.url + "/readyz") as r:
            ready = await r.json()
    # two timeouts eject it; after that every request goes to the quick engine
    assert statuses.count(504) == 2, statuses
    assert statuses[-4:] == [200] * 4
    assert ready["healthy_backends"] == 1


async def test_a_stream_cut_after_its_first_token_ends_with_an_error_event(
    fleet: Fleet, start_sims
):
    # the 70B profile 20 times slowed: ~0.5 s a token, so the engine dies mid-answer
    sims = await start_sims(fleet, 1, profile="llama-3.1-70b-h100", time_scale=20.0)
    router = await fleet.start_router("router", sims, policy="prefix", kv_capacity=100_000)
    events: list[bytes] = []
    async with aiohttp.ClientSession() as s:
        async with s.post(
            router.url + "/v1/completions",
            json={"model": MODEL, "prompt": "cut me " * 20, "max_tokens": 50, "stream": True},
        ) as r:
            assert r.status == 200

            async def read() -> None:
                async for line in r.content:
                    if line.startswith(b"data:"):
                        events.append(line[5:].strip())
                        if len(events) == 1:
                            os.killpg(fleet.procs[0].process.pid, signal.SIGKILL)

            await asyncio.wait_for(read(), 20)
        text = await _metrics(s, router.metrics)
    assert json.loads(events[0])["choices"][0]["text"]
    assert events[-1] == b"[DONE]"
    err = json.loads(events[-2])["error"]
    assert "cut" in err["message"]
    assert sample_sum(text, "prefix_router_requests_total", outcome="stream_cut") == 1
