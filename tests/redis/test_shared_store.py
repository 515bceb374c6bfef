"""The shared store against a real redis-server: index, capacity, membership, load, figures,
faults. Time is driven, not slept: each store gets its own clocks, and the tests call the
store's jobs (flush, heartbeat, figures, reconnection) where the timers would."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
import redis.asyncio as aioredis

from prefix_operator.figures import aggregate
from prefix_router.attempt import Attempt
from prefix_router.backends import BackendSet
from prefix_router.config import RouterSettings
from prefix_router.contract import RouterFigures
from prefix_router.core import RouterCore, build_core
from prefix_router.index.local import LocalIndex
from prefix_router.load import LoadTracker
from prefix_router.parsing import parse_request
from prefix_router.redis import SharedStore
from prefix_router.redis.scripts import block_hex, chain_hex

pytestmark = pytest.mark.redis


@dataclass
class Clock:
    """A clock the test moves; `wall` runs beside it from the real time at the start."""

    t: float = 1000.0
    base: float = field(default_factory=time.time)

    def __call__(self) -> float:
        return self.t

    def wall(self) -> float:
        return self.base + self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


def settings(url: str, **kw) -> RouterSettings:
    store = {"mode": "redis", "url": url, "timeout_ms": 1000, "near_cache_ttl_ms": 0,
             "write_delay_ms": 0}
    store.update(kw.pop("store", {}))
    return RouterSettings.model_validate(
        {"model_key": "ns/m", "kv_capacity_tokens": 16 * 50, "store": store, **kw}
    )


async def make(url: str, rid: str, clock: Clock, **kw) -> tuple[SharedStore, LoadTracker]:
    load = LoadTracker()
    s = SharedStore(settings(url, **kw), load, rid, clock=clock, wall=clock.wall)
    st = s.settings
    s.table(LocalIndex(st.block_size, st.kv_capacity_tokens, st.ttl_seconds,
                       st.max_table_entries, st.max_owners, clock=clock))  # fmt: skip
    await s.link.start()  # no timers: the tests run the jobs
    return s, load


Pair = tuple[Clock, SharedStore, SharedStore, LoadTracker, LoadTracker]


@contextlib.asynccontextmanager
async def pair(url: str, **kw) -> AsyncIterator[Pair]:
    """Two routers' stores on one Redis and one clock, both closed at the end."""
    clock = Clock()
    (a, la), (b, lb) = await make(url, "ra", clock, **kw), await make(url, "rb", clock, **kw)
    try:
        yield clock, a, b, la, lb
    finally:
        await a.close()
        await b.close()


def scheduler(store: SharedStore, load: LoadTracker, backends: list[str]) -> RouterCore:
    """A router's core on `store`, wired as the app wires it (no HTTP)."""
    members = BackendSet()
    members.set_members(backends)
    return build_core(store.settings, members, store=store, load=load)


async def written(s: SharedStore) -> None:
    """Everything `s` has queued is in Redis (what the flush timer would do)."""
    if s.writes.flushing is not None:
        await s.writes.flushing
    await s.writes.flush()


async def test_one_router_sees_what_another_wrote_in_one_round_trip(redis_server):
    async with pair(redis_server.url, store={"write_delay_ms": 10_000}) as (_clock, a, b, _la, _lb):
        chain = list(range(1, 21))
        a.shared.record("m", chain, "http://e1", news=True)
        await written(a)
        before = b.stats().round_trips
        assert await b.shared.lookup("m", chain) == {"http://e1": 20}
        assert b.stats().round_trips - before == 1
        assert await b.shared.lookup("m", [1, 2, 99]) == {"http://e1": 2}


async def test_capacity_model_is_shared(redis_server):
    async with pair(redis_server.url) as (clock, a, b, _la, _lb):  # 50 blocks per backend
        a.shared.record("m", list(range(1000, 1040)), "http://e1")
        await written(a)
        clock.advance(1.0)
        b.shared.record("m", list(range(2000, 2040)), "http://e1")
        await written(b)
        r = aioredis.from_url(redis_server.url)
        assert await r.zcard("prefixrouter:ns/m:lru:m:http://e1") == 50
        await r.aclose()
        # the older chain lost its tail first
        assert await b.shared.lookup("m", list(range(1000, 1040))) == {"http://e1": 10}
        assert await a.shared.lookup("m", list(range(2000, 2040))) == {"http://e1": 40}


async def test_a_truncation_reaches_every_router(redis_server):
    # an engine reported holding less (or refused the request): one router corrects the
    # index, and the other routes on the same correction
    async with pair(redis_server.url) as (_clock, a, b, _la, _lb):
        chain = list(range(1, 11))
        a.shared.record("m", chain, "http://e1")
        a.shared.record("m", chain, "http://e2")
        await written(a)
        assert await b.shared.lookup("m", chain) == {"http://e1": 10, "http://e2": 10}
        b.shared.truncate("m", chain, "http://e1", 4)
        await written(b)
        assert await a.shared.lookup("m", chain) == {"http://e1": 4, "http://e2": 10}
        assert await b.shared.lookup("m", chain) == {"http://e1": 4, "http://e2": 10}


async def test_a_backend_that_leaves_is_gone_for_every_router(redis_server):
    async with pair(redis_server.url) as (_clock, a, b, _la, _lb):
        a.shared.record("m", [1, 2, 3], "http://e1")
        a.shared.record("m", [1, 2, 3], "http://e2")
        await written(a)
        b.shared.drop_backend("http://e1")
        await written(b)
        assert await a.shared.lookup("m", [1, 2, 3]) == {"http://e2": 3}


async def test_load_is_shared_and_a_dead_router_stops_counting(redis_server):
    # not pair(): router A dies in the middle
    clock = Clock()
    (a, la), (b, lb) = await make(redis_server.url, "ra", clock), await make(
        redis_server.url, "rb", clock)
    try:
        for _ in range(4):
            la.start("http://e1", 0)
        await a.heartbeat()
        await b.heartbeat()
        assert lb.inflight("http://e1") == 4
        assert la.inflight("http://e1") == 4  # its own, not doubled
        await a.close()  # router A dies with 4 requests "in flight"
        clock.advance(b.peers.lease_s + 0.5)  # its lease runs out
        await b.heartbeat()
        assert lb.inflight("http://e1") == 0
    finally:
        await b.close()


async def test_a_lookup_brings_the_other_routers_load_and_pending_prefill(redis_server):
    async with pair(redis_server.url) as (_clock, a, b, la, lb):
        la.start("http://e1", 500)
        a.shared.record("m", [1, 2], "http://e1")  # its write publishes A's load with it
        await written(a)
        await b.shared.lookup("m", [1, 2])  # no heartbeat ran: only the lookup carried it
        assert lb.inflight("http://e1") == 1
        assert lb.pending_prefill("http://e1") == 500
        la.first_byte("http://e1", 500)
        a.shared.record("m", [1, 2, 3], "http://e1")
        await written(a)
        await b.shared.lookup("m", [1, 2, 3])
        assert lb.pending_prefill("http://e1") == 0
        assert la.pending_prefill("http://e1") == 0  # its own is not counted twice


async def test_a_decision_counts_the_load_its_own_lookup_brought(redis_server):
    # Three routers on Redis piled onto one backend while each decided on the load it had
    # read before its lookup's round trip: the others' load the reply carries must count in
    # this very decision (bench/results/compare/redis-3x-ab/).
    async with pair(redis_server.url) as (_clock, a, b, la, lb):
        sched = scheduler(a, la, ["http://e1", "http://e2"])
        la.start("http://e2", 0)  # A's own request on e2
        for _ in range(3):
            lb.start("http://e1", 0)  # B's three on e1, which A has not heard of yet
        await b.writes.flush()
        assert la.inflight("http://e1") == 0
        body = b'{"model": "m", "prompt": "%s"}' % (b"a new prompt " * 100)
        route = await sched.route(parse_request(body, "completions"))
        assert la.inflight("http://e1") == 3
        assert route.decision.backend == "http://e2"


async def test_a_change_of_load_carries_the_queued_writes(redis_server):
    # A conversation's next turn is recorded as its answer ends, and the client sends that
    # turn at once, often through another router: the record must not wait for this router's
    # next lookup when the load change of the request's end makes a round trip anyway.
    async with pair(redis_server.url, store={"write_delay_ms": 10_000}) as (_clock, a, b, la, lb):
        await a.writes.tick()  # A's first load (none) is out
        a.shared.record("m", [7, 8], "http://e1")
        await a.writes.tick()  # no load change, not due: the record waits
        assert await b.shared.lookup("m", [7, 8]) == {}
        la.start("http://e1", 300)
        await a.writes.tick()
        assert await b.shared.lookup("m", [7, 8, 9]) == {"http://e1": 2}
        assert lb.inflight("http://e1") == 1
        assert lb.pending_prefill("http://e1") == 300
        trips = a.stats().round_trips
        la.finish("http://e1")
        await a.writes.tick()
        assert a.stats().round_trips == trips + 1
        await b.shared.lookup("m", [5])
        assert lb.inflight("http://e1") == 0


async def test_a_request_sent_goes_out_at_once_when_other_routers_are_live(redis_server):
    async with pair(redis_server.url) as (_clock, a, b, la, lb):
        la.start("http://e1", 300)  # before any heartbeat: A knows of no other router
        assert a.writes.flushing is None  # so the send waits for the flush tick
        await a.writes.tick()
        await b.heartbeat()  # B's lease...
        await a.heartbeat()  # ...is what A's next heartbeat counts
        assert a.peers.others == 1
        la.start("http://e2", 200)  # now it goes at once, without a tick
        assert a.writes.flushing is not None
        await a.writes.flushing
        await b.shared.lookup("m", [5])
        assert lb.inflight("http://e2") == 1
        assert lb.pending_prefill("http://e2") == 200
        # its end goes at once too, with the answer's record for the conversation's next turn
        await a.writes.flushing
        a.shared.record("m", [61, 62, 63], "http://e2")  # not news: it would wait
        la.finish("http://e2")
        assert a.writes.flushing is not None and not a.writes.flushing.done()
        await a.writes.flushing
        assert await b.shared.lookup("m", [61, 62, 63]) == {"http://e2": 3}
        assert lb.inflight("http://e2") == 0


async def live(*stores: SharedStore) -> None:
    """Every store knows of the others (what two heartbeat periods would do)."""
    for _ in range(2):
        for st in stores:
            await st.heartbeat()


async def test_a_chain_sent_and_not_yet_answered_is_seen_by_the_other_routers(redis_server):
    async with pair(redis_server.url, store={"write_delay_ms": 10_000}) as (clock, a, b, _la, _lb):
        chain = list(range(1, 41))
        # before the routers know of each other: written all the same (they start together)
        a.writes.holds.hold("m", chain, "http://e1")
        assert a.writes.holds.pending()
        await a.writes.flush()
        assert await b.shared.lookup("m", chain) == {"http://e1": 40}
        a.writes.holds.release("m", chain, "http://e1")
        await a.writes.flush()
        assert await b.shared.lookup("m", chain) == {}
        await live(a, b)
        a.writes.holds.hold("m", chain, "http://e1")
        a.writes.holds.hold("m", chain, "http://e1")  # a second request of the same prompt
        await a.writes.flush()  # what the send's kick does
        assert await b.shared.lookup("m", [*chain[:25], 999]) == {"http://e1": 25}
        assert await b.shared.lookup("m", [*chain, 7, 8]) == {"http://e1": 40}
        assert await b.shared.lookup("m", [999, *chain]) == {}
        # beside what the index knows: the deeper of the two counts
        b.shared.record("m", chain[:30], "http://e2")
        b.shared.record("m", chain[:10], "http://e1")
        await written(b)
        assert await a.shared.lookup("m", chain) == {"http://e1": 40, "http://e2": 30}
        a.writes.holds.release("m", chain, "http://e1")
        await a.writes.flush()
        assert (await b.shared.lookup("m", chain))["http://e1"] == 40  # one is still out
        a.writes.holds.release("m", chain, "http://e1")
        await a.writes.flush()
        assert await b.shared.lookup("m", chain) == {"http://e1": 10, "http://e2": 30}
        # a hold whose release never came (the router died) stops counting, and goes
        a.shared.record("m", [555], "http://e1")  # a write that may wait for a lookup
        a.writes.holds.hold("m", chain, "http://e3")
        await a.writes.tick()  # a hold the send's kick missed goes at the next tick
        assert (await b.shared.lookup("m", chain))["http://e3"] == 40
        clock.advance(a.writes.holds.max_age_s + 1)
        assert "http://e3" not in await b.shared.lookup("m", chain)
        r = aioredis.from_url(redis_server.url)
        assert await r.hlen(a.keys.holds_prefix("m") + block_hex(chain[0])) == 0
        await r.aclose()


async def test_a_request_behind_one_another_router_sent_follows_it(redis_server):
    # router A sends a new prompt; before its engine answers, router B gets the same prefix
    async with pair(redis_server.url, store={"write_delay_ms": 10_000}) as (_clock, a, b, la, lb):
        backends = [f"http://e{i}" for i in range(4)]
        scheds = [scheduler(a, la, backends), scheduler(b, lb, backends)]
        await live(a, b)

        def prompt(question: str):
            body = {"model": "m", "prompt": "the same long document " * 60 + question}
            return parse_request(json.dumps(body).encode(), "completions")

        first = await scheds[0].route(prompt("one"))
        assert first.decision.reason == "miss"
        with Attempt(scheds[0].ledger, first, first.decision.backend):
            await a.writes.flushing  # the send's kick carries the hold
            behind = await scheds[1].route(prompt("two"))
            assert behind.decision.backend == first.decision.backend
            assert behind.decision.reason == "hit"
            # a hit's hold is not shown: its new blocks are its own question
            with Attempt(scheds[1].ledger, behind, behind.decision.backend):
                assert not b.writes.holds.pending()
        await a.writes.flush()
        assert await b.shared.lookup("m", first.hashes) == {}  # released; nothing recorded


async def test_a_new_owner_goes_out_at_once_not_at_the_next_tick(redis_server):
    async with pair(redis_server.url, store={"write_delay_ms": 400}) as (_clock, a, b, _la, _lb):
        a.shared.record("m", [41, 42], "http://e1")  # a hit's refresh: waits for a lookup
        a.shared.record("m", [51, 52], "http://e2", news=True)  # a new owner: sent now
        assert a.writes.flushing is not None  # started at once, not at the flush tick
        await a.writes.flushing
        assert await b.shared.lookup("m", [51, 52]) == {"http://e2": 2}
        assert await b.shared.lookup("m", [41, 42]) == {"http://e1": 2}  # queued went too


async def test_occupancy_and_tail_age_come_from_the_shared_capacity_model(redis_server):
    async with pair(redis_server.url) as (clock, a, b, _la, _lb):  # capacity: 50 blocks a backend
        await b.shared.lookup("m", [999])  # B serves the model but never records for e1
        a.shared.record("m", list(range(1, 31)), "http://e1")  # 30 of 50 blocks: room left
        await written(a)
        await b.heartbeat()
        assert b.shared.occupancy("m", "http://e1") == pytest.approx(0.6)
        assert b.shared.tail_age("m", "http://e1") == float("inf")
        clock.advance(2.0)
        a.shared.record("m", list(range(100, 130)), "http://e1")  # over capacity: trimmed
        await written(a)
        await a.heartbeat()
        await b.heartbeat()
        assert b.shared.occupancy("m", "http://e1") == pytest.approx(1.0)
        # the coldest block left was used at the first record, 2 s ago: the same for all
        assert b.shared.tail_age("m", "http://e1") == pytest.approx(2.0, abs=0.01)
        assert a.shared.tail_age("m", "http://e1") == pytest.approx(2.0, abs=0.01)
        assert b.shared.occupancy("m", "http://e2") == 0.0
        a.shared.drop_backend("http://e1")
        await written(a)
        await b.heartbeat()
        assert b.shared.occupancy("m", "http://e1") == 0.0
        assert b.shared.tail_age("m", "http://e1") == float("inf")


async def test_writes_ride_on_the_next_lookup_or_go_after_the_write_delay(redis_server):
    async with pair(redis_server.url, store={"write_delay_ms": 400}) as (clock, a, b, _la, _lb):
        await a.writes.tick()  # A's first load (none) is out: from now on it is unchanged
        a.shared.record("m", [1, 2], "http://e1")
        await a.writes.tick()
        assert await b.shared.lookup("m", [1, 2]) == {}  # still queued at A
        trips = a.stats().round_trips
        await a.shared.lookup("m", [9])  # carries the queued write: one round trip for both
        assert a.stats().round_trips == trips + 1
        assert await b.shared.lookup("m", [1, 2]) == {"http://e1": 2}
        a.shared.record("m", [3, 4], "http://e2")
        await a.writes.tick()
        assert await b.shared.lookup("m", [3, 4]) == {}  # within the delay it waits
        clock.advance(0.5)  # no lookup came: past the delay the write goes on its own
        await a.writes.tick()
        assert await b.shared.lookup("m", [3, 4]) == {"http://e2": 2}
        assert a.stats().round_trips == trips + 2


async def test_a_slow_redis_is_not_a_down_redis(redis_server):
    async with pair(
        redis_server.url, store={"near_cache_ttl_ms": 1000, "timeout_ms": 20,
                                 "timeout_max_ms": 20}
    ) as (_clock, a, b, _la, _lb):
        a.shared.record("m", [4, 5, 6], "http://e1")
        await written(a)
        os.kill(redis_server.proc.pid, signal.SIGSTOP)  # a real server that answers late
        try:
            got = await b.shared.lookup("m", [4, 5, 6])
            assert got == {}  # routed on B's local state, which never saw the record
            assert b.shared.slow_lookups == 1 and not b.shared.degraded
        finally:
            os.kill(redis_server.proc.pid, signal.SIGCONT)
        # the late reply still comes, and fills the near-cache
        for _ in range(500):
            if b.shared._late == 0:
                break
            await b.link.redis.ping()
        assert not b.shared.degraded
        trips = b.stats().round_trips
        assert await b.shared.lookup("m", [4, 5, 6]) == {"http://e1": 3}
        assert b.stats().round_trips == trips  # answered without asking Redis again


async def test_redis_down_routes_on_local_state_and_loses_no_write(redis_server):
    async with pair(redis_server.url) as (clock, a, b, _la, _lb):
        await live(a, b)
        a.shared.record("m", [7, 8, 9], "http://e1")
        await written(a)
        redis_server.stop()
        assert await a.shared.lookup("m", [7, 8, 9]) == {"http://e1": 3}  # its local table
        assert a.shared.degraded
        a.writes.holds.hold("m", [7, 8, 9], "http://e1")  # a hold is not queued while Redis is away
        assert not a.writes.holds.pending()
        a.shared.record("m", [10, 11], "http://e2")  # queued, not lost
        await a.writes.flush()  # down: not even tried
        redis_server.start()  # back, and empty
        await a.reconnect()
        assert a.shared.degraded  # not before its retry time
        clock.advance(1.5)
        await a.reconnect()
        await b.reconnect()
        assert not a.shared.degraded and not b.shared.degraded
        await a.writes.flush()
        assert await b.shared.lookup("m", [10, 11]) == {"http://e2": 2}


async def test_password_auth(make_redis, monkeypatch):
    srv = make_redis(password="s3cret")
    monkeypatch.setenv("TEST_REDIS_PASSWORD", "s3cret")
    auth = {"store": {"password_env": "TEST_REDIS_PASSWORD"}}
    s, _ = await make(srv.url, "r", Clock(), **auth)
    s.shared.record("m", [1, 2], "http://e1")
    await written(s)
    assert await s.shared.lookup("m", [1, 2]) == {"http://e1": 2}
    assert not s.shared.degraded
    await s.close()
    monkeypatch.setenv("TEST_REDIS_PASSWORD", "wrong")
    bad, _ = await make(srv.url, "r", Clock(), **auth)
    assert bad.shared.degraded
    assert await bad.shared.lookup("m", [1, 2]) == {}
    await bad.close()


async def test_figures_published_for_the_operator(redis_server):
    async with pair(redis_server.url) as (_clock, a, b, la, _lb):
        la.start("http://e1", 0)
        a.requested("m", list(range(1, 11)))
        b.requested("m", list(range(1, 11)))  # same prefix through another router
        b.requested("m", list(range(100, 105)))
        await written(a)
        await written(b)
        assert a.observe is not None and b.observe is not None
        a.observe(160, 120)
        b.observe(80, 0)
        a.show_demand(lambda: (3, 1.5))  # the dispatch queue's: 3 waiting, the oldest 1.5 s
        b.show_demand(lambda: (2, 4.0))
        for s in (a, b, a, b):  # the second round publishes the count the first one made
            await s.publish()
        r = aioredis.from_url(redis_server.url, decode_responses=True)
        pubs = [await r.hgetall(f"prefixrouter:ns/m:router:{rid}") for rid in ("ra", "rb")]
        await r.aclose()
        figs = [RouterFigures.from_hash(p) for p in pubs]
        fig = aggregate(figs, now=time.time(), ready_replicas=2, kv_capacity_tokens=800)
        assert fig.routers == 2
        assert fig.hit_rate == pytest.approx(0.5, abs=0.01)
        # 15 distinct blocks of 16 tokens: a union, not 25 blocks
        assert fig.cache_pressure == pytest.approx(15 * 16 / 1600, abs=0.02)
        assert fig.load == 0.5
        assert (fig.queued, fig.oldest_wait_s) == (5, 4.0)
        assert a.stats().working_set_tokens == 15 * 16


def test_a_chain_travels_as_one_string_of_the_same_hex_words():
    hashes = [0, 1, 2**64 - 1, 0xDEADBEEF]
    assert chain_hex(hashes) == "".join(block_hex(h) for h in hashes)


async def test_an_answer_recorded_after_its_prompt_stays_one_chain(redis_server):
    async with pair(redis_server.url) as (_clock, a, b, _la, _lb):  # capacity: 50 blocks a backend
        prompt, answer = list(range(1, 31)), list(range(31, 61))
        a.shared.record("m", prompt, "http://e1")
        await written(a)
        a.shared.record("m", prompt + answer, "http://e1", known=len(prompt))  # 30 new blocks
        await written(a)
        # 60 blocks over a capacity of 50: the deepest go, never a block in the middle
        assert await b.shared.lookup("m", prompt + answer) == {"http://e1": 50}
        assert await b.shared.lookup("m", prompt) == {"http://e1": 30}


async def test_the_lookup_budget_follows_the_typical_lookup_time_within_its_bounds():
    s = SharedStore(settings("redis://127.0.0.1:1/0", store={
        "timeout_ms": 5, "timeout_max_ms": 40, "timeout_factor": 4}), LoadTracker(), "r")
    idx = s.table(LocalIndex(16, 0, 600.0, 1000))
    assert idx.budget == pytest.approx(0.040)  # nothing timed yet: its first lookups connect
    for _ in range(200):
        idx._timed(0.0003)  # a healthy Redis on the same network: the floor holds
    assert idx.budget == pytest.approx(0.005)
    for _ in range(200):
        idx._timed(0.006)  # a busy host: every lookup takes 6 ms
    assert idx.budget == pytest.approx(0.024, rel=0.05)
    for _ in range(200):
        idx._timed(1.0)  # a hanging Redis: never more than the cap
    assert idx.budget == pytest.approx(0.040)
    await s.link.close()


async def test_a_new_router_serves_its_first_requests_with_the_fleets_index(redis_server):
    """A router replica that starts (scale-out, a rollout of the routers) finds what the
    others placed in the shared table: its first request of each prompt is a hit on the
    engine that holds it, not a placement of its own."""
    backends = [f"http://e{i}" for i in range(4)]
    clock = Clock()
    old, lo = await make(redis_server.url, "old", clock)
    placed: dict[str, str] = {}
    try:
        core = scheduler(old, lo, backends)

        def prompt(i: int):
            body = {"model": "m", "prompt": f"document {i} about the claims process " * 8}
            return parse_request(json.dumps(body).encode(), "completions")

        for i in range(8):
            route = await core.route(prompt(i))
            with Attempt(core.ledger, route, route.decision.backend) as a:
                a.answered(200)
                a.first_byte(streamed=False)  # the engine computed the prompt: owned there
            placed[str(i)] = route.decision.backend
        await written(old)
        assert len(set(placed.values())) > 1  # spread: a hit is not the only choice
        new, ln = await make(redis_server.url, "new", clock)
        try:
            fresh = scheduler(new, ln, backends)
            for i in range(8):
                route = await fresh.route(prompt(i))
                assert (route.decision.backend, route.decision.reason) == (placed[str(i)], "hit")
        finally:
            await new.close()
    finally:
        await old.close()


async def test_figures_say_how_the_index_knows_the_engines(redis_server):
    async with pair(redis_server.url) as (_clock, a, _b, la, _lb):
        scheduler(a, la, [f"http://e{i}" for i in range(3)])  # wires its states into `a`
        await a.publish()
        r = aioredis.from_url(redis_server.url, decode_responses=True)
        fig = RouterFigures.from_hash(await r.hgetall("prefixrouter:ns/m:router:ra"))
        await r.aclose()
        # decisions on a reachable store: every engine ESTIMATED
        assert (fig.engines, fig.engines_exact, fig.engines_degraded) == (3, 0, 0)
        st = aggregate([fig], now=time.time(), ready_replicas=3, kv_capacity_tokens=800)
        assert st.as_status("T")["indexExact"] == "0/3"


async def test_a_prompt_in_its_first_prefill_goes_where_another_router_sent_it(redis_server):
    """Routers built as the app builds them (the index factory wires the store's holds; no
    table made beforehand): while one router's request of a new prompt is still in its
    prefill, another router's request of the same prompt follows it to the same engine (a
    `hit` on the hold) instead of computing the prompt a second time elsewhere."""
    backends = [f"http://e{i}" for i in range(4)]
    clock = Clock()
    loads = [LoadTracker(), LoadTracker()]
    stores = [SharedStore(settings(redis_server.url), load, rid, clock=clock, wall=clock.wall)
              for load, rid in zip(loads, ("ra", "rb"), strict=True)]  # fmt: skip
    try:
        cores = []
        for st, load in zip(stores, loads, strict=True):
            await st.link.start()
            cores.append(build_core(st.settings, _members(backends), store=st, load=load))

        def prompt(i: int):
            body = {"model": "m", "prompt": f"a new system prompt {i} " * 200 + f"question {i}"}
            return parse_request(json.dumps(body).encode(), "completions")

        for i in range(4):
            first = await cores[0].route(prompt(i))
            with Attempt(cores[0].ledger, first, first.decision.backend):  # sent, not answered
                await written(stores[0])
                second = await cores[1].route(prompt(i))
                assert (second.decision.backend, second.decision.reason) == (
                    first.decision.backend, "hit")
    finally:
        for st in stores:
            await st.close()


def _members(backends: list[str]) -> BackendSet:
    members = BackendSet()
    members.set_members(backends)
    return members
