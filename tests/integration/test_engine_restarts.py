"""Engines that come back empty behind the same address, detected without KV events
(restarts.py, engine_states.py): a real simulator restarted on its port, or its prefix cache
reset, behind a router in this process; the router drops that engine's entries at once.

The routers here eject an engine only after many failures: the case the detector exists for is
the engine that is back before the router would have ejected it (ejection drops the entries on
its own)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import waiting
from aiohttp import ClientSession
from aiohttp.test_utils import TestClient, TestServer

from bench.harness.fleet import Fleet, Proc
from bench.harness.promtext import sample_sum
from prefix_router.app import CORE, build_app
from prefix_router.config import RouterSettings
from prefix_router.core import RouterCore
from prefix_router.index import DEGRADED, ESTIMATED
from prefix_router.parsing import parse_for_routing

MODEL = "test-model"


def chat(i: int) -> dict[str, Any]:
    system = f"You are assistant number {i}; you answer briefly about invoices. " * 12
    return {"model": MODEL, "max_tokens": 2,
            "messages": [{"role": "system", "content": system},
                         {"role": "user", "content": "what is due?"}]}  # fmt: skip


async def holders(core: RouterCore, body: dict[str, Any]) -> dict[str, int]:
    """Per backend, the leading blocks of the request's prompt the index says it holds."""
    import json

    parsed, _ = parse_for_routing(json.dumps(body).encode(), "chat", None, False, False)
    key = await core.keyer.key(parsed, core.backends.healthy())
    return await core.index.lookup(MODEL, key.hashes)


async def start(fleet: Fleet, n: int, health: dict[str, Any]) -> tuple[list[Proc], dict]:
    sims = [await fleet.start_sim(f"sim{i}", model=MODEL, kv_capacity=200_000, profile="fast",
                                  time_scale=1.0, extra=["--enable-prompt-tokens-details"])
            for i in range(n)]  # fmt: skip
    settings = {"discovery": {"backends": [p.url for p in sims]}, "models": [MODEL],
                "kv_capacity_tokens": 200_000, "index": "corrected", "expose_routing": True,
                "cached_tokens_reported": True,
                "metrics_port": None,  # /metrics on the API port: the tests read it there
                "health": {"eject_after_failures": 1000, **health}}  # fmt: skip
    return sims, settings


@pytest.fixture
async def routed(fleet: Fleet, request: pytest.FixtureRequest) -> AsyncIterator[Any]:
    sims, settings = await start(fleet, 2, getattr(request, "param", {}))
    app = build_app(RouterSettings.model_validate(settings))
    async with TestClient(TestServer(app)) as client:
        yield client, app[CORE], {p.url: p for p in sims}


async def serve(client: TestClient, body: dict[str, Any]) -> str:
    r = await client.post("/v1/chat/completions", json=body)
    assert r.status == 200, await r.text()
    await r.read()
    return r.headers["x-routed-to"]


async def place(client: TestClient, core: RouterCore, n: int) -> dict[str, list[int]]:
    """n prompts served (twice each: the second is a hit), by the backend that holds them."""
    placed: dict[str, list[int]] = {}
    for i in range(n):
        placed.setdefault(await serve(client, chat(i)), []).append(i)
        assert await serve(client, chat(i)) in placed  # followed its first turn
    for backend, prompts in placed.items():
        for i in prompts:
            assert (await holders(core, chat(i))).get(backend, 0) > 0
    return placed


async def drops(client: TestClient, backend: str, reason: str) -> float:
    page = await (await client.get("/metrics")).text()
    return sample_sum(page, "prefix_router_engine_cache_drops_total", backend=backend,
                      reason=reason)  # fmt: skip


async def test_an_engine_restarted_on_its_port_has_its_entries_dropped(fleet: Fleet, routed):
    client, core, sims = routed
    placed = await place(client, core, 6)
    backend = max(placed, key=lambda b: len(placed[b]))
    other = next(b for b in sims if b != backend)
    # the router has its baseline of that engine's vitals
    await waiting.until(lambda: core.states.state(backend) == ESTIMATED, 30, "a first scrape")
    assert await drops(client, backend, "restart") == 0
    await fleet.restart(sims[backend])
    await waiting.until(lambda: (backend, "restart") in core.states.dropped, 60,
                        "the restart detected")  # fmt: skip
    for i in placed[backend]:
        assert backend not in await holders(core, chat(i)), f"prompt {i} still on {backend}"
    for i in placed.get(other, []):
        assert (await holders(core, chat(i))).get(other, 0) > 0  # the other engine's stay
    assert await drops(client, backend, "restart") == 1
    # and routing goes on: the restarted engine serves and is known again
    await serve(client, chat(100))


async def test_a_cache_reset_has_the_entries_dropped(fleet: Fleet, routed):
    client, core, _sims = routed
    placed = await place(client, core, 6)
    backend = max(placed, key=lambda b: len(placed[b]))
    await waiting.until(lambda: core.states.state(backend) == ESTIMATED, 30, "a first scrape")
    async with ClientSession() as s, s.post(backend + "/reset_prefix_cache") as r:
        assert r.status == 200
    await waiting.until(lambda: (backend, "reset") in core.states.dropped, 60,
                        "the reset detected")  # fmt: skip
    for i in placed[backend]:
        assert backend not in await holders(core, chat(i))
    assert await drops(client, backend, "reset") == 1


# /metrics scraped once at the start only: the answers alone must tell the reset
@pytest.mark.parametrize("routed", [{"metrics_poll_interval_s": 3600}], indirect=True)
async def test_answers_far_below_prediction_in_a_row_drop_the_entries(fleet: Fleet, routed):
    client, core, _sims = routed
    placed = await place(client, core, 10)
    backend = max(placed, key=lambda b: len(placed[b]))
    assert len(placed[backend]) >= 3, placed
    async with ClientSession() as s, s.post(backend + "/reset_prefix_cache") as r:
        assert r.status == 200
    first, *rest = placed[backend]
    assert await serve(client, chat(first)) == backend  # a hit the engine no longer holds
    assert not core.states.dropped
    assert await serve(client, chat(rest[0])) == backend
    assert core.states.state(backend) == DEGRADED  # a restart suspected
    page = await (await client.get("/metrics")).text()
    assert sample_sum(page, "prefix_router_index_state", backend=backend, state=DEGRADED) == 1
    assert sample_sum(page, "prefix_router_index_state", backend=backend, state=ESTIMATED) == 0
    assert await serve(client, chat(rest[1])) == backend
    assert core.states.dropped == [(backend, "shortfall")]
    for i in rest[2:]:
        assert backend not in await holders(core, chat(i))
    assert core.states.state(backend) == ESTIMATED


async def test_an_engine_put_to_sleep_is_dropped_and_degraded_until_it_wakes(fleet: Fleet,
                                                                            routed):
    client, core, _sims = routed
    placed = await place(client, core, 6)
    backend = max(placed, key=lambda b: len(placed[b]))
    await waiting.until(lambda: core.states.state(backend) == ESTIMATED, 30, "a first scrape")
    async with ClientSession() as s:
        async with s.post(backend + "/sleep?level=1") as r:
            assert r.status == 200
        await waiting.until(lambda: (backend, "sleep") in core.states.dropped, 60,
                            "the sleep detected")  # fmt: skip
        assert core.states.state(backend) == DEGRADED
        for i in placed[backend]:
            assert backend not in await holders(core, chat(i))
        async with s.post(backend + "/wake_up") as r:
            assert r.status == 200
    await waiting.until(lambda: (backend, "wake") in core.states.dropped, 60, "the wake")
    assert core.states.state(backend) == ESTIMATED
