"""A client learns no engine's address from the router as deployed: `expose_routing` is off
by default, and then an error that would name the engine (the last failure of a request no
engine could take, a stream cut by its engine) says "the engine" instead, and no answer
carries `x-routed-to`. Every other fleet test turns `--expose-routing` on to read where
requests went; these start `prefix-router` without it (bench's Fleet, not the tests' one)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path

import aiohttp
import pytest

from bench.harness.fleet import Fleet, Proc

pytestmark = pytest.mark.slow

MODEL = "test-model"


@pytest.fixture
async def plain_fleet(tmp_path: Path):
    async with Fleet(tmp_path / "logs") as fleet:
        yield fleet


def assert_no_address(engine: Proc, status: int, headers: object, body: bytes) -> None:
    """Neither the engine's host nor its port appears in what the client got."""
    port = engine.url.rsplit(":", 1)[1]
    seen = str(list(headers.items())).encode() + body  # type: ignore[attr-defined]
    assert b"127.0.0.1" not in seen and f":{port}".encode() not in seen, (status, seen[-600:])


async def _router(fleet: Fleet, sims: list[str], tmp_path: Path) -> Proc:
    # Probed once, at the start: a killed engine stays a candidate, so requests meet it
    # (what a crash between two probes looks like), and failures never eject it here.
    config = tmp_path / "router.yaml"
    config.write_text(json.dumps({"health": {"probe_interval_s": 3600,
                                             "eject_after_failures": 1000}}))  # fmt: skip
    return await fleet.start_router("router", sims, policy="prefix", kv_capacity=100_000,
                                    extra=["--config", str(config)])  # fmt: skip


async def test_no_error_names_an_engine_by_default(plain_fleet: Fleet, tmp_path: Path) -> None:
    fleet = plain_fleet
    # ~0.5 s a token (the 70B profile 20 times slowed): the engine dies mid-answer
    sim = await fleet.start_sim("sim", model=MODEL, kv_capacity=100_000,
                                profile="llama-3.1-70b-h100", time_scale=20.0)  # fmt: skip
    router = await _router(fleet, [sim.url], tmp_path)
    chat = {"model": MODEL, "max_tokens": 50, "messages": [{"role": "user", "content": "hi"}]}
    async with aiohttp.ClientSession() as s:
        # a stream its engine cuts after the first token: ends with an error event
        async with s.post(router.url + "/v1/chat/completions", json={**chat, "stream": True}
                          ) as r:  # fmt: skip
            assert r.status == 200
            headers, got = r.headers, b""
            async for line in r.content:
                got += line
                if got.count(b"data:") == 1:
                    os.killpg(sim.process.pid, signal.SIGKILL)
        events = [ln[5:].strip() for ln in got.splitlines() if ln.startswith(b"data:")]
        assert events[-1] == b"[DONE]"
        error = json.loads(events[-2])["error"]
        assert error["message"] == "the stream from the engine was cut"
        assert "x-routed-to" not in headers and "x-route-reason" not in headers
        assert_no_address(sim, r.status, headers, got)
        await asyncio.wait_for(sim.process.wait(), 30)
        # the engine is gone and still a candidate: no engine could take these
        for body in (chat, {**chat, "stream": True}):
            async with s.post(router.url + "/v1/chat/completions", json=body) as r:
                raw = await r.read()
                assert r.status == 503, raw
                message = json.loads(raw)["error"]["message"]
                assert message.startswith("no backend could serve the request ("), message
                assert_no_address(sim, r.status, r.headers, raw)
