"""Warm start on scale-out (router/warm.py): heat, the hand-over plan, one use each. Pure."""

import pytest

from prefix_router.warm import HandOver, HotPrefixes, plan_hand_over


def test_heat_decays_with_its_half_life_and_ranks_the_hottest_first() -> None:
    hot = HotPrefixes(half_life=10.0)
    for _ in range(4):
        hot.observe(1, now=0.0)
    hot.observe(2, now=0.0)
    top = dict(hot.top(now=10.0))
    assert top[1] == pytest.approx(2.0)  # 4 requests, one half-life ago
    assert top[2] == pytest.approx(0.5)
    assert [k for k, _ in hot.top(now=10.0)] == [1, 2]
    hot.observe(2, now=10.0)
    hot.observe(2, now=10.0)
    assert [k for k, _ in hot.top(now=10.0)] == [2, 1]  # 2.5 against 2.0


def test_tracking_is_bounded_and_the_coldest_go_first() -> None:
    hot = HotPrefixes(half_life=10.0, max_tracked=8)
    for k in range(8):
        for _ in range(k + 1):
            hot.observe(k, now=0.0)
    hot.observe(100, now=0.0)
    assert len(hot) <= 8
    kept = {k for k, _ in hot.top(now=0.0, n=100)}
    assert 0 not in kept and 7 in kept and 100 in kept


def test_the_plan_hands_over_the_new_replicas_fair_share_hottest_first() -> None:
    hot = [(10, 50.0), (11, 30.0), (12, 10.0), (13, 5.0), (14, 5.0)]
    # 2 new of 4: half of the heat (50) is their share; the hottest alone carries it
    assert plan_hand_over(hot, ["n1", "n2"], 4) == {10: "n1"}
    # 1 new of 8: 12.5 of 100
    assert plan_hand_over(hot, ["n1"], 8) == {10: "n1"}
    # equal heat: round-robin over the new replicas until the share is reached
    flat = [(k, 1.0) for k in range(8)]
    assert plan_hand_over(flat, ["a", "b"], 4) == {0: "a", 1: "b", 2: "a", 3: "b"}
    assert plan_hand_over(flat, [], 4) == {}
    assert plan_hand_over([], ["a"], 4) == {}


def test_a_hand_over_is_used_once_by_the_deepest_matching_prefix_and_expires() -> None:
    h = HandOver(ttl=5.0)
    h.add({7: "n1", 9: "n2"}, now=0.0)
    assert h.take([1, 2, 3], now=1.0) is None
    assert h.take([1, 7, 9], now=1.0) == "n2"  # the deeper one
    assert h.take([1, 7, 9], now=1.0) == "n1"
    assert h.take([1, 7, 9], now=1.0) is None  # both used
    h.add({7: "n1"}, now=0.0)
    assert h.take([7], now=6.0) is None  # expired
    h.add({7: "n1", 8: "n2"}, now=0.0)
    h.forget("n1")
    assert len(h) == 1 and h.take([7, 8], now=1.0) == "n2"


def test_the_rate_of_a_steady_stream_is_read_back_from_its_heat() -> None:
    hot = HotPrefixes(half_life=10.0)
    # 4 requests a second for 100 s (ten half-lives: the count has settled)
    for i in range(400):
        hot.observe(1, now=i * 0.25)
    assert hot.rate(1, now=100.0) == pytest.approx(4.0, rel=0.05)
    assert hot.rate(1, now=110.0) == pytest.approx(2.0, rel=0.05)  # one half-life unused
    assert hot.rate(2, now=100.0) == 0.0  # never seen
