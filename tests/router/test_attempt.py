"""The request lifecycle: what an Attempt does to load and to the index on each path."""

import json

from prefix_router.attempt import Attempt
from prefix_router.core import RouterCore
from prefix_router.index.events import EventsIndex
from prefix_router.parsing import parse_request

BACKENDS = ["http://192.0.2.1:8000", "http://192.0.2.2:8000"]


def _parsed(system: str = "S" * 4000, user: str = "hi"):
    body = {
        "model": "m",
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
    }
    return parse_request(json.dumps(body).encode(), "chat")


def _snapshot(core: RouterCore) -> tuple[int, dict[str, int], dict[str, float]]:
    probe = core.index.table.table("m")  # type: ignore[attr-defined]
    return (
        len(probe),
        {b: probe.owned_blocks(b) for b in BACKENDS},
        {b: core.load.inflight(b) for b in BACKENDS},
    )


async def test_a_request_right_behind_follows_one_not_yet_answered(make_core):
    core = make_core(BACKENDS, 100_000)
    first = await core.route(_parsed())
    assert first.decision.reason == "miss"
    with Attempt(core.ledger, first, first.decision.backend):
        # sent, no answer yet: the index has nothing, but the pending hold is seen
        assert core.index.entries() == 0
        behind = await core.route(_parsed(user="another question"))
        assert (behind.decision.backend, behind.decision.reason) == (first.decision.backend, "hit")
    assert len(core.index.pending) == 0


async def test_a_2xx_records_the_prompt_and_the_answer_the_next_turn(
    make_core,
):
    core = make_core(BACKENDS, 100_000)
    route = await core.route(_parsed())
    with Attempt(core.ledger, route, route.decision.backend) as a:
        a.answered(200)
        assert core.index.entries() == 0  # headers alone: the prefill may not be done
        a.first_byte(streamed=True)
        after_prompt = core.index.entries()
        assert after_prompt == len(route.hashes)
        a.done("an answer " * 50, (1000, 0))
    assert core.index.entries() > after_prompt  # the next turn's prefix, for the same backend
    assert core.load.inflight(route.decision.backend) == 0
    assert core.load.pending_prefill(route.decision.backend) == 0


async def test_failures_and_refusals_leave_the_index_as_it_was(make_core):
    core = make_core(BACKENDS, 100_000)
    warm = await core.route(_parsed())
    with Attempt(core.ledger, warm, warm.decision.backend) as a:
        a.answered(200)
        a.first_byte(streamed=False)
        a.done(None, None)
    before = _snapshot(core)
    for outcome in ("refused", "client_gone", "status"):
        route = await core.route(_parsed(user=f"a longer question {outcome} " * 40))
        other = next(b for b in BACKENDS if b != route.decision.backend)
        with Attempt(core.ledger, route, other) as a:
            if outcome == "status":
                a.answered(400)  # the engine refused it
                a.first_byte(streamed=False)
                a.failed("status_400", at_fault=False)
            elif outcome == "refused":
                a.failed("connect_error")
            else:
                a.answered(200)  # the client leaves after the headers, before any token
        assert _snapshot(core) == before, outcome
    assert len(core.index.pending) == 0


async def test_a_closed_attempt_releases_its_load_once(make_core):
    core = make_core(BACKENDS, 100_000)
    route = await core.route(_parsed())
    b = route.decision.backend
    a = Attempt(core.ledger, route, b)
    assert core.load.inflight(b) == 1 and core.load.pending_prefill(b) > 0
    a.close()
    a.close()
    assert core.load.inflight(b) == 0 and core.load.pending_prefill(b) == 0


async def test_with_events_a_hit_holds_only_what_the_index_lacks(make_core):
    """In `events` mode the engine's events record a chain; until they come, an answered
    request's blocks are speculative holds, and of a hit only those past its match."""
    core = make_core(BACKENDS, 100_000, index="events")
    first = await core.route(_parsed())
    b = first.decision.backend
    core.index.record("m", first.hashes, b)  # as the engine's BlockStored would
    route = await core.route(_parsed(user="another question " * 30))
    assert (route.decision.backend, route.decision.reason) == (b, "hit")
    matched = route.decision.matched_blocks
    assert 0 < matched < len(route.hashes)
    with Attempt(core.ledger, route, b) as a:
        a.answered(200)
        a.first_byte(streamed=False)
    assert len(core.index.speculative) == len(route.hashes) - matched
    assert core.index.entries() == len(first.hashes)  # the events, not the router, record
    behind = await core.route(_parsed(user="another question " * 30))
    assert behind.decision.matched_blocks == len(behind.hashes)


async def test_with_events_a_hit_makes_the_blocks_it_used_the_engines_most_recent(
    make_core,
):
    """The events say what an engine stores, not what it uses: an answered hit refreshes
    the blocks it matched, so the engine's coldest block (what the eviction scorer weighs)
    is the one its own LRU would evict."""
    clock = [100.0]
    core = make_core(BACKENDS, 100_000, clock=lambda: clock[0], index="events")
    index = core.index
    assert isinstance(index, EventsIndex)
    route = await core.route(_parsed())
    b = route.decision.backend
    index.record("m", route.hashes, b)  # stored at 100, as BlockStored events would
    clock[0] = 120.0
    other = (await core.route(_parsed("T" * 4000))).hashes
    index.record("m", other, b)  # another, at 120
    index.evicting(b)  # the engine is full
    clock[0] = 150.0
    assert index.tail_age("m", b) == 50.0
    again = await core.route(_parsed())
    assert (again.decision.backend, again.decision.matched_blocks) == (b, len(route.hashes))
    with Attempt(core.ledger, again, b) as a:
        a.answered(200)
        a.first_byte(streamed=True)
    assert index.tail_age("m", b) == 30.0  # the other prompt's blocks are the tail now
    assert index.entries() == len(route.hashes) + len(other)  # nothing added by the router


async def test_a_named_session_follows_its_last_engine(make_core):
    """Two prompts that share nothing but their session: the second goes where the first was
    served (its history is cached there), which only the session can tell."""
    core = make_core([f"http://192.0.2.{i}:8000" for i in range(1, 9)], 100_000)
    backends = set()
    for i in range(8):
        first = await core.route(_parsed(f"agent {i} " * 300, "one"), {"x-session-id": f"s{i}"})
        with Attempt(core.ledger, first, first.decision.backend) as a:
            a.answered(200)
            a.first_byte(streamed=False)
        again = await core.route(_parsed(f"unrelated {i} " * 300, "two"), {"x-session-id": f"s{i}"})
        assert again.decision.backend == first.decision.backend, i
        backends.add(first.decision.backend)
    assert len(backends) > 1  # the sessions themselves still spread
