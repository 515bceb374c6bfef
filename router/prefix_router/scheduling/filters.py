"""Filters: which backends may take a request.

Serving and health are hard: a backend that does not serve the model, or is ejected, is no
candidate at all. The load bound is soft: a backend over it is held back, tried only after
every backend within it (a retry must still have somewhere to go).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from ..backends import Backend, BackendSet
from ..errors import RequestError
from .candidate import Candidate


def serving(backends: Sequence[Backend], model: str) -> list[Backend]:
    """The backends that serve `model`; all of them when none says what it serves (or none
    serves it: then the engines answer for themselves)."""
    if not model or not any(b.models for b in backends):
        return list(backends)
    out = [b for b in backends if not b.models or model in b.models]
    return out or list(backends)


def load_limit(cands: Sequence[Candidate], eps: float, slack: float = 0.0) -> float:
    """Most requests a backend may hold in flight after taking this one.

    ceil((1 + eps) x mean), the mean counting this request: the bound of consistent hashing
    with bounded loads (Mirrokni et al.), which never excludes every backend. `slack` is an
    absolute floor above the mean: at low load a relative bound alone is a handful of
    requests, and copying a hot prefix costs more than the few decoding sequences it spares.
    """
    total = sum(c.in_flight for c in cands) + 1.0
    mean = total / len(cands)
    return max(math.ceil((1.0 + eps) * mean), math.ceil(mean + slack))


def within_load(
    cands: Sequence[Candidate], eps: float, slack: float
) -> tuple[list[Candidate], list[Candidate]]:
    """(within the bound, held back)."""
    limit = load_limit(cands, eps, slack)
    within = [c for c in cands if c.in_flight + 1 <= limit]
    held = [c for c in cands if c.in_flight + 1 > limit]
    return within, held


def eligible(backends: BackendSet, models: frozenset[str], model: str) -> list[Backend]:
    """The healthy backends serving `model`: a 404 for a model no backend serves (nor the
    settings name), a 503 with none healthy."""
    served = models or backends.served_models()
    if served and model not in served:
        raise RequestError(
            404, f"The model `{model}` does not exist.", param="model", code="model_not_found"
        )
    healthy = backends.healthy()
    if not healthy:
        raise RequestError(503, "no healthy backend is available", retry_after=1)
    return staying(serving(healthy, model))


def staying(backends: Sequence[Backend]) -> list[Backend]:
    """The backends not leaving: a terminating engine's requests in flight finish there, and
    nothing new is placed on it (all of them while every one is leaving: a rollout's last
    moment still serves)."""
    return [b for b in backends if not b.leaving] or list(backends)
