"""SIGTERM on a real router process (issue 23, item 9): readiness fails first, the listener
keeps serving new connections through `drain_grace_s`, a second SIGTERM does not cut the
drain, and a stream in flight ends whole before the process exits 0."""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path

import aiohttp
import pytest
from waiting import scaled, until

from bench.harness.fleet import Fleet

MODEL = "test-model"
TOKENS = 300  # at the 70B profile slowed 5x (~75 ms a token): a stream of ~20 s

pytestmark = pytest.mark.slow


async def test_sigterm_drains_and_a_second_one_does_not_cut_a_stream(
    fleet: Fleet, start_sims, tmp_path: Path
) -> None:
    sims = await start_sims(fleet, 1, profile="llama-3.1-70b-h100", time_scale=5.0)
    cfg = tmp_path / "router.yaml"
    cfg.write_text("drain_grace_s: 6.0\nshutdown_timeout_s: 120.0\n")
    router = await fleet.start_router("router", sims, policy="prefix", kv_capacity=100_000,
                                      extra=["--config", str(cfg), "--log-level", "info"])
    body = {"model": MODEL, "prompt": "drain " * 200, "max_tokens": TOKENS, "stream": True}
    first = asyncio.Event()

    async def stream() -> list[bytes]:
        async with aiohttp.ClientSession() as s, s.post(router.url + "/v1/completions",
                                                        json=body) as r:
            assert r.status == 200
            events = []
            async for line in r.content:
                if line.startswith(b"data:"):
                    events.append(line[5:].strip())
                    first.set()
            return events

    task = asyncio.create_task(stream())
    await asyncio.wait_for(first.wait(), scaled(60))

    async def status(path: str) -> int:
        # a new connection each time: the listener must still accept them while draining
        async with aiohttp.ClientSession() as s, s.get(router.url + path) as r:
            return r.status

    router.process.send_signal(signal.SIGTERM)
    async def not_ready() -> bool:
        return await status("/readyz") == 503

    await until(not_ready, 60, "/readyz to fail after SIGTERM", interval=0.05)
    assert await status("/healthz") == 200  # alive: a liveness probe must not restart it
    async with aiohttp.ClientSession() as s, s.post(router.url + "/v1/completions", json={
            "model": MODEL, "prompt": "late client", "max_tokens": 2}) as r:
        assert r.status == 200, await r.text()  # served: it had not heard of the drain yet
    assert not task.done(), "the stream ended before the second SIGTERM: make it longer"
    router.process.send_signal(signal.SIGTERM)

    events = await asyncio.wait_for(task, scaled(180))
    assert events[-1] == b"[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert not any("error" in c for c in chunks), chunks[-3:]
    ends = [ch["finish_reason"] for c in chunks for ch in c.get("choices", [])
            if ch.get("finish_reason")]
    assert ends == ["length"], ends  # the engine's own end: every token arrived
    assert await asyncio.wait_for(router.process.wait(), scaled(60)) == 0
    log = router.log_path.read_text()
    assert "already draining" in log

