"""Prefix match: the prefill a backend need not compute because it holds the prefix (in its
GPU cache; in a lower tier, such as CPU, less the load: index/tiers.py)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ...config import RouterSettings
from ...sizing import Sizing
from ..candidate import Ask, Candidate

if TYPE_CHECKING:
    from . import Signals


def build(s: RouterSettings, signals: Signals) -> PrefixMatch:
    return PrefixMatch(signals.sizing)


@dataclass(frozen=True, slots=True)
class PrefixMatch:
    sizing: Sizing  # a block's engine tokens, as learned

    def __call__(self, cands: Sequence[Candidate], ask: Ask) -> list[float] | None:
        if not ask.best_match and not any(c.tier_blocks for c in cands):
            return None
        b = self.sizing.block_tokens
        return [(c.matched_blocks + c.tier_blocks) * b for c in cands]
