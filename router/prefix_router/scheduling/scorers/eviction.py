"""Eviction: the blocks a backend must newly cache push out its coldest ones, and those are
worth more on a backend whose coldest block was used recently (it thrashes) than on one whose
tail sat unused for long. Heat is relative to the hottest tail among the candidates (1 there,
0 for a backend with room), so the cost stays in tokens: new blocks x block size x heat x
`evict_weight`."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ...config import RouterSettings
from ...sizing import Sizing
from ..candidate import Ask, Candidate

if TYPE_CHECKING:
    from . import Signals

# Tail ages this close to zero all count as "as hot as it gets" (a tail just touched).
HEAT_FLOOR_S = 0.5


def build(s: RouterSettings, signals: Signals) -> Eviction | None:
    return Eviction(s.evict_weight, signals.sizing) if s.evict_weight else None


@dataclass(frozen=True, slots=True)
class Eviction:
    weight: float  # of a new block's prefill tokens where the tail is hottest
    sizing: Sizing  # a block's engine tokens, as learned

    def __call__(self, cands: Sequence[Candidate], ask: Ask) -> list[float] | None:
        hottest = min(c.tail_age for c in cands)
        if hottest == math.inf:
            return None  # every backend has room: placing anything evicts nothing
        cost = self.weight * self.sizing.block_tokens
        top = hottest + HEAT_FLOOR_S
        blocks = ask.prompt_blocks
        return [
            -cost * max(blocks - c.matched_blocks, 0) * top / (c.tail_age + HEAT_FLOOR_S)
            if c.tail_age < math.inf
            else 0.0
            for c in cands
        ]
