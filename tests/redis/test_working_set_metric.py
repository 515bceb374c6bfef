"""The working set on the routers' /metrics (prefix_router_working_set_tokens), for the
prometheus-adapter path: two router apps of one model on a real redis-server, real engine
simulator processes behind them, requests through the routers' HTTP API.

The gauge must be the figure the Redis-based adapter serves (the routers' published
`working_set_tokens`, read as external_metrics.totals reads it), the same on every router of
the model (a union, not a sum), the distinct blocks requested x block size, and absent, not
stale, while Redis is away.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as aioredis
import waiting
from aiohttp.test_utils import TestClient, TestServer

from bench.harness.fleet import Fleet
from prefix_operator.external_metrics import totals
from prefix_router.app import build_app
from prefix_router.config import RouterSettings
from prefix_router.contract import RouterFigures
from prefix_router.metrics import RouterMetrics
from prefix_router.parsing import parse_request
from prefix_router.prefix import block_hashes, chain_seed
from prefix_router.redis.figures import WORKING_SET_STALE_S as WS_STALE_S
from prefix_router.store import StoreStats

pytestmark = pytest.mark.redis

MODEL = "test-model"
GAUGE = "prefix_router_working_set_tokens"


def sample(text: str) -> float | None:
    """The gauge's value in a /metrics page, None when the series has no sample."""
    assert f"# TYPE {GAUGE} gauge" in text, "the series is not exported at all"
    m = re.search(rf"^{GAUGE} (\S+)$", text, re.M)
    return float(m.group(1)) if m else None


def test_no_sample_until_a_value_is_set() -> None:
    from prometheus_client import generate_latest

    m = RouterMetrics()
    assert sample(generate_latest(m.registry).decode()) is None
    m.show_store(0, StoreStats(working_set_tokens=4096))
    assert sample(generate_latest(m.registry).decode()) == 4096
    m.show_store(0, StoreStats(working_set_tokens=None))
    assert sample(generate_latest(m.registry).decode()) is None


def settings(url: str, sims: list[str], rid: str) -> RouterSettings:
    return RouterSettings.model_validate({
        "model_key": "ml/llama", "kv_capacity_tokens": 100_000, "block_size": 16,
        "discovery": {"backends": sims},
        "metrics_port": None,  # the app alone (no serve()): /metrics on its one port
        "store": {"mode": "redis", "url": url, "near_cache_ttl_ms": 0, "write_delay_ms": 0,
                  "router_id": rid},
    })  # fmt: skip


@pytest.fixture
async def routers(redis_server: Any, fleet: Fleet) -> AsyncIterator[list[TestClient]]:
    sims = []
    for i in range(2):
        p = await fleet.start_sim(f"sim{i}", model=MODEL, kv_capacity=100_000, profile="fast",
                                  time_scale=1.0)  # fmt: skip
        sims.append(p.url)
    clients = []
    try:
        for rid in ("router-a", "router-b"):
            app = build_app(settings(redis_server.url, sims, rid))
            client = TestClient(TestServer(app))
            await client.start_server()
            clients.append(client)
        yield clients
    finally:
        for c in clients:
            await c.close()


async def ask(client: TestClient, prompt: str) -> None:
    r = await client.post("/v1/completions",
                          json={"model": MODEL, "prompt": prompt, "max_tokens": 1})  # fmt: skip
    assert r.status == 200, await r.text()
    await r.read()


def blocks(prompt: str) -> set[int]:
    """The block hashes the router computes for this prompt (its own functions)."""
    s = RouterSettings()
    body = json.dumps({"model": MODEL, "prompt": prompt}).encode()
    parsed = parse_request(body, "completions")
    return set(block_hashes(parsed.canonical, s.block_bytes, chain_seed(MODEL, None)))


async def gauge(client: TestClient) -> float | None:
    r = await client.get("/metrics")
    assert r.status == 200
    return sample(await r.text())


async def wait_for(predicate: Any, timeout: float, what: str) -> Any:
    return await waiting.until(predicate, timeout, what, interval=0.1)

async def test_the_gauge_is_the_adapters_working_set_on_every_router(
    redis_server: Any, routers: list[TestClient]
) -> None:
    a, b = routers
    shared = "You are a careful assistant for the billing team. " * 20
    p1, p2 = shared + "Question one?", shared + "A different question, longer. " * 10
    await ask(a, p1)
    await ask(b, p1)  # the same prefix through another router: counted once
    await ask(b, p2)
    distinct = blocks(p1) | blocks(p2)
    assert len(distinct) < len(blocks(p1)) + len(blocks(p2))  # they do share a prefix
    expected = len(distinct) * 16
    # Router a was asked for p1 only: a gauge of expected there counts what router b saw too.
    assert len(blocks(p1)) * 16 < expected

    async def both_counted() -> tuple[float, float] | None:
        va, vb = await gauge(a), await gauge(b)
        return (va, vb) if va and vb and va == vb and va >= expected * 0.98 else None

    va, vb = await wait_for(both_counted, 10, "both routers to count the working set")
    # A HyperLogLog estimate; at this size Redis's is within a block or two.
    assert va == vb == pytest.approx(expected, rel=0.02)

    # The figure the Redis-based adapter serves, from the hashes the same routers publish.
    r = aioredis.from_url(redis_server.url, decode_responses=True)
    try:

        async def published() -> list[dict[str, str]] | None:
            hs = [await r.hgetall(f"prefixrouter:ml/llama:router:{rid}")
                  for rid in ("router-a", "router-b")]  # fmt: skip
            ok = all(h and float(h["working_set_tokens"]) == va for h in hs)
            return hs if ok else None

        hashes = await wait_for(published, 10, "the routers' published figures")
    finally:
        await r.aclose()
    t = totals([RouterFigures.from_hash(h) for h in hashes], now=time.time())
    assert t is not None and t.working_set_tokens == va


async def test_no_sample_while_redis_is_away(redis_server: Any, routers: list[TestClient]) -> None:
    a, _b = routers
    await ask(a, "Tell me about the weather on the coast today, briefly. " * 8)
    await wait_for(lambda: gauge(a), 10, "a working-set sample")
    redis_server.stop()
    t0 = time.monotonic()

    async def gone() -> bool:
        return await gauge(a) is None

    await wait_for(gone, WS_STALE_S + 5, "the sample to go once Redis is away")
    # Not before the count could be called stale: a short outage is not a missing value.
    assert time.monotonic() - t0 >= WS_STALE_S - 1
    # Routing goes on without the store.
    await ask(a, "Another question while the store is down, long enough to hash. " * 4)
