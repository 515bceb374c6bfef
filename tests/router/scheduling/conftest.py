"""Run the `prefix` profile on hand-made candidates: the pipeline as the scheduler runs it,
with settings given per test (defaults with every optional term off, so a test names what it
relies on)."""

from __future__ import annotations

import random
from typing import Any

from prefix_router.config import RouterSettings
from prefix_router.scheduling import Ask, Candidate, Decision
from prefix_router.scheduling.profiles import PROFILES
from prefix_router.scheduling.scorers import Signals

OFF: dict[str, Any] = {
    "load_bound": 0.25,
    "load_slack": 0.0,
    "load_cost_tokens": 256.0,
    "pending_weight": 1.0,
    "evict_weight": 0.0,
    "step_wait_tokens_per_ms": 0.0,
    "session_weight_tokens": 0.0,
}


def settings(**changes: Any) -> RouterSettings:
    return RouterSettings(**{**OFF, **changes})


def choose(
    cands: list[Candidate],
    *,
    key: int = 7,
    prompt_blocks: int = 0,
    signals: Signals | None = None,
    now: float = 0.0,
    policy: str = "prefix",
    **changes: Any,
) -> Decision:
    s = settings(policy=policy, **changes)
    profile = PROFILES[policy](s, signals or Signals(), random.Random(0))
    best = max((c.matched_blocks for c in cands), default=0)
    return profile.choose(list(cands), Ask(key, prompt_blocks, best, now))
