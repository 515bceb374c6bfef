"""Routing policies: candidates -> filter (bounded load) -> score -> pick. Pure functions.

`prefix` (ours) picks the backend that maximises expected prefill saved minus a load cost, among
backends under the bounded-load limit. Baselines for comparison: round-robin, random,
least-loaded, and chwbl (consistent hashing with bounded loads on the prompt's first bytes, as
KubeAI routes).
"""

from __future__ import annotations

import bisect
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

import xxhash

_xxh = xxhash.xxh3_64_intdigest

# Tail ages this close to zero all count as "as hot as it gets" (a tail just touched).
_HEAT_FLOOR_S = 0.5


@dataclass(slots=True)
class Candidate:
    name: str
    inflight: float = 0.0  # requests in flight on this backend, from every source we know of
    pending_prefill: float = 0.0  # prompt tokens dispatched whose prefill has not finished
    matched_blocks: int = 0  # leading prefix blocks the table says this backend holds
    occupancy: float = 0.0  # share of its KV capacity the table thinks is in use (0..1)
    tail_age: float = math.inf  # seconds since its coldest cached block was used, if full
    step_wait: float = 0.0  # seconds until its current engine step should end (steps.py)


@dataclass(slots=True)
class Decision:
    backend: str
    reason: str  # hit | miss | replicated | overflow | balanced | warm (a hand-over, warm.py)
    matched_blocks: int
    order: list[str] = field(default_factory=list)  # fallbacks for retries, best first


def load_limit(cands: Sequence[Candidate], eps: float, slack: float = 0.0) -> float:
    """Most in-flight requests a backend may hold after taking this one.

    ceil((1 + eps) * mean), the mean counting this request: the bound of consistent hashing
    with bounded loads (Mirrokni et al.), which never excludes every backend. `slack` is an
    absolute floor above the mean (as the anchors' absolute imbalance threshold): at low load
    a relative bound alone is a handful of requests, and copying a hot prefix costs more than
    the few extra decoding sequences it would spare its owner.
    """
    total = sum(c.inflight for c in cands) + 1.0
    mean = total / len(cands)
    return max(math.ceil((1.0 + eps) * mean), math.ceil(mean + slack))


def tiebreak(key: int, name: str) -> int:
    """Rendezvous weight: spreads ties by prefix, not by a fixed backend order."""
    return _xxh(name.encode(), key & 0xFFFFFFFFFFFFFFFF)


def choose_prefix(
    cands: Sequence[Candidate],
    *,
    block_tokens: int,
    eps: float,
    load_cost_tokens: float,
    key: int,
    pending_weight: float = 1.0,
    prompt_blocks: int = 0,
    evict_weight: float = 0.0,
    load_slack: float = 0.0,
    wait_tokens_per_s: float = 0.0,
    spread: bool = False,
) -> Decision:
    if not cands:
        raise ValueError("no candidates")
    limit = load_limit(cands, eps, load_slack)
    best_match = max(c.matched_blocks for c in cands)
    # Eviction cost: the blocks a backend must newly cache push out its coldest ones, and
    # those are worth more on a backend whose coldest block was used recently (it thrashes)
    # than on one whose tail has sat unused for long. Heat is relative to the hottest tail
    # among the candidates (1 there, 0 for a backend with room), so the cost is in tokens.
    coldest_hot = min(c.tail_age for c in cands) if evict_weight else math.inf
    evict = evict_weight * block_tokens if coldest_hot < math.inf else 0.0
    # The step wait is a one-off saving of milliseconds. Where a prefix nobody holds is placed
    # decides where all its later requests go, so that is left to load and eviction alone:
    # with the wait, misses followed the step phase and the busiest replica served 1.325 x the
    # mean in two of three suite rounds (bench/results/routing, 2026-12-04 20:21).
    if best_match == 0:
        wait_tokens_per_s = 0.0
    # The wait only chooses among the backends that hold the whole match, relative to the
    # soonest of them: it never moves a request off its prefix's owners. Counted against a
    # non-owner too, a long step on the owner (seconds of chunked prefill under overload)
    # outweighed thousands of matched tokens: customers at 24 req/s lost hit rate (0.825 ->
    # 0.794) when the weight went from 12.6 to 30.
    soonest = (
        min(c.step_wait for c in cands if c.matched_blocks == best_match)
        if wait_tokens_per_s
        else 0.0
    )

    def rank(c: Candidate) -> tuple[float, float, float, int]:
        score = (
            c.matched_blocks * block_tokens
            - pending_weight * c.pending_prefill
            - load_cost_tokens * c.inflight
        )
        if c.matched_blocks == best_match:
            score -= wait_tokens_per_s * (c.step_wait - soonest)
        if evict and c.tail_age < math.inf:
            heat = (coldest_hot + _HEAT_FLOOR_S) / (c.tail_age + _HEAT_FLOOR_S)
            score -= evict * max(prompt_blocks - c.matched_blocks, 0) * heat
        # Ties: fewer in flight, then the emptier cache (a new prefix there evicts less that
        # is still wanted), then a hash of the prefix so ties spread instead of piling up.
        return (score, -c.inflight, -round(c.occupancy, 2), tiebreak(key, c.name))

    allowed = [c for c in cands if c.inflight + 1 <= limit]
    held = [c for c in cands if c.inflight + 1 > limit]
    allowed.sort(key=rank, reverse=True)
    held.sort(key=rank, reverse=True)
    # The prefix's demand wants one more owner (routing.py): the best backend within bounds
    # that does not hold all of it takes this request and becomes one. More owners give later
    # requests a choice of engine step (step_wait) and of load.
    grow = (
        next((c for c in allowed if c.matched_blocks < best_match), None)
        if spread and best_match
        else None
    )
    if grow is not None:
        allowed.remove(grow)
        allowed.insert(0, grow)
    chosen = allowed[0] if allowed else held[0]
    order = [c.name for c in allowed[1:]] + [c.name for c in held]
    if grow is not None:
        reason = "replicated"
    elif best_match == 0:
        reason = "miss"
    elif chosen.matched_blocks == best_match:
        reason = "hit"
    elif any(c.matched_blocks == best_match for c in held):
        # The owner is full: this backend becomes one more owner of the hot prefix.
        reason = "replicated"
    else:
        # an owner was within bounds but too loaded to be worth it: the request overflows
        # its prefix's owners (and its new home becomes one more owner)
        reason = "overflow"
    return Decision(chosen.name, reason, chosen.matched_blocks, order)


def choose_least_loaded(cands: Sequence[Candidate], rng: random.Random) -> Decision:
    ranked = sorted(cands, key=lambda c: (c.inflight, c.pending_prefill, rng.random()))
    return Decision(
        ranked[0].name, "balanced", ranked[0].matched_blocks, [c.name for c in ranked[1:]]
    )


def choose_random(cands: Sequence[Candidate], rng: random.Random) -> Decision:
    order = [c.name for c in cands]
    rng.shuffle(order)
    return Decision(order[0], "balanced", 0, order[1:])


class RoundRobin:
    def __init__(self) -> None:
        self._next = 0

    def choose(self, cands: Sequence[Candidate]) -> Decision:
        names = sorted(c.name for c in cands)
        i = self._next % len(names)
        self._next += 1
        order = names[i:] + names[:i]
        return Decision(order[0], "balanced", 0, order[1:])


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


def choose_chwbl(cands: Sequence[Candidate], ring: HashRing, key: int, eps: float) -> Decision:
    by_name = {c.name: c for c in cands}
    ring.update(list(by_name))
    limit = load_limit(cands, eps)
    walk = ring.walk(key)
    for i, name in enumerate(walk):
        if by_name[name].inflight + 1 <= limit:
            reason = "hit" if i == 0 else "overflow"
            return Decision(name, reason, 0, walk[i + 1 :] + walk[:i])
    return Decision(walk[0], "overflow", 0, walk[1:])
