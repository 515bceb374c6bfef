"""RedisStore against a real redis-server: shared table, capacity, membership, load, faults."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest
import redis.asyncio as aioredis

from prefix_operator.figures import aggregate
from prefix_router.config import RouterSettings
from prefix_router.load import LoadTracker
from prefix_router.redis_store import RedisStore

pytestmark = pytest.mark.redis


def settings(url: str, **kw) -> RouterSettings:
    store = {"mode": "redis", "url": url, "timeout_ms": 20, "near_cache_ttl_ms": 0,
             "write_delay_ms": 0}
    store.update(kw.pop("store", {}))
    return RouterSettings.model_validate(
        {"model_key": "ns/m", "kv_capacity_tokens": 16 * 50, "store": store, **kw}
    )


async def pair(url: str, **kw):
    a, b = RedisStore(settings(url, **kw), "ra"), RedisStore(settings(url, **kw), "rb")
    await a.start()
    await b.start()
    return a, b


async def settle() -> None:
    await asyncio.sleep(0.05)  # longer than the 5 ms flush period


async def test_one_router_sees_what_another_wrote_in_one_round_trip(redis_server):
    # A budget far above any lookup time: this test counts round trips, and on a loaded host a
    # lookup over the usual 20 ms budget would be answered from local state (seen once in a
    # run beside benchmarks); the budget itself is tested below. A long write delay too: the
    # lookup queues its hashes for the working-set count, and with no delay a reply slower
    # than the 5 ms flush tick let the tick send them as a second round trip (seen in CI). A
    # new owner (`urgent`) is flushed at once whatever the delay, so `a`'s record arrives.
    a, b = await pair(redis_server.url, store={"timeout_ms": 1000, "write_delay_ms": 10_000})
    try:
        chain = list(range(1, 21))
        a.record("m", chain, "http://e1", urgent=True)
        await settle()
        before = b.round_trips
        assert await b.lookup("m", chain) == {"http://e1": 20}
        assert b.round_trips - before == 1
        assert await b.lookup("m", [1, 2, 99]) == {"http://e1": 2}
        # commandstats: one EVALSHA per lookup, one pipeline per flush
        raw = aioredis.from_url(redis_server.url)
        info = await raw.info("commandstats")
        await raw.aclose()
        assert info["cmdstat_evalsha"]["calls"] >= 2
    finally:
        await a.close()
        await b.close()


async def test_capacity_model_is_shared(redis_server):
    a, b = await pair(redis_server.url)  # 50 blocks per backend
    try:
        a.record("m", list(range(1000, 1040)), "http://e1")
        await settle()
        b.record("m", list(range(2000, 2040)), "http://e1")
        await settle()
        r = aioredis.from_url(redis_server.url)
        assert await r.zcard("prefixrouter:ns/m:lru:m:http://e1") == 50
        await r.aclose()
        # the older chain lost its tail first
        got = await b.lookup("m", list(range(1000, 1040)))
        assert got == {"http://e1": 10}
        assert await a.lookup("m", list(range(2000, 2040))) == {"http://e1": 40}
    finally:
        await a.close()
        await b.close()


async def test_a_backend_that_leaves_is_gone_for_every_router(redis_server):
    a, b = await pair(redis_server.url)
    try:
        a.record("m", [1, 2, 3], "http://e1")
        a.record("m", [1, 2, 3], "http://e2")
        await settle()
        b.drop_backend("http://e1")
        await settle()
        assert await a.lookup("m", [1, 2, 3]) == {"http://e2": 3}
    finally:
        await a.close()
        await b.close()


async def test_load_is_shared_and_a_dead_router_stops_counting(redis_server):
    a, b = await pair(redis_server.url)
    la, lb = LoadTracker(), LoadTracker()
    a.load_source, b.load_source = la, lb
    assert (a.routers(), b.routers()) == (1, 1)  # before the first load read
    try:
        for _ in range(4):
            la.start("http://e1", 0)
        await asyncio.sleep(0.6)
        assert lb.inflight("http://e1") == 4
        assert la.inflight("http://e1") == 4  # its own, not doubled
        # each counts both routers, itself included (a prefix's demand is ~2 x what one sees)
        assert (a.routers(), b.routers()) == (2, 2)
        await a.close()  # router A dies with 4 requests "in flight"
        await asyncio.sleep(3.6)
        assert lb.inflight("http://e1") == 0
        assert b.routers() == 1
    finally:
        await b.close()


async def test_a_lookup_brings_the_other_routers_load_and_pending_prefill(redis_server):
    a, b = await pair(redis_server.url)
    la, lb = LoadTracker(), LoadTracker()
    a.load_source, b.load_source = la, lb
    try:
        la.start("http://e1", 500)
        a.record("m", [1, 2], "http://e1")  # a dispatch: its flush publishes A's load
        await settle()
        # well inside the heartbeat period: only the lookup's reply can have carried it
        await b.lookup("m", [1, 2])
        assert lb.inflight("http://e1") == 1
        assert lb.pending_prefill("http://e1") == 500
        la.first_byte("http://e1", 500)
        a.record("m", [1, 2, 3], "http://e1")
        await settle()
        await b.lookup("m", [1, 2, 3])
        assert lb.pending_prefill("http://e1") == 0
        assert la.pending_prefill("http://e1") == 0  # its own is not counted twice
    finally:
        await a.close()
        await b.close()


async def test_a_change_of_load_is_published_at_once_without_the_queued_writes(
    redis_server, monkeypatch
):
    # The heartbeat would republish the load too: pushed out of the test's window, so only
    # the change-driven publish can carry it.
    monkeypatch.setattr("prefix_router.redis_store.LOAD_PERIOD_S", 30.0)
    a, b = await pair(redis_server.url, store={"write_delay_ms": 400})
    la, lb = LoadTracker(), LoadTracker()
    a.load_source, b.load_source = la, lb
    try:
        await settle()
        a.record("m", [7, 8], "http://e1")
        la.start("http://e1", 300)
        await settle()
        assert await b.lookup("m", [7, 8]) == {}  # the record still waits at A...
        assert lb.inflight("http://e1") == 1  # ...but its load is already out
        assert lb.pending_prefill("http://e1") == 300
        la.finish("http://e1")
        await settle()
        await b.lookup("m", [5])
        assert lb.inflight("http://e1") == 0
    finally:
        await a.close()
        await b.close()


async def test_a_new_owner_goes_out_at_once_not_at_the_next_tick(redis_server):
    a, b = await pair(redis_server.url, store={"write_delay_ms": 400})
    try:
        a.record("m", [41, 42], "http://e1")  # a hit's refresh: waits for a lookup
        a.record("m", [51, 52], "http://e2", urgent=True)  # a new owner: flushed right away
        assert a._flushing is not None  # started now, not at the 5 ms tick
        await a._flushing
        assert await b.lookup("m", [51, 52]) == {"http://e2": 2}
        assert await b.lookup("m", [41, 42]) == {"http://e1": 2}  # queued writes went with it
    finally:
        await a.close()
        await b.close()


async def test_occupancy_and_tail_age_come_from_the_shared_capacity_model(
    redis_server, monkeypatch
):
    monkeypatch.setattr("prefix_router.redis_store.LOAD_PERIOD_S", 0.05)
    a, b = await pair(redis_server.url)  # capacity: 50 blocks per backend
    try:
        await b.lookup("m", [999])  # B serves the model but never records for e1
        a.record("m", list(range(1, 31)), "http://e1")  # 30 of 50 blocks: room left
        await asyncio.sleep(0.2)
        assert b.occupancy("m", "http://e1") == pytest.approx(0.6)
        assert b.tail_age("m", "http://e1") == float("inf")
        a.record("m", list(range(100, 130)), "http://e1")  # over capacity: full, trimmed
        await asyncio.sleep(0.6)
        assert b.occupancy("m", "http://e1") == pytest.approx(1.0)
        age = b.tail_age("m", "http://e1")
        assert 0.4 <= age < 3.0  # the coldest block left was used at the first record
        assert a.tail_age("m", "http://e1") == pytest.approx(age, abs=0.2)  # alike for all
        assert b.occupancy("m", "http://e2") == 0.0
        a.drop_backend("http://e1")
        await asyncio.sleep(0.2)
        assert b.occupancy("m", "http://e1") == 0.0
        assert b.tail_age("m", "http://e1") == float("inf")
    finally:
        await a.close()
        await b.close()


async def test_writes_ride_on_the_next_lookup_or_go_after_the_write_delay(redis_server):
    a, b = await pair(redis_server.url, store={"write_delay_ms": 400})
    try:
        a.record("m", [1, 2], "http://e1")
        await settle()
        assert await b.lookup("m", [1, 2]) == {}  # still queued at A
        trips = a.round_trips
        await a.lookup("m", [9])  # carries the queued write: one round trip for both
        assert a.round_trips == trips + 1
        assert await b.lookup("m", [1, 2]) == {"http://e1": 2}
        a.record("m", [3, 4], "http://e2")
        await asyncio.sleep(0.6)  # no lookup comes: the write goes on its own
        assert await b.lookup("m", [3, 4]) == {"http://e2": 2}
        assert a.round_trips == trips + 2
    finally:
        await a.close()
        await b.close()


async def test_a_slow_redis_is_not_a_down_redis(redis_server):
    a, b = await pair(redis_server.url, store={"near_cache_ttl_ms": 1000})
    try:
        a.record("m", [4, 5, 6], "http://e1")
        await settle()
        os.kill(redis_server.proc.pid, signal.SIGSTOP)  # a real server that answers late
        try:
            t0 = time.perf_counter()
            got = await b.lookup("m", [4, 5, 6])
            assert time.perf_counter() - t0 < 0.1  # within the budget, not the 1 s timeout
            assert got == {}  # routed on B's local state, which never saw the record
        finally:
            os.kill(redis_server.proc.pid, signal.SIGCONT)
        await settle()
        assert not b.degraded and b.slow_lookups == 1
        trips = b.round_trips
        # the late reply filled the near-cache: answered without asking Redis again
        assert await b.lookup("m", [4, 5, 6]) == {"http://e1": 3}
        assert b.round_trips == trips
    finally:
        await a.close()
        await b.close()


async def test_redis_down_routes_on_local_state_and_recovers(redis_server):
    a, b = await pair(redis_server.url)
    try:
        a.record("m", [7, 8, 9], "http://e1")
        await settle()
        redis_server.stop()
        t0 = time.perf_counter()
        got = await a.lookup("m", [7, 8, 9])
        assert time.perf_counter() - t0 < 0.5
        assert got == {"http://e1": 3}  # the local table answered
        assert a.degraded
        a.record("m", [10, 11], "http://e2")  # queued, not lost
        redis_server.start()  # back, and empty
        for _ in range(60):
            if not a.degraded and not b.degraded:
                break
            await asyncio.sleep(0.1)
        assert not a.degraded and not b.degraded
        await asyncio.sleep(0.1)
        assert await b.lookup("m", [10, 11]) == {"http://e2": 2}
    finally:
        await a.close()
        await b.close()


async def test_password_auth(make_redis, monkeypatch):
    srv = make_redis(password="s3cret")
    try:
        monkeypatch.setenv("TEST_REDIS_PASSWORD", "s3cret")
        s = RedisStore(settings(srv.url, store={"password_env": "TEST_REDIS_PASSWORD"}), "r")
        await s.start()
        s.record("m", [1, 2], "http://e1")
        await settle()
        assert await s.lookup("m", [1, 2]) == {"http://e1": 2}
        assert not s.degraded
        await s.close()
        monkeypatch.setenv("TEST_REDIS_PASSWORD", "wrong")
        bad = RedisStore(settings(srv.url, store={"password_env": "TEST_REDIS_PASSWORD"}), "r")
        await bad.start()
        assert bad.degraded
        assert await bad.lookup("m", [1, 2]) == {}
        await bad.close()
    finally:
        srv.stop()


async def test_figures_published_for_the_operator(redis_server):
    a, b = await pair(redis_server.url)
    la = LoadTracker()
    a.load_source = la
    try:
        la.start("http://e1", 0)
        await a.lookup("m", list(range(1, 11)))
        await b.lookup("m", list(range(1, 11)))  # same prefix through another router
        await b.lookup("m", list(range(100, 105)))
        a.observe(160, 120)
        b.observe(80, 0)
        await asyncio.sleep(1.3)
        r = aioredis.from_url(redis_server.url, decode_responses=True)
        pubs = [await r.hgetall(f"prefixrouter:ns/m:router:{rid}") for rid in ("ra", "rb")]
        await r.aclose()
        fig = aggregate(pubs, now=time.time(), ready_replicas=2, kv_capacity_tokens=800)
        assert fig.routers == 2
        assert fig.hit_rate == pytest.approx(0.5, abs=0.01)
        # 15 distinct blocks of 16 tokens: a union, not 25 blocks
        assert fig.cache_pressure == pytest.approx(15 * 16 / 1600, abs=0.02)
        assert fig.load == 0.5
    finally:
        await a.close()
        await b.close()


def test_a_chain_travels_as_one_string_of_the_same_hex_words():
    from prefix_router.redis_store import _chain_hex, _hex

    hashes = [0, 1, 2**64 - 1, 0xDEADBEEF]
    assert _chain_hex(hashes) == "".join(_hex(h) for h in hashes)


async def test_an_answer_recorded_after_its_prompt_stays_one_chain(redis_server):
    a, b = await pair(redis_server.url)  # capacity: 50 blocks per backend
    try:
        prompt, answer = list(range(1, 31)), list(range(31, 61))
        a.record("m", prompt, "http://e1")
        await settle()
        a.record("m", prompt + answer, "http://e1", known=len(prompt))  # only 30 new blocks
        await settle()
        # 60 blocks over a capacity of 50: the deepest go, never a block in the middle
        assert await b.lookup("m", prompt + answer) == {"http://e1": 50}
        assert await b.lookup("m", prompt) == {"http://e1": 30}
    finally:
        await a.close()
        await b.close()


def test_the_lookup_budget_follows_the_typical_lookup_time_within_its_bounds():
    s = RedisStore(settings("redis://127.0.0.1:1/0", store={
        "timeout_ms": 5, "timeout_max_ms": 40, "timeout_factor": 4}), "r")
    assert s.budget_ms == pytest.approx(5)
    for _ in range(200):
        s._timed(0.0003)  # a healthy Redis on the same network: the floor holds
    assert s.budget_ms == pytest.approx(5)
    for _ in range(200):
        s._timed(0.006)  # a busy host: every lookup takes 6 ms
    assert s.budget_ms == pytest.approx(24, rel=0.05)
    for _ in range(200):
        s._timed(1.0)  # a hanging Redis: never more than the cap
    assert s.budget_ms == pytest.approx(40)
