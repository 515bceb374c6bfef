"""Warm start end to end: real simulators, the router app in-process, file discovery."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from aiohttp.test_utils import TestClient, TestServer

from bench.fleet import Fleet
from prefix_router.app import ROUTER, build_app
from prefix_router.config import RouterSettings
from prefix_router.parsing import parse_request

MODEL = "test-model"
SYSTEM = "You are a careful assistant. " * 40  # a shared prefix of many blocks


async def ask(client: TestClient, user: str) -> None:
    r = await client.post("/v1/chat/completions", json={
        "model": MODEL, "max_tokens": 2,
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}],
    })
    assert r.status == 200, await r.text()
    await r.read()


async def wait_for(pred, timeout: float = 5.0) -> None:
    for _ in range(int(timeout / 0.05)):
        if pred():
            return
        await asyncio.sleep(0.05)
    raise AssertionError("timed out")


async def routed_to_newcomer(tmp_path: Path, fleet: Fleet, start_sims, warm: bool) -> str:
    sims = await start_sims(fleet, 3)
    listing = tmp_path / "backends"
    listing.write_text("\n".join(sims[:2]) + "\n")
    settings = RouterSettings.model_validate({
        "discovery": {"mode": "file", "file": str(listing)},
        "kv_capacity_tokens": 100_000, "warm_start": warm,
    })
    app = build_app(settings)
    async with TestClient(TestServer(app)) as client:
        router = app[ROUTER]
        for i in range(6):  # the prefix gets hot on one of the first two
            await ask(client, f"question {i}")
        listing.write_text("\n".join(sims) + "\n")  # scale out: a third replica joins
        await wait_for(lambda: len(router.backends.healthy()) == 3)
        body = {"model": MODEL, "max_tokens": 2, "messages": [
            {"role": "system", "content": SYSTEM}, {"role": "user", "content": "one more"}]}
        plan = await router.plan(parse_request(json.dumps(body).encode(), "chat"))
        return plan.decision.reason + " " + plan.decision.backend.replace(sims[2], "NEW")


async def test_a_replica_that_joins_gets_the_hot_prefix_at_once(tmp_path, fleet, start_sims):
    assert await routed_to_newcomer(tmp_path, fleet, start_sims, warm=True) == "warm NEW"


async def test_without_warm_start_the_hot_prefix_stays_on_its_owner(tmp_path, fleet, start_sims):
    got = await routed_to_newcomer(tmp_path, fleet, start_sims, warm=False)
    assert got.startswith("hit ") and "NEW" not in got
