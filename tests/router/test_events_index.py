"""The events-fed index learns how full each engine is from its evictions, and its coldest
block from the requests sent there, so the eviction scorer works on an index that has no
configured capacity (index/events.py)."""

from __future__ import annotations

from array import array

from prefix_router.events.feed import EngineFeed
from prefix_router.events.wire import Batch, Removed, Stored
from prefix_router.index.events import EventsIndex
from prefix_router.prefix import block_hashes, chain_seed

SMALL, BIG = "http://192.0.2.10:8000", "http://192.0.2.11:8000"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _keys(tokens: list[int]) -> list[int]:
    return block_hashes(array("I", tokens).tobytes(), 16 * 4, chain_seed("m", None))


def _store(feed: EngineFeed, seq: int, first_hash: int, tokens: list[int]) -> None:
    """One chain of len(tokens) // 16 blocks stored from the root, engine hashes from
    `first_hash` on."""
    n = len(tokens) // 16
    hashes = list(range(first_hash, first_hash + n))
    feed.apply(seq, Batch(0.0, [Stored(hashes, None, tokens, 16, None, None)], 0))


def test_an_engine_is_full_from_its_first_eviction_at_what_it_held_then() -> None:
    clock = Clock()
    index = EventsIndex(16, 100_000, clock=clock)
    small = EngineFeed(SMALL, index, 16, lambda lora: "m")
    big = EngineFeed(BIG, index, 16, lambda lora: "m")
    a, b = list(range(1000, 1064)), list(range(2000, 2064))  # 4 blocks each
    _store(small, 0, 10, a)
    clock.now = 110.0
    _store(small, 1, 20, b)
    _store(big, 0, 10, a)
    # nothing evicted yet: room everywhere, so placing a prefix evicts nothing
    assert index.tail_age("m", SMALL) == float("inf")
    assert index.occupancy("m", SMALL) == 0.0
    clock.now = 130.0
    small.apply(2, Batch(0.0, [Removed([13])], 0))  # a's last block: the LRU tail
    # it held 8 blocks when it evicted: full at 8, and stays full (7 of 8 now)
    assert index.occupancy("m", SMALL) == 7 / 8
    assert index.tail_age("m", SMALL) == 30.0  # a's blocks, stored at 100
    assert index.tail_age("m", BIG) == float("inf")  # the big engine has not evicted
    # a request sent to SMALL that matched a: a is its most recent now, b the tail
    clock.now = 140.0
    index.touch("m", _keys(a), SMALL)
    assert index.tail_age("m", SMALL) == 30.0  # b, stored at 110
    assert index.match("m", _keys(a)) == {SMALL: 3, BIG: 4}  # touch adds nothing


def test_the_capacity_is_the_most_an_engine_held_since_it_evicted_and_a_restart_forgets_it(
) -> None:
    index = EventsIndex(16, 100_000, clock=Clock())
    feed = EngineFeed(SMALL, index, 16, lambda lora: "m")
    _store(feed, 0, 10, list(range(1000, 1064)))
    feed.apply(1, Batch(0.0, [Removed([13])], 0))  # full at 4
    assert index.full_at(SMALL) == 4
    # 6 more (the running sequences that took part of its pool ended): it holds 9
    _store(feed, 2, 20, list(range(2000, 2096)))
    assert index.full_at(SMALL) == 9 and index.occupancy("m", SMALL) == 1.0
    feed.apply(3, Batch(0.0, [Removed([12]), Removed([11])], 0))
    assert index.occupancy("m", SMALL) == 7 / 9
    feed.reset()  # a restart: maybe another engine, another size
    assert index.occupancy("m", SMALL) == 0.0
    assert index.tail_age("m", SMALL) == float("inf")


def test_the_eviction_scorer_charges_the_engine_that_thrashes() -> None:
    from prefix_router.config import RouterSettings
    from prefix_router.scheduling.candidate import Ask, Candidate
    from prefix_router.scheduling.scorers import Signals
    from prefix_router.scheduling.scorers.eviction import build

    clock = Clock()
    index = EventsIndex(16, 100_000, clock=clock)
    small = EngineFeed(SMALL, index, 16, lambda lora: "m")
    big = EngineFeed(BIG, index, 16, lambda lora: "m")
    _store(big, 0, 10, list(range(1000, 1064)))
    big.apply(1, Batch(0.0, [Removed([13])], 0))  # full, its tail from t=100
    clock.now = 159.0
    _store(small, 0, 10, list(range(2000, 2064)))
    small.apply(1, Batch(0.0, [Removed([13])], 0))  # full, its tail from t=159
    clock.now = 160.0
    cands = [Candidate(SMALL), Candidate(BIG)]
    for c in cands:
        c.tail_age = index.tail_age("m", c.name)
    scorer = build(RouterSettings(), Signals())
    assert scorer is not None
    scores = scorer(cands, Ask(1, 4, 0, clock.now))
    assert scores is not None
    assert scores[0] < scores[1] < 0  # the young tail (1 s) costs more than the old (60 s)
