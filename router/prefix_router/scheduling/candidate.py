"""What the scheduling pipeline works on: candidates, the request as scored, the decision."""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass(slots=True)
class Candidate:
    """One backend that may take the request, with what the router knows of it now."""

    name: str
    in_flight: float = 0.0  # requests in flight there, from every source the router knows of
    pending_prefill: float = 0.0  # prompt tokens dispatched there whose prefill has not ended
    matched_blocks: int = 0  # leading blocks of this request's prefix the index says it holds
    # prefill its lower KV tiers (CPU) save after those, in blocks, at their load cost
    tier_blocks: float = 0.0
    occupancy: float = 0.0  # share of its KV capacity the index thinks is in use (0..1)
    tail_age: float = math.inf  # seconds since its coldest cached block was used, if full
    score: float = 0.0  # the scorers' sum, in prefill tokens (higher is better)


@dataclass(slots=True)
class Ask:
    """The request as the scorers and the picker see it."""

    key: int  # identity of the prefix (its first block's hash): rendezvous tie-breaks
    prompt_blocks: int = 0  # full blocks in the prompt
    best_match: int = 0  # the most leading blocks any candidate holds
    now: float = 0.0  # the scheduler's clock, for scorers that read a rhythm
    session: int | None = None  # the client's named session (sessions.py key), if any


@dataclass(slots=True)
class Decision:
    backend: str
    # hit | miss | replicated | overflow (prefix-aware profiles) | balanced (the others)
    reason: str
    matched_blocks: int
    order: list[str] = field(default_factory=list)  # fallbacks for retries, best first
