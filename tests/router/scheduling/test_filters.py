import math

from prefix_router.backends import Backend
from prefix_router.scheduling import Candidate
from prefix_router.scheduling.filters import load_limit, serving, within_load


def test_the_bound_is_relative_with_an_absolute_floor() -> None:
    cands = [Candidate("a", 1), Candidate("b", 3), Candidate("c", 2)]
    assert load_limit(cands, 0.25) == 3  # ceil(1.25 x 7/3)
    assert load_limit(cands, 0.25, slack=4) == 7  # ceil(7/3 + 4)
    # at high load the relative bound is the larger one
    busy = [Candidate(n, 40) for n in "abc"]
    assert load_limit(busy, 0.25, slack=4) == math.ceil(1.25 * 121 / 3)


def test_over_the_bound_is_held_back_not_dropped() -> None:
    cands = [Candidate("a", 1), Candidate("b", 3), Candidate("c", 2)]
    within, held = within_load(cands, 0.25, 0.0)
    assert [c.name for c in within] == ["a", "c"] and [c.name for c in held] == ["b"]


def test_serving_keeps_backends_of_the_model_or_all_when_none_says() -> None:
    a = Backend("a", models=frozenset({"m"}))
    b = Backend("b", models=frozenset({"other"}))
    c = Backend("c")
    assert [x.url for x in serving([a, b, c], "m")] == ["a", "c"]
    assert [x.url for x in serving([Backend("x"), Backend("y")], "m")] == ["x", "y"]
    # nobody serves it: every backend is a candidate, and the engines answer for themselves
    assert [x.url for x in serving([b], "m")] == ["b"]
