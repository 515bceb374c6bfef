"""Engine states and drops in a router core (engine_states.py): what the health loop's scrapes
and the attempts' evidence do to the index, without HTTP."""

from __future__ import annotations

from prefix_router.index import DEGRADED, ESTIMATED

A, B = "http://a", "http://b"
PAGE = b"process_start_time_seconds %d\nvllm:num_requests_running 0\n"


async def test_a_new_start_time_drops_that_engine_alone(make_core) -> None:
    core = make_core([A, B], 100_000, index="corrected")
    chain = list(range(1, 11))
    core.index.own("m", chain, A)
    core.index.own("m", chain, B)
    core.states.scraped(A, PAGE % 1)
    core.states.scraped(B, PAGE % 1)
    assert await core.index.lookup("m", chain) == {A: 10, B: 10}
    core.states.scraped(A, PAGE % 1)
    assert core.states.dropped == []
    core.states.scraped(A, PAGE % 2)
    assert core.states.dropped == [(A, "restart")]
    assert await core.index.lookup("m", chain) == {B: 10}
    assert core.states.states() == {A: ESTIMATED, B: ESTIMATED}
    assert core.states.counts() == (2, 0, 0)


async def test_shortfalls_make_an_engine_suspect_then_drop_it(make_core) -> None:
    core = make_core([A, B], 100_000, index="corrected")
    core.index.own("m", list(range(1, 11)), A)
    core.states.answered(A, 1, 10, 0)
    core.states.answered(A, 2, 10, 1)
    assert core.states.state(A) == DEGRADED and core.states.counts() == (2, 0, 1)
    core.states.answered(A, 3, 10, 0)
    assert core.states.dropped == [(A, "shortfall")]
    assert await core.index.lookup("m", list(range(1, 11))) == {}
    assert core.states.state(A) == ESTIMATED


async def test_a_backend_that_leaves_starts_a_new_baseline(make_core) -> None:
    core = make_core([A], 100_000, index="corrected")
    core.states.scraped(A, PAGE % 1)
    core.backends.set_members([])
    core.backends.set_members([A])
    core.states.scraped(A, PAGE % 2)  # its replacement's first scrape
    assert core.states.dropped == []
