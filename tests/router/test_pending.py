"""The pending/speculative holds merged into an index lookup (index/pending.py)."""

from prefix_router.index.pending import PendingIndex

CHAIN = [11, 12, 13, 14, 15]


def test_a_hold_from_the_chains_start_raises_the_depth() -> None:
    p = PendingIndex()
    p.hold("m", CHAIN[:3], "a")
    into = {"b": 1}
    out = p.merge("m", CHAIN, into)
    assert out == {"a": 3, "b": 1}
    assert into == {"b": 1}  # the index's answer is not changed in place


def test_a_hold_of_the_tail_continues_from_the_index_depth() -> None:
    p = PendingIndex()
    p.hold("m", CHAIN[2:4], "a")  # the index has a's first two blocks
    assert p.merge("m", CHAIN, {"a": 2}) == {"a": 4}
    # without the index's first two blocks the tail alone says nothing
    assert p.merge("m", CHAIN, {}) == {}
    assert p.merge("m", CHAIN, {"a": 1}) == {"a": 1}
    # another model's chain with the same hashes is not this one
    assert p.merge("x", CHAIN, {"a": 2}) == {"a": 2}


def test_holds_end_when_released_expired_or_settled() -> None:
    p = PendingIndex()
    p.hold_until("m", CHAIN[2:], "a", when=10.0)
    p.hold("m", CHAIN[2:], "a")
    p.release("m", CHAIN[2:], "a")
    assert p.merge("m", CHAIN, {"a": 2}) == {"a": 5}
    p.expire(now=9.0)
    assert p.merge("m", CHAIN, {"a": 2}) == {"a": 5}
    p.expire(now=10.0)
    assert p.merge("m", CHAIN, {"a": 2}) == {"a": 2}
    assert len(p) == 0
    p.hold_until("m", CHAIN, "a", when=20.0)
    p.settle("m", CHAIN[:2], "a")  # the engine's events stored the first two
    assert p.merge("m", CHAIN, {"a": 2}) == {"a": 5}
    assert p.merge("m", CHAIN, {}) == {}
