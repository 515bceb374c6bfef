"""Pickers: from scored candidates to a decision, and the decision's reason, in one place."""

from __future__ import annotations

from collections.abc import Sequence

import xxhash

from .candidate import Ask, Candidate, Decision

_xxh = xxhash.xxh3_64_intdigest


def rendezvous(key: int, name: str) -> int:
    """Rendezvous weight: spreads ties by prefix, not by a fixed backend order."""
    return _xxh(name.encode(), key & 0xFFFFFFFFFFFFFFFF)


def reason(matched: int, best_match: int, owner_held: bool) -> str:
    """Why the request went to a backend holding `matched` leading blocks, for a profile that
    knows prefixes (the others' decisions are all `balanced`).

    hit: to a backend holding the longest match. miss: nobody holds any of it. replicated:
    the prefix gets one more owner because its owners are over the load bound. overflow: an
    owner was within the bound but too loaded to be worth it.
    """
    if best_match == 0:
        return "miss"
    if matched == best_match:
        return "hit"
    return "replicated" if owner_held else "overflow"


def max_score(within: list[Candidate], held: list[Candidate], ask: Ask) -> Decision:
    """The highest score within the load bound, then those held back, for retries.

    Ties: fewer in flight, then the emptier cache (a new prefix there evicts less that is
    still wanted), then a rendezvous hash of the prefix, so ties spread instead of piling up.
    """
    key = ask.key

    def rank(c: Candidate) -> tuple[float, float, float, int]:
        return (c.score, -c.in_flight, -round(c.occupancy, 2), rendezvous(key, c.name))

    within.sort(key=rank, reverse=True)
    held.sort(key=rank, reverse=True)
    best = ask.best_match
    chosen = within[0] if within else held[0]
    order = [c.name for c in within[1:]] + [c.name for c in held]
    owner_held = any(c.matched_blocks == best for c in held)
    why = reason(chosen.matched_blocks, best, owner_held)
    return Decision(chosen.name, why, chosen.matched_blocks, order)


def ring_walk(cands: Sequence[Candidate], walk: Sequence[str], limit: float) -> Decision:
    """The first backend along a consistent-hash walk within the load bound (chwbl)."""
    by_name = {c.name: c for c in cands}
    i = next((i for i, n in enumerate(walk) if by_name[n].in_flight + 1 <= limit), 0)
    chosen = by_name[walk[i]]
    # chwbl's "owner" is the ring's first backend for the prompt's head
    why = reason(1 if i == 0 else 0, 1, False)
    return Decision(chosen.name, why, 0, list(walk[i + 1 :]) + list(walk[:i]))
