"""Session affinity: a named session is worth its weight on the engine that served it last,
within the load bound and never past it."""

import random

from prefix_router.scheduling import Ask, Candidate
from prefix_router.scheduling.profiles import PROFILES
from prefix_router.scheduling.scorers import Signals
from prefix_router.scheduling.scorers.session_affinity import SessionAffinity
from prefix_router.sessions import Sessions, session_key

from .conftest import settings


def test_the_last_engine_of_a_session_scores_its_weight() -> None:
    sessions = Sessions(10)
    sessions.served(1, "b")
    cands = [Candidate("a"), Candidate("b")]
    assert SessionAffinity(256.0, sessions)(cands, Ask(7, session=1)) == [0.0, 256.0]
    assert SessionAffinity(256.0, sessions)(cands, Ask(7, session=2)) is None  # unknown
    assert SessionAffinity(256.0, sessions)(cands, Ask(7)) is None  # none named


def test_the_map_is_bounded_and_keeps_the_recent() -> None:
    sessions = Sessions(2)
    for key, backend in ((1, "a"), (2, "b"), (1, "c"), (3, "d")):
        sessions.served(key, backend)
    assert len(sessions) == 2
    assert (sessions.last(1), sessions.last(2), sessions.last(3)) == ("c", None, "d")


def test_tenants_never_share_a_session() -> None:
    assert session_key("s1", "tenant-a") != session_key("s1", "tenant-b")


def _choose(cands: list[Candidate], sessions: Sessions, session: int) -> str:
    s = settings(session_weight_tokens=256.0, load_slack=2.0)
    profile = PROFILES["prefix"](s, Signals(sessions=sessions), random.Random(0))
    return profile.choose(cands, Ask(7, 0, 0, 0.0, session)).backend


def test_a_session_returns_to_its_engine_but_not_past_the_load_bound() -> None:
    sessions = Sessions(10)
    sessions.served(5, "c")
    idle = [Candidate(n) for n in "abcd"]
    assert _choose(idle, sessions, 5) == "c"  # nothing else to tell them apart: its engine
    # its engine over the bound (mean 1.25 + slack 2 -> at most 4 after this one): elsewhere
    busy = [Candidate("a"), Candidate("b"), Candidate("c", 4.0), Candidate("d")]
    assert _choose(busy, sessions, 5) != "c"
