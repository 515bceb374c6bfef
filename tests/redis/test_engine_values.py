"""Engine values (router fleet_value.py) through Redis to the operator: what two routers
publish is what the operator reads and adds up (operator cachestore.py, figures.py)."""

from __future__ import annotations

import json
import time

import pytest
from test_shared_store import Clock, settings, written

from prefix_operator import cachestore
from prefix_operator.figures import engine_values
from prefix_router.attempt import Attempt
from prefix_router.backends import BackendSet
from prefix_router.core import build_core
from prefix_router.load import LoadTracker
from prefix_router.parsing import parse_request
from prefix_router.redis import SharedStore

pytestmark = pytest.mark.redis

ENGINES = ["http://192.0.2.1:8000", "http://192.0.2.2:8000", "http://192.0.2.3:8000"]


def _parsed(system: str, user: str):
    body = {"model": "m", "messages": [{"role": "system", "content": system},
                                       {"role": "user", "content": user}]}
    return parse_request(json.dumps(body).encode(), "chat")


async def test_each_routers_engine_values_reach_the_operator_and_add_up(redis_server):
    clock = Clock()
    cores = []
    for rid in ("ra", "rb"):
        load = LoadTracker()
        store = SharedStore(settings(redis_server.url, kv_capacity_tokens=1_000_000), load, rid,
                            clock=clock, wall=clock.wall)
        members = BackendSet()
        members.set_members(ENGINES)
        core = build_core(store.settings, members, store=store, load=load, clock=clock)
        await store.link.start()
        cores.append(core)
    try:
        for i, core in enumerate(cores * 3):
            for s in range(4):
                route = await core.route(_parsed(f"system {s} " * 50, f"user {i}"))
                with Attempt(core.ledger, route, route.decision.backend) as a:
                    a.answered(200)
                    a.first_byte(streamed=False)
                    a.done("ok", None)
                await written(core.store)  # type: ignore[arg-type]
        for core in cores:
            await core.store.publish()  # type: ignore[attr-defined]
        published = await cachestore.read_engine_values(redis_server.url, None, "ns/m", 2.0)
        assert len(published) == 2
        got = engine_values(published, now=time.time())
        want: dict[str, float] = {}
        for core in cores:
            assert core.fleet is not None
            for url, v in core.fleet.values().items():
                want[url] = want.get(url, 0.0) + v
        assert got == pytest.approx(want)
        assert sum(got.values()) > 0 and set(got) <= set(ENGINES)
        # a router silent for longer than the window no longer counts
        assert engine_values(published, now=time.time() + 3600) == {}
    finally:
        for core in cores:
            await core.close()
