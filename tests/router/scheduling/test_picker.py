import random
from collections import Counter

from prefix_router.scheduling import Candidate
from prefix_router.scheduling.filters import load_limit
from prefix_router.scheduling.picker import reason

from .conftest import choose


def test_the_reason_is_computed_in_one_place() -> None:
    assert reason(0, 0, False) == "miss"
    assert reason(5, 5, False) == "hit"
    assert reason(2, 5, True) == "replicated"  # the owner is over the bound
    assert reason(2, 5, False) == "overflow"  # an owner within it, but too loaded


def test_an_owner_over_the_bound_is_the_last_resort() -> None:
    # b owns the prefix but is at the bound: ceil(1.25 x 7 / 3) = 3
    cands = [Candidate("a", 1), Candidate("b", 3, matched_blocks=100), Candidate("c", 2)]
    assert load_limit(cands, 0.25) == 3
    d = choose(cands)
    assert (d.backend, d.reason) == ("a", "replicated")
    assert d.order[-1] == "b"


def test_misses_on_an_idle_fleet_spread_by_their_prefix() -> None:
    cands = [Candidate(n) for n in "abcdefgh"]
    got = Counter(
        choose(cands, key=random.Random(k).getrandbits(64)).backend for k in range(800)
    )
    assert set(got) == set("abcdefgh")
    assert max(got.values()) < 2 * 800 / 8


def test_a_prefix_stays_with_its_owners_while_they_are_within_the_bound() -> None:
    # a and b hold the prefix and have room; idler non-owners do not get a copy of it
    cands = [
        Candidate("a", 2, matched_blocks=100),
        Candidate("b", 2, matched_blocks=100),
        Candidate("c", 9),
        Candidate("d", 0),
        Candidate("e", 0),
    ]
    d = choose(cands, load_bound=0.5, load_cost_tokens=64)
    assert d.reason == "hit" and d.backend in ("a", "b")
    assert d.order[0] == ({"a", "b"} - {d.backend}).pop()  # the other owner falls back first
    assert choose([Candidate("a", 2), Candidate("b", 1)]).reason == "miss"
