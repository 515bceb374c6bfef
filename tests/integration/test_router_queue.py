"""The dispatch queue in a real router process before a real simulator whose two running slots
are taken by long streams (issue 39): a client that leaves while queued leaves the queue at
once, SIGTERM answers what waits with 503 and Retry-After while the streams end whole, and a
flood is refused at the queue's bound with 429 and Retry-After, its memory flat."""

from __future__ import annotations

import asyncio
import re
import signal
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from waiting import scaled, until

from bench.harness.fleet import Fleet, Proc, memory_of

MODEL = "test-model"
TOKENS = 300  # at the 70B profile slowed 5x (~75 ms a token): a stream of ~20 s

pytestmark = pytest.mark.slow


def config(tmp_path: Path, **queue: Any) -> Path:
    lines = ["queue:", "  max_in_flight: 2", "  max_waiting: 0"]
    lines += [f"  {k}: {v}" for k, v in queue.items()]
    cfg = tmp_path / "router.yaml"
    cfg.write_text("\n".join(lines) + "\n")
    return cfg


async def saturated(fleet: Fleet, start_sims, tmp_path: Path, **queue: Any) -> Proc:
    sims = await start_sims(fleet, 1, profile="llama-3.1-70b-h100", time_scale=5.0,
                            extra=["--max-num-seqs", "2"])
    return await fleet.start_router("router", sims, policy="prefix", kv_capacity=100_000,
                                    extra=["--config", str(config(tmp_path, **queue))])


async def metric(router: Proc, name: str) -> float:
    async with aiohttp.ClientSession() as s, s.get(router.metrics) as r:
        text = await r.text()
    m = re.search(rf"^{re.escape(name)} ([0-9.e+-]+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


Streams = list[asyncio.Task[list[bytes]]]


async def occupy(router: Proc, n: int) -> tuple[Streams, aiohttp.ClientSession]:
    """`n` long streams, each once its first event is in."""
    session = aiohttp.ClientSession()
    started = [asyncio.Event() for _ in range(n)]

    async def stream(i: int) -> list[bytes]:
        body = {"model": MODEL, "prompt": f"stream {i} " * 50, "max_tokens": TOKENS,
                "stream": True}
        async with session.post(router.url + "/v1/completions", json=body) as r:
            assert r.status == 200
            events = []
            async for line in r.content:
                if line.startswith(b"data:"):
                    events.append(line[5:].strip())
                    started[i].set()
            return events

    tasks = [asyncio.create_task(stream(i)) for i in range(n)]
    await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started)), scaled(60))
    return tasks, session


async def post(router: Proc, prompt: str) -> tuple[int, dict[str, str], Any]:
    async with aiohttp.ClientSession() as s, s.post(router.url + "/v1/completions", json={
            "model": MODEL, "prompt": prompt, "max_tokens": 2}) as r:
        return r.status, dict(r.headers), await r.json(content_type=None)


async def test_a_client_gone_while_queued_leaves_the_queue(
    fleet: Fleet, start_sims, tmp_path: Path
) -> None:
    router = await saturated(fleet, start_sims, tmp_path)
    streams, session = await occupy(router, 2)
    waiter = asyncio.create_task(post(router, "queued then gone"))

    async def queued() -> bool:
        return await metric(router, "prefix_router_queued") == 1

    await until(queued, 30, "the request to wait in the router's queue")
    waiter.cancel()  # the client closes its connection

    async def left() -> bool:
        return await metric(router, "prefix_router_queued") == 0

    await until(left, 30, "the queue to be empty once its client left")
    assert not any(t.done() for t in streams), "the queue emptied only as the streams ended"
    gone = 'prefix_router_queue_decisions_total{band="standard",decision="refused",' \
           'reason="client_gone"}'
    assert await metric(router, gone) == 1
    for t in streams:
        t.cancel()
    await session.close()


async def test_sigterm_answers_what_waits_with_503_and_ends_the_streams_whole(
    fleet: Fleet, start_sims, tmp_path: Path
) -> None:
    router = await saturated(fleet, start_sims, tmp_path)
    streams, session = await occupy(router, 2)
    waiters = [asyncio.create_task(post(router, f"queued {i}")) for i in range(3)]

    async def queued() -> bool:
        return await metric(router, "prefix_router_queued") == 3

    await until(queued, 30, "three requests waiting in the router's queue")
    router.process.send_signal(signal.SIGTERM)
    for status, headers, body in await asyncio.wait_for(asyncio.gather(*waiters), scaled(60)):
        assert status == 503, body
        assert headers.get("Retry-After") == "1"
        assert body["error"]["type"] == "service_unavailable"
        assert "shutting down" in body["error"]["message"]
    assert not any(t.done() for t in streams), "a stream ended before the drain: make it longer"
    for events in await asyncio.wait_for(asyncio.gather(*streams), scaled(180)):
        assert events[-1] == b"[DONE]" and b"error" not in b"".join(events)
    await session.close()
    assert await asyncio.wait_for(router.process.wait(), scaled(60)) == 0


async def test_a_flood_is_refused_at_the_queues_bound_with_memory_flat(
    fleet: Fleet, start_sims, tmp_path: Path
) -> None:
    router = await saturated(fleet, start_sims, tmp_path, max_requests=10)
    streams, session = await occupy(router, 2)
    prompt = "flood " * 20_000  # 120 kB a request: what an unbounded queue would keep
    waiting: list[asyncio.Task[tuple[int, dict[str, str], Any]]] = []
    rss = []
    for wave in range(6):
        batch = [asyncio.create_task(post(router, f"{wave} {i} {prompt}")) for i in range(40)]
        waiting += batch

        async def refused(batch: list[asyncio.Task] = batch, n: int = 30 if wave == 0 else 40
                          ) -> bool:  # fmt: skip
            return sum(t.done() for t in batch) >= n

        await until(refused, 60, f"wave {wave}'s requests beyond the bound refused")
        for t in batch:
            if t.done():
                status, headers, body = t.result()
                assert status == 429, body
                assert int(headers["Retry-After"]) >= 1
                assert body["error"]["type"] == "rate_limit_error"
        assert await metric(router, "prefix_router_queued") == 10
        rss.append(memory_of(router.process.pid)["rss_mb"])
    # 200 requests of 120 kB beyond the bound: an unbounded queue holds 24 MB more at least
    assert rss[-1] - rss[1] < 12, rss
    for t in [*streams, *waiting]:
        t.cancel()
    await session.close()
