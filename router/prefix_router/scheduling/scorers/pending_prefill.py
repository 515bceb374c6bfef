"""Pending prefill: prompt tokens already sent to a backend and not yet prefilled delay this
request's own prefill there. Weighed at `pending_weight` (0.5): a pending prefill delays this
request once, while a miss also costs a new copy of the prefix (bench/results/long-point/)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ...config import RouterSettings
from ..candidate import Ask, Candidate


def build(s: RouterSettings, _signals: object) -> PendingPrefill | None:
    return PendingPrefill(s.pending_weight) if s.pending_weight else None


@dataclass(frozen=True, slots=True)
class PendingPrefill:
    weight: float

    def __call__(self, cands: Sequence[Candidate], ask: Ask) -> list[float]:
        w = self.weight
        return [-w * c.pending_prefill for c in cands]
