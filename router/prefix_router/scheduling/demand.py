"""Demand for a shared prefix: decayed request counts, and the rule that gives a prefix in
demand one more owner. Pure: callers pass the time."""

from __future__ import annotations

import math
from dataclasses import dataclass

HALF_LIFE_S = 30.0  # a prefix's count halves in this time without requests
MAX_TRACKED = 4096  # prefixes tracked; the coldest go first


@dataclass(slots=True)
class _Heat:
    count: float
    at: float


class Demand:
    """Requests a second per prefix (keyed by the deepest block a request matched)."""

    def __init__(self, half_life: float = HALF_LIFE_S, max_tracked: int = MAX_TRACKED) -> None:
        self._rate = math.log(2) / half_life
        self._max = max_tracked
        self._heat: dict[int, _Heat] = {}

    def _decayed(self, h: _Heat, now: float) -> float:
        return h.count * math.exp(-self._rate * (now - h.at))

    def observe(self, key: int, now: float) -> None:
        h = self._heat.get(key)
        if h is None:
            if len(self._heat) >= self._max:
                self._prune(now)
            self._heat[key] = _Heat(1.0, now)
            return
        h.count = self._decayed(h, now) + 1.0
        h.at = now

    def rate(self, key: int, now: float) -> float:
        """A steady stream of r requests a second holds a decayed count of r / (ln 2 /
        half-life), so the count times that is the rate."""
        h = self._heat.get(key)
        return self._decayed(h, now) * self._rate if h is not None else 0.0

    def _prune(self, now: float) -> None:
        ranked = sorted(self._heat.items(), key=lambda kv: self._decayed(kv[1], now))
        for key, _ in ranked[: len(ranked) // 4 or 1]:
            del self._heat[key]

    def __len__(self) -> int:
        return len(self._heat)


def wants_another_owner(rate: float, owners: int, replicate_rate: float, max_owners: int) -> bool:
    """One more owner for every `replicate_rate` requests a second, up to `max_owners` (0: no
    cap; past the cap the index records no more owners, so copies would be made in vain)."""
    if not replicate_rate or (max_owners and owners >= max_owners):
        return False
    return rate > owners * replicate_rate
