"""Scorers: each says what sending the request to a candidate is worth, in ONE unit, prefill
tokens (saved is positive, cost is negative), so their sum needs no weights to normalise it.

A scorer is built once from the settings and the router's live signals, and is then called
per request with the candidates and the request as scored; it returns one score per
candidate, or None when it has nothing to say for this request. The `prefix` profile sums
every scorer registered here, in this order. Adding a term: one module, its test, one line.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from ...config import RouterSettings
from ...sessions import Sessions
from ...sizing import Sizing
from ...steps import StepClock
from ..candidate import Ask, Candidate
from . import eviction, in_flight, pending_prefill, prefix_match, session_affinity, step_wait


@dataclass(slots=True)
class Signals:
    """What the router learns as it runs, for scorers that read more than the candidates."""

    steps: StepClock = field(default_factory=StepClock)
    # blocks -> engine tokens: the one conversion the scores, the load and the index share
    sizing: Sizing = field(default_factory=lambda: Sizing(16, 64, 4.0, exact=True))
    sessions: Sessions = field(default_factory=lambda: Sessions(100_000))  # their last engine


class Scorer(Protocol):
    def __call__(self, cands: Sequence[Candidate], ask: Ask) -> Sequence[float] | None: ...


Factory = Callable[[RouterSettings, Signals], Scorer | None]

SCORERS: dict[str, Factory] = {
    "prefix_match": prefix_match.build,
    "in_flight": in_flight.build,
    "pending_prefill": pending_prefill.build,
    "eviction": eviction.build,
    "step_wait": step_wait.build,
    "session_affinity": session_affinity.build,
}


def build_all(s: RouterSettings, signals: Signals) -> list[Scorer]:
    """Every registered scorer the settings turn on (a factory returns None for one off)."""
    return [sc for f in SCORERS.values() if (sc := f(s, signals)) is not None]


def score(cands: Sequence[Candidate], ask: Ask, scorers: Sequence[Scorer]) -> None:
    """Each candidate's `score`: the sum of every scorer's."""
    for c in cands:
        c.score = 0.0
    for scorer in scorers:
        got = scorer(cands, ask)
        if got is not None:
            for c, v in zip(cands, got, strict=True):
                c.score += v
