import random

from prefix_router.config import POLICIES
from prefix_router.scheduling import Ask, Candidate
from prefix_router.scheduling.profiles import PROFILES
from prefix_router.scheduling.scorers import Signals

from .conftest import choose, settings


def test_every_policy_the_settings_accept_has_a_profile() -> None:
    assert set(PROFILES) == set(POLICIES)


def test_least_loaded_and_round_robin() -> None:
    cands = [Candidate("a", 3), Candidate("b", 1), Candidate("c", 2)]
    assert choose(cands, policy="least-loaded").backend == "b"
    rr = PROFILES["round-robin"](settings(policy="round-robin"), Signals(), random.Random(0))
    got = [rr.choose(list(cands), Ask(0)).backend for _ in range(6)]
    assert got == ["a", "b", "c", "a", "b", "c"]


def test_chwbl_is_sticky_and_bounded() -> None:
    cands = [Candidate(n) for n in "abcd"]
    first = choose(cands, policy="chwbl", key=12345).backend
    assert choose(cands, policy="chwbl", key=12345).backend == first
    loaded = [Candidate(n, 5 if n == first else 0) for n in "abcd"]
    d = choose(loaded, policy="chwbl", key=12345)
    assert d.backend != first and d.reason == "overflow"
