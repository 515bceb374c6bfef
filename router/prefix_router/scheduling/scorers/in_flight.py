"""In-flight load: each request already running on a backend costs `load_cost_tokens`.

In an engine's batch one more running sequence delays the others little, while moving a
conversation off its owner re-prefills its history: so the cost is small next to a match
(64 tokens a request measured better than 256; bench/results/slack/).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ...config import RouterSettings
from ..candidate import Ask, Candidate


def build(s: RouterSettings, _signals: object) -> InFlight | None:
    return InFlight(s.load_cost_tokens) if s.load_cost_tokens else None


@dataclass(frozen=True, slots=True)
class InFlight:
    cost: float  # prefill tokens a request in flight costs

    def __call__(self, cands: Sequence[Candidate], ask: Ask) -> list[float]:
        cost = self.cost
        return [-cost * c.in_flight for c in cands]
