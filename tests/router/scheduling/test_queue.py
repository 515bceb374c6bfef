"""The dispatch queue's logic on a clock the test moves: fair order between tenants, band order,
deadlines, shedding, bounds, one release per freed slot, a client gone while queued, drain.
The engines are a real LoadTracker whose counts the test moves, as attempts would."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from prefix_router.backends import Backend
from prefix_router.config import QueueSettings
from prefix_router.errors import RequestError
from prefix_router.load import LoadTracker
from prefix_router.scheduling.bands import Classifier
from prefix_router.scheduling.fairness import FairQueue
from prefix_router.scheduling.queue import DispatchQueue
from prefix_router.scheduling.saturation import Saturation
from prefix_router.scheduling.shares import Shares

ENGINE = "http://e1"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make_queue(clock: Clock, **queue: Any) -> tuple[DispatchQueue, LoadTracker, list[tuple]]:
    s = QueueSettings(**{"max_in_flight": 1, "max_waiting": 0, **queue})
    load = LoadTracker()
    reports: list[tuple] = []
    q = DispatchQueue(s, Classifier(s, "x-tenant"), Saturation(s), load.inflight,
                      lambda *r: reports.append(r), clock, load.pending_prefill)  # fmt: skip
    load.on_release = q.pump
    return q, load, reports


async def admitted(q: DispatchQueue, load: LoadTracker, headers: dict[str, str],
                   tokens: float = 100.0, size: int = 10,
                   order: list[str] | None = None) -> None:  # fmt: skip
    """Wait for a pass, note who got it, and start its request on the engine (as routing and
    its Attempt would, in the same step)."""
    p = await q.admit(lambda: [ENGINE], headers, tokens, {"max_tokens": 10}, size)
    if order is not None:
        order.append(headers.get("x-tenant", "-") + headers.get("x-priority-band", ""))
    p.bound()
    load.start(ENGINE, 0)


async def soon(aw: Any) -> Any:
    """What must come now: a hang is a failure, not a stuck test."""
    return await asyncio.wait_for(aw, 30)


async def settle() -> None:
    """Enough turns of the loop for a release, and for a read of a prefix's engines before it."""
    for _ in range(20):
        await asyncio.sleep(0)


def test_fair_queue_puts_a_quiet_tenant_before_a_busy_ones_backlog() -> None:
    fq: FairQueue[str] = FairQueue()
    for i in range(10):
        fq.push(f"b{i}", "B", 100)
    fq.push("a0", "A", 100)
    order = [fq.pop() for _ in range(2)]
    assert order == ["b0", "a0"], order  # FIFO would put a0 last
    # the quiet tenant's next arrival ties with the busy one's next: and goes first
    fq.push("a1", "A", 100)
    assert fq.pop() == "a1"


def test_fair_queue_shares_by_weight_in_tokens() -> None:
    fq: FairQueue[str] = FairQueue()
    for i in range(30):
        fq.push(f"a{i}", "A", 100, weight=2.0)
        fq.push(f"b{i}", "B", 100, weight=1.0)
    first = [fq.pop() for _ in range(30)]
    assert sum(x.startswith("a") for x in first) == 20, first
    # a tenant of long requests gets fewer of them through: cost is in tokens
    fq2: FairQueue[str] = FairQueue()
    for i in range(20):
        fq2.push(f"l{i}", "L", 400)
        fq2.push(f"s{i}", "S", 100)
    first = [fq2.pop() for _ in range(10)]
    assert sum(x.startswith("s") for x in first) == 8, first


def test_fair_queue_forgets_idle_tenants() -> None:
    fq: FairQueue[int] = FairQueue()
    for i in range(10_000):
        fq.push(i, f"t{i}", 10)
        fq.pop()
    assert fq.tenants() < 200


async def test_an_unsaturated_fleet_never_meets_the_queue() -> None:
    q, load, reports = make_queue(Clock(), max_in_flight=0)  # capacity unknown: never
    for _ in range(50):
        load.start(ENGINE, 10)
    await soon(admitted(q, load, {"x-tenant": "A"}))
    assert reports == [] and q.queued == 0 and q.launching == 0


async def test_release_order_is_band_then_fair_share() -> None:
    clock = Clock()
    q, load, _ = make_queue(clock)
    load.start(ENGINE, 0)  # the engine's one slot is taken: everything queues
    order: list[str] = []
    tasks = [asyncio.create_task(admitted(q, load, {"x-tenant": "B"}, order=order))
             for _ in range(4)]
    await settle()
    tasks.append(asyncio.create_task(admitted(q, load, {"x-tenant": "A"}, order=order)))
    tasks.append(asyncio.create_task(
        admitted(q, load, {"x-tenant": "C", "x-priority-band": "high"}, order=order)))
    await settle()
    assert q.queued == 6
    for _ in range(6):
        load.finish(ENGINE)  # one slot frees: exactly one is released and bound
        await settle()
        assert q.launching == 0 and len(order) <= 6
    await asyncio.gather(*tasks)
    assert order == ["Chigh", "B", "A", "B", "B", "B"], order


async def test_one_freed_slot_releases_one_request() -> None:
    q, load, _ = make_queue(Clock(), max_in_flight=2)
    load.start(ENGINE, 0)
    load.start(ENGINE, 0)
    order: list[str] = []
    tasks = [asyncio.create_task(admitted(q, load, {"x-tenant": "A"}, order=order))
             for _ in range(5)]
    await settle()
    load.finish(ENGINE)
    await settle()
    assert len(order) == 1 and q.queued == 4
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    assert q.queued == 0 and q.bytes == 0


async def test_past_its_budget_a_request_gets_429_with_retry_after() -> None:
    clock = Clock()
    q, load, reports = make_queue(clock)
    load.start(ENGINE, 0)
    task = asyncio.create_task(admitted(q, load, {"x-tenant": "A"}))
    await settle()
    clock.now += 29.0
    q.sweep()
    await settle()
    assert not task.done()
    clock.now += 1.5
    q.sweep()
    with pytest.raises(RequestError) as err:
        await soon(task)
    assert err.value.status == 429 and err.value.retry_after and err.value.retry_after >= 1
    assert err.value.code == "saturated"
    assert ("refused", "deadline", 1) in reports and q.queued == 0
    load.finish(ENGINE)  # nothing is released twice: it is gone
    await settle()
    assert q.launching == 0


async def test_the_sheddable_band_and_a_full_queue_are_refused_at_once() -> None:
    q, load, reports = make_queue(Clock(), max_requests=2, max_bytes=4096)
    load.start(ENGINE, 0)
    with pytest.raises(RequestError) as err:
        await soon(admitted(q, load, {"x-priority-band": "sheddable"}))
    assert err.value.status == 429 and err.value.retry_after
    tasks = [asyncio.create_task(admitted(q, load, {"x-tenant": "A"})) for _ in range(2)]
    await settle()
    with pytest.raises(RequestError) as err:
        await soon(admitted(q, load, {"x-tenant": "A"}))
    assert err.value.status == 429 and err.value.retry_after
    assert [r[1] for r in reports if r[0] == "refused"] == ["shed", "full_requests"]
    tasks[0].cancel()
    await settle()
    with pytest.raises(RequestError):
        await soon(admitted(q, load, {"x-tenant": "A"}, size=4090))  # the bytes bound
    assert reports[-1][1] == "full_bytes"
    tasks[1].cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_a_client_gone_while_queued_leaves_and_its_turn_goes_on() -> None:
    q, load, reports = make_queue(Clock())
    load.start(ENGINE, 0)
    order: list[str] = []
    gone = asyncio.create_task(admitted(q, load, {"x-tenant": "A"}, order=order))
    stays = asyncio.create_task(admitted(q, load, {"x-tenant": "B"}, order=order))
    await settle()
    gone.cancel()
    await settle()
    assert q.queued == 1 and ("refused", "client_gone", 1) in reports
    load.finish(ENGINE)
    await soon(stays)
    assert order == ["B"]


async def test_released_then_gone_hands_the_slot_on() -> None:
    q, load, _ = make_queue(Clock())
    load.start(ENGINE, 0)
    order: list[str] = []
    first = asyncio.create_task(admitted(q, load, {"x-tenant": "A"}, order=order))
    second = asyncio.create_task(admitted(q, load, {"x-tenant": "B"}, order=order))
    await settle()
    load.finish(ENGINE)  # A is released ...
    first.cancel()  # ... and its client leaves before it runs
    await settle()
    await soon(second)
    assert order == ["B"] and q.launching == 0


async def test_drain_refuses_what_waits_with_503() -> None:
    q, load, reports = make_queue(Clock())
    load.start(ENGINE, 0)
    tasks = [asyncio.create_task(admitted(q, load, {"x-tenant": "A"})) for _ in range(3)]
    await settle()
    q.drain()
    for t in tasks:
        with pytest.raises(RequestError) as err:
            await soon(t)
        assert err.value.status == 503 and err.value.retry_after == 1
    with pytest.raises(RequestError) as err:
        await soon(admitted(q, load, {"x-tenant": "A"}))
    assert err.value.status == 503
    assert q.queued == 0 and sum(r[1] == "draining" for r in reports) == 4


def test_saturation_learns_capacity_from_the_engines_gauges() -> None:
    s = Saturation(QueueSettings(max_waiting=2))
    assert s.limit(ENGINE) is None
    s.engine_report(ENGINE, running=8, waiting=2)  # a step's burst, not a queue
    assert s.limit(ENGINE) is None
    s.engine_report(ENGINE, running=8, waiting=5)
    assert s.limit(ENGINE) == 10
    s.engine_report(ENGINE, running=10, waiting=0)  # it runs more than believed
    assert s.limit(ENGINE) == 12
    s.engine_report(ENGINE, running=3, waiting=4)  # waiting out a step beside free slots
    assert s.limit(ENGINE) == 12
    assert s.room([ENGINE], lambda b: 11.0) == 1


def test_shares_a_tenant_over_its_share_only_beside_an_active_one() -> None:
    s = Shares(window_s=5.0)
    s.served("B", 900, 1.0, 0.0)
    assert not s.over("B", 0.0)  # alone: the whole fleet is its share
    s.seen("A", 1.0, 0.0)
    assert s.over("B", 0.0) and not s.over("A", 0.0)
    s.served("A", 100, 1.0, 0.0)
    assert s.over("B", 0.0)  # 90% against a half share
    s2 = Shares(window_s=5.0)
    s2.served("B", 900, 1.0, 0.0)
    s2.served("A", 100, 9.0, 0.0)  # A's weight 9: B's share is a tenth
    assert s2.over("B", 0.0)
    s2.served("B", 0, 1.0, 0.0)
    s2.served("A", 8100, 9.0, 0.0)  # 900 of 9,000: exactly B's share, not over
    assert not s2.over("B", 0.0)
    # A quiet past the activity window (2 x 5 s) no longer holds B back
    s.served("B", 100, 1.0, 10.5)
    assert not s.over("B", 10.5)


def test_shares_stay_bounded_under_a_flood_of_tenants() -> None:
    s = Shares(window_s=1.0)
    for i in range(10_000):
        s.served(f"t{i}", 10, 1.0, i * 0.1)
    assert len(s) < 400


async def test_the_reserve_keeps_a_slot_for_a_tenant_under_its_share() -> None:
    """B floods a 3-slot engine; A sends now and then. With one slot in reserve, B's backlog
    stops one short of full while A is active, and A's next request runs at once."""
    clock = Clock()
    q, load, _ = make_queue(clock, max_in_flight=3, reserve=1)
    for _ in range(3):
        load.start(ENGINE, 0)  # full
    order: list[str] = []
    b = [asyncio.create_task(admitted(q, load, {"x-tenant": "B"}, order=order))
         for _ in range(5)]
    await settle()
    for _ in range(2):  # B alone: the reserve is not kept, every slot freed goes to B
        load.finish(ENGINE)
        await settle()
    assert order == ["B", "B"]
    a1 = asyncio.create_task(admitted(q, load, {"x-tenant": "A"}, tokens=10, order=order))
    await settle()
    assert order == ["B", "B"]  # no slot free: A waits, first in line
    load.finish(ENGINE)
    await soon(a1)
    assert order == ["B", "B", "A"]
    load.finish(ENGINE)  # B over its share beside A: this slot is kept
    await settle()
    assert order == ["B", "B", "A"] and q.queued == 3
    a2 = asyncio.create_task(admitted(q, load, {"x-tenant": "A"}, tokens=10, order=order))
    await soon(a2)  # at once: no slot had to free
    assert order == ["B", "B", "A", "A"]
    # A quiet past the activity window: B takes the reserve too
    clock.now += 10.5
    load.finish(ENGINE)
    await settle()
    load.finish(ENGINE)
    await settle()
    assert order == ["B", "B", "A", "A", "B", "B"]
    for t in b:
        t.cancel()
    await asyncio.gather(*b, return_exceptions=True)


async def test_the_reserve_keeps_a_slot_for_an_active_higher_band() -> None:
    clock = Clock()
    q, load, _ = make_queue(clock, max_in_flight=2, reserve=1)
    load.start(ENGINE, 0)
    load.start(ENGINE, 0)
    order: list[str] = []
    high = {"x-priority-band": "high"}  # one tenant for all: bands alone tell them apart
    h1 = asyncio.create_task(admitted(q, load, high, order=order))
    std = [asyncio.create_task(admitted(q, load, {}, order=order)) for _ in range(3)]
    await settle()
    load.finish(ENGINE)
    await soon(h1)
    load.finish(ENGINE)  # the high band is active: the standard band leaves this slot
    await settle()
    assert order == ["-high"] and q.queued == 3
    await soon(admitted(q, load, high, order=order))
    assert order == ["-high", "-high"]
    clock.now += 10.5  # the high band quiet past the window: the standard band takes it
    load.finish(ENGINE)
    await settle()
    assert order == ["-high", "-high", "-"]
    for t in std:
        t.cancel()
    await asyncio.gather(*std, return_exceptions=True)


E1, E2 = "http://e1", "http://e2"


async def sent_holding(q: DispatchQueue, load: LoadTracker, order: list[str], name: str,
                       owners: list[str]) -> None:  # fmt: skip
    """A request whose prefix `owners` hold, over two one-slot engines: noted when it gets a
    pass, then started where it found room."""
    async def held() -> list[str]:
        return list(owners)  # as the index answers now: the test may move the prefix later

    p = await q.admit(lambda: [E1, E2], {"x-tenant": name}, 100.0, {}, 10, owners=held)
    order.append(name)
    p.bound()
    load.start(E1 if load.inflight(E1) < 1 else E2, 0)


async def test_a_request_waits_for_its_prefix_engines_while_those_behind_it_go() -> None:
    """Late binding that keeps the cache: a queued request whose prefix e1 holds waits for e1
    (up to owner_wait_s), and the requests behind it take e2's free slot meanwhile; past its
    wait it goes to any engine. With owner_wait_s 0 it takes e2's slot at once (a miss)."""
    e1, e2 = E1, E2

    async def run(owner_wait_s: float) -> tuple[list[str], Clock, LoadTracker, list[Any]]:
        clock = Clock()
        q, load, _ = make_queue(clock, owner_wait_s=owner_wait_s)
        load.start(e1, 0)
        load.start(e2, 0)  # both engines full: everything queues
        order: list[str] = []

        tasks = [asyncio.create_task(sent_holding(q, load, order, "held-by-e1", [e1]))]
        await settle()
        tasks.append(asyncio.create_task(sent_holding(q, load, order, "anywhere", [])))
        await settle()
        load.finish(e2)  # e2 frees a slot: e1, which holds the first one's prefix, is full
        await settle()
        return order, clock, load, tasks

    order, clock, load, tasks = await run(owner_wait_s=2.0)
    assert order == ["anywhere"], order  # it waits for e1; the one behind it takes e2
    clock.now += 2.0
    load.finish(e2)
    await settle()
    assert order == ["anywhere", "held-by-e1"], order  # its wait is over: any engine
    await soon(asyncio.gather(*tasks))

    order, _, _, tasks = await run(owner_wait_s=0.0)
    assert order == ["held-by-e1"], order  # the first engine with room, its prefix or not
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def test_fair_queue_takes_an_entry_ahead_of_its_turn() -> None:
    fq: FairQueue[str] = FairQueue()
    entries = {x: fq.push(x, x[0], 100) for x in ("a0", "b0", "a1")}
    assert [e.item for e in fq.first(3)] == ["a0", "b0", "a1"]
    assert fq.take(entries["b0"]) == "b0"
    fq.push("c0", "C", 100)
    assert [fq.pop() for _ in range(3)] == ["a0", "c0", "a1"]
    assert fq.first(3) == [] and len(fq) == 0


async def test_the_wait_for_its_prefix_engines_counts_from_its_turn() -> None:
    """A request that queued long behind others still waits for its prefix's engines once
    it is next in line: a saturated fleet's wait is longer than owner_wait_s for everyone."""
    e1, e2 = E1, E2
    clock = Clock()
    q, load, _ = make_queue(clock, owner_wait_s=2.0)
    load.start(e1, 0)
    load.start(e2, 0)
    order: list[str] = []

    tasks = [asyncio.create_task(sent_holding(q, load, order, "first", [])),
             asyncio.create_task(sent_holding(q, load, order, "held", [e1]))]
    await settle()
    clock.now += 10.0  # both waited 10 s, far past owner_wait_s
    load.finish(e2)
    await settle()
    assert order == ["first"], order
    load.finish(e2)  # e2 again: "held" is next in line now, and waits for e1
    await settle()
    assert order == ["first"], order
    load.finish(e1)
    await settle()
    assert order == ["first", "held"], order
    await soon(asyncio.gather(*tasks))


async def test_a_request_follows_its_prefix_to_where_it_is_when_a_slot_frees() -> None:
    """Its prefix's engines are read when a slot is there for it, not when it arrived: held
    by e1 at arrival and placed on e2 while it waited, it takes e2's free slot (read at
    arrival it would wait for e1 and the request behind it would take e2); held by nobody
    at arrival and placed on e1 meanwhile, it waits for e1 instead of missing on e2."""
    e1, e2 = E1, E2

    async def run(at_arrival: list[str], later: list[str]) -> tuple[list[str], list[Any]]:
        q, load, _ = make_queue(Clock(), owner_wait_s=2.0)
        load.start(e1, 0)
        load.start(e2, 0)  # both engines full: everything queues
        order: list[str] = []
        owners = list(at_arrival)
        tasks = [asyncio.create_task(sent_holding(q, load, order, "held", owners))]
        await settle()
        tasks.append(asyncio.create_task(sent_holding(q, load, order, "anywhere", [])))
        await settle()
        owners[:] = later  # the index now places its prefix here
        load.finish(e2)
        await settle()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return order, tasks

    order, _ = await run(at_arrival=[e1], later=[e1, e2])
    assert order == ["held"], order  # to e2, which holds its prefix now
    order, _ = await run(at_arrival=[], later=[e1])
    assert order == ["anywhere"], order  # it waits for e1; the one behind it takes e2


async def test_the_reserve_goes_to_an_under_share_tenant_behind_a_busy_ones_head() -> None:
    """A quiet tenant's second request in a row has its fair turn after the busy tenant's
    next: when the only free slot is the reserve, which the busy one may not take, the quiet
    one behind it takes it (it would otherwise wait for a slot beyond the reserve)."""
    clock = Clock()
    q, load, _ = make_queue(clock, max_in_flight=2, reserve=1)
    load.start(ENGINE, 0)
    load.start(ENGINE, 0)  # the engine's two slots taken: everything queues
    order: list[str] = []
    tasks = [asyncio.create_task(admitted(q, load, {"x-tenant": "B"}, order=order))
             for _ in range(10)]  # fmt: skip
    await settle()
    for _ in range(6):  # B alone is served: never over its share while alone
        load.finish(ENGINE)
        await settle()
    assert order == ["B"] * 6, order
    # A's requests cost 3x B's: its second's fair turn comes after B's next
    for _ in range(2):
        tasks.append(asyncio.create_task(
            admitted(q, load, {"x-tenant": "A"}, tokens=300.0, order=order)))
    await settle()
    load.finish(ENGINE)
    await settle()
    assert order[6:] == ["A"], order  # A's first: its turn
    load.finish(ENGINE)  # one slot free, the reserve: B (over its share now) may not take it
    await settle()
    assert order[6:] == ["A", "A"], order
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


E3 = "http://e3"


def test_a_request_beyond_the_reserve_leaves_the_quietest_engine_to_it() -> None:
    """Released beyond the reserve (`spare`), a request is bound off the quietest engine
    (fewest in flight, then least prefill pending), where the reserve stays for the request
    it is kept for; a request that may take the reserve sees every engine with room."""
    clock = Clock()
    q, load, _ = make_queue(clock, max_in_flight=2, reserve=1)
    backends = [Backend(E1), Backend(E2), Backend(E3)]
    load.start(E1, 0)  # e1: one running, its prefill pending
    load.start(E1, 500)
    load.finish(E1)
    load.start(E2, 0)  # e2: one running, decoding
    load.first_byte(E2, 0)
    load.start(E3, 0)
    load.start(E3, 0)  # e3: full
    assert [b.url for b in q.with_room(backends)] == [E1, E2]
    assert [b.url for b in q.with_room(backends, spare=True)] == [E1]  # e2 kept
    load.finish(E2)  # e2 idle: still the quietest
    assert [b.url for b in q.with_room(backends, spare=True)] == [E1]
    load.start(E2, 0)
    load.start(E2, 0)  # only e1 has room: it goes there (no slot idles beyond the reserve)
    assert [b.url for b in q.with_room(backends, spare=True)] == [E1]


async def test_a_request_waits_for_its_full_prefix_engine_while_another_has_room() -> None:
    """Not only when the whole fleet is saturated: with e1 (which holds its prefix) full and
    e2 free, a request waits for e1 up to owner_wait_s instead of being sent to e2 at once
    to compute its prefix again (three routers on llama-servers spread every hot prompt over
    the fleet that way); a request e2 can serve passes meanwhile."""
    clock = Clock()
    q, load, reports = make_queue(clock, owner_wait_s=2.0)
    load.start(E1, 0)  # e1 full, e2 free
    order: list[str] = []
    held = asyncio.create_task(sent_holding(q, load, order, "held-by-e1", [E1]))
    await settle()
    assert order == [] and ("queued", "owners_full", 1) in reports
    other = asyncio.create_task(sent_holding(q, load, order, "anywhere", []))
    await settle()
    assert order == ["anywhere"], order  # e2's room is not kept from those it suits
    load.finish(E1)
    await settle()
    assert order == ["anywhere", "held-by-e1"], order
    await soon(asyncio.gather(held, other))
    # a request whose prefix nobody holds never waits while an engine has room
    load.finish(E2)
    load.start(E1, 0)
    await soon(sent_holding(q, load, order, "new", []))
    assert order[-1] == "new"


async def test_a_request_the_reserve_is_kept_for_does_not_wait_for_its_prefix_engines() -> None:
    """With a reserve, a tenant under its share starts where there is room even when its
    prefix engine is full: its wait is what the reserve is kept to spare it."""
    q, load, _ = make_queue(Clock(), owner_wait_s=2.0, reserve=1)
    load.start(E1, 0)  # e1 (its prefix) full, e2 free
    order: list[str] = []
    task = asyncio.create_task(sent_holding(q, load, order, "quiet", [E1]))
    await settle()
    assert order == ["quiet"], order
    await soon(task)
