"""Demand-driven copies end to end: real simulators, the router app in-process."""

from __future__ import annotations

from aiohttp.test_utils import TestClient, TestServer

from bench.harness.fleet import Fleet
from prefix_router.app import build_app
from prefix_router.config import RouterSettings

MODEL = "test-model"
SYSTEM = "You are a careful assistant. " * 40  # a shared prefix of many blocks


async def routed(
    tmp_path, fleet: Fleet, start_sims, replicate_rate: float, max_owners: int = 0
) -> list[str]:
    sims = await start_sims(fleet, 3)
    settings = RouterSettings.model_validate({
        "discovery": {"backends": sims}, "kv_capacity_tokens": 100_000, "expose_routing": True,
        "replicate_rate": replicate_rate,
        "max_owners": max_owners,
    })
    out = []
    async with TestClient(TestServer(build_app(settings))) as client:
        for i in range(5):
            r = await client.post("/v1/chat/completions", json={
                "model": MODEL, "max_tokens": 2, "messages": [
                    {"role": "system", "content": SYSTEM},
                    {"role": "user", "content": f"question {i}"}]})
            assert r.status == 200, await r.text()
            await r.read()
            out.append(r.headers["x-route-reason"] + " " + r.headers["x-routed-to"])
    return out


async def test_a_prefix_in_demand_gets_more_owners(tmp_path, fleet, start_sims):
    # Five requests in a moment are a rate of 5 x ln 2 / 30 s = 0.12/s at most: at 0.02/s per
    # owner the second and third requests each add an owner, then all three hold it.
    got = await routed(tmp_path, fleet, start_sims, replicate_rate=0.02)
    assert [g.split()[0] for g in got] == ["miss", "replicated", "replicated", "hit", "hit"]
    assert len({g.split()[1] for g in got[:3]}) == 3


async def test_without_demand_copies_the_prefix_stays_with_its_owner(tmp_path, fleet, start_sims):
    got = await routed(tmp_path, fleet, start_sims, replicate_rate=0.0)
    assert [g.split()[0] for g in got] == ["miss", "hit", "hit", "hit", "hit"]
    assert len({g.split()[1] for g in got}) == 1


async def test_demand_copies_stop_at_max_owners(tmp_path, fleet, start_sims):
    # The table records at most two owners; a third copy would never be seen as one, so
    # demand must not keep making copies past it.
    got = await routed(tmp_path, fleet, start_sims, replicate_rate=0.02, max_owners=2)
    assert [g.split()[0] for g in got] == ["miss", "replicated", "hit", "hit", "hit"]
    assert len({g.split()[1] for g in got}) == 2
