"""Warm start on scale-out: hand the hottest prefixes to a replica that just joined. Pure.

Without it a new replica gets only misses and overflow, so it stays cold while the old owners
of the hot prefixes run at the load bound. With it the router sends one request of each of
the hottest prefixes to the new replica on purpose; that request makes it an owner in the
table, and from then on the normal policy splits the prefix's traffic between old and new
owners by load. The hottest prefixes are taken until they carry the new replicas' fair share
of the traffic (their count over all replicas), hottest first, round-robin over new replicas.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

HALF_LIFE_S = 30.0  # a prefix's heat halves in this time without requests
MAX_TRACKED = 4096  # prefixes tracked; the coldest go first
STEER_TTL_S = 30.0  # a hand-over not used by then (the prefix went cold) is dropped


@dataclass(slots=True)
class _Heat:
    score: float
    at: float


class HotPrefixes:
    """Decayed request counts per shared prefix (the deepest block a request matched)."""

    def __init__(self, half_life: float = HALF_LIFE_S, max_tracked: int = MAX_TRACKED) -> None:
        self._rate = math.log(2) / half_life
        self._max = max_tracked
        self._heat: dict[int, _Heat] = {}

    def _decayed(self, h: _Heat, now: float) -> float:
        return h.score * math.exp(-self._rate * (now - h.at))

    def observe(self, key: int, now: float) -> None:
        h = self._heat.get(key)
        if h is None:
            if len(self._heat) >= self._max:
                self._prune(now)
            self._heat[key] = _Heat(1.0, now)
            return
        h.score = self._decayed(h, now) + 1.0
        h.at = now

    def rate(self, key: int, now: float) -> float:
        """Requests per second: a steady stream of r/s holds a decayed count of r / (ln 2 /
        half-life), so the count times that is the rate (low for a prefix not seen for long)."""
        h = self._heat.get(key)
        return self._decayed(h, now) * self._rate if h is not None else 0.0

    def _prune(self, now: float) -> None:
        ranked = sorted(self._heat.items(), key=lambda kv: self._decayed(kv[1], now))
        for key, _ in ranked[: len(ranked) // 4 or 1]:
            del self._heat[key]

    def top(self, now: float, n: int = 64) -> list[tuple[int, float]]:
        """(prefix key, heat) hottest first; heat is in decayed requests."""
        ranked = sorted(
            ((k, self._decayed(h, now)) for k, h in self._heat.items()),
            key=lambda kv: kv[1],
            reverse=True,
        )
        return ranked[:n]

    def __len__(self) -> int:
        return len(self._heat)


def plan_hand_over(
    hot: Sequence[tuple[int, float]], new: Sequence[str], backends: int
) -> dict[int, str]:
    """Which hot prefix goes to which new replica: hottest first, round-robin over `new`,
    until the prefixes handed over carry the new replicas' fair share of all the heat."""
    if not new or not hot or backends <= 0:
        return {}
    total = sum(heat for _, heat in hot)
    share = total * min(len(new), backends) / backends
    out: dict[int, str] = {}
    given = 0.0
    for i, (key, heat) in enumerate(hot):
        if given >= share:
            break
        out[key] = new[i % len(new)]
        given += heat
    return out


class HandOver:
    """Pending hand-overs: prefix key -> (new replica, deadline); each is used once."""

    def __init__(self, ttl: float = STEER_TTL_S) -> None:
        self._ttl = ttl
        self._pending: dict[int, tuple[str, float]] = {}

    def add(self, plan: dict[int, str], now: float) -> None:
        for key, backend in plan.items():
            self._pending[key] = (backend, now + self._ttl)

    def take(self, hashes: Sequence[int], now: float) -> str | None:
        """The replica this request should warm, if its prefix is handed over; used up."""
        if not self._pending:
            return None
        for key in reversed(hashes):  # the deepest handed-over prefix of this request
            got = self._pending.pop(key, None)
            if got is not None:
                return got[0] if got[1] >= now else None
        return None

    def forget(self, backend: str) -> None:
        self._pending = {k: v for k, v in self._pending.items() if v[0] != backend}

    def __len__(self) -> int:
        return len(self._pending)
