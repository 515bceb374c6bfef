"""The routing policies, each a profile: filters -> scorers -> picker. Registered by name.

prefix (ours): among the backends within the load bound (at most max(ceil((1 + eps) x mean),
  mean + slack) in flight after this request), the one with the highest sum of scores in
  prefill tokens: the match it holds, minus its in-flight load, pending prefill, the eviction
  a new prefix would cause and, among the match's holders, the wait for its engine step.
least-loaded: fewest in flight, then least pending prefill, then at random.
round-robin: each backend in turn. random: uniformly at random.
chwbl: consistent hashing with bounded loads on the prompt's first 100 bytes, as KubeAI does:
  walk the ring from the prompt's point to the first backend within ceil((1 + eps) x mean).
"""

from __future__ import annotations

import bisect
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import xxhash

from ..config import RouterSettings
from .candidate import Ask, Candidate, Decision
from .filters import load_limit, within_load
from .picker import max_score, ring_walk
from .scorers import Signals, build_all, score

_xxh = xxhash.xxh3_64_intdigest

# chwbl hashes this many leading bytes of the prompt (KubeAI's default prefix length is 100
# characters).
CHWBL_PREFIX_BYTES = 100

Choose = Callable[[list[Candidate], Ask], Decision]


@dataclass(frozen=True, slots=True)
class Profile:
    choose: Choose
    uses_index: bool  # whether its candidates need the prefix index's matches
    key_bytes: int = 0  # >0: Ask.key hashes this many leading prompt bytes (chwbl)


def _prefix(s: RouterSettings, signals: Signals, rng: random.Random) -> Profile:
    scorers = build_all(s, signals)
    eps, slack = s.load_bound, s.load_slack

    def choose(cands: list[Candidate], ask: Ask) -> Decision:
        score(cands, ask, scorers)
        within, held = within_load(cands, eps, slack)
        return max_score(within, held, ask)

    return Profile(choose, uses_index=True)


def _least_loaded(s: RouterSettings, signals: Signals, rng: random.Random) -> Profile:
    def choose(cands: list[Candidate], ask: Ask) -> Decision:
        ranked = sorted(cands, key=lambda c: (c.in_flight, c.pending_prefill, rng.random()))
        return Decision(ranked[0].name, "balanced", 0, [c.name for c in ranked[1:]])

    return Profile(choose, uses_index=False)


def _random(s: RouterSettings, signals: Signals, rng: random.Random) -> Profile:
    def choose(cands: list[Candidate], ask: Ask) -> Decision:
        order = [c.name for c in cands]
        rng.shuffle(order)
        return Decision(order[0], "balanced", 0, order[1:])

    return Profile(choose, uses_index=False)


def _round_robin(s: RouterSettings, signals: Signals, rng: random.Random) -> Profile:
    turn = 0

    def choose(cands: list[Candidate], ask: Ask) -> Decision:
        nonlocal turn
        names = sorted(c.name for c in cands)
        i = turn % len(names)
        turn += 1
        order = names[i:] + names[:i]
        return Decision(order[0], "balanced", 0, order[1:])

    return Profile(choose, uses_index=False)


def _chwbl(s: RouterSettings, signals: Signals, rng: random.Random) -> Profile:
    ring = HashRing()
    eps = s.chwbl_load_bound

    def choose(cands: list[Candidate], ask: Ask) -> Decision:
        ring.update([c.name for c in cands])
        return ring_walk(cands, ring.walk(ask.key), load_limit(cands, eps))

    return Profile(choose, uses_index=False, key_bytes=CHWBL_PREFIX_BYTES)


PROFILES: dict[str, Callable[[RouterSettings, Signals, random.Random], Profile]] = {
    "prefix": _prefix,
    "least-loaded": _least_loaded,
    "round-robin": _round_robin,
    "random": _random,
    "chwbl": _chwbl,
}


class HashRing:
    """Consistent-hash ring with virtual nodes, for chwbl."""

    def __init__(self, vnodes: int = 100) -> None:
        self._vnodes = vnodes
        self._members: tuple[str, ...] = ()
        self._points: list[int] = []
        self._owners: list[str] = []

    def update(self, names: Sequence[str]) -> None:
        members = tuple(sorted(names))
        if members == self._members:
            return
        pairs = sorted(
            (_xxh(f"{name}#{v}".encode()), name) for name in members for v in range(self._vnodes)
        )
        self._members = members
        self._points = [p for p, _ in pairs]
        self._owners = [n for _, n in pairs]

    def walk(self, key: int) -> list[str]:
        """Distinct members in ring order starting at `key`."""
        if not self._points:
            return []
        start = bisect.bisect(self._points, key) % len(self._points)
        seen: list[str] = []
        n = len(self._points)
        for i in range(n):
            name = self._owners[(start + i) % n]
            if name not in seen:
                seen.append(name)
                if len(seen) == len(self._members):
                    break
        return seen
