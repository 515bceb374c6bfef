"""Prefix match: the prefill a backend need not compute because it holds the prefix (in its
GPU cache; in a lower tier, such as CPU, less the load: index/tiers.py)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ...config import RouterSettings
from ..candidate import Ask, Candidate


def build(s: RouterSettings, _signals: object) -> PrefixMatch:
    return PrefixMatch(s.block_size)


@dataclass(frozen=True, slots=True)
class PrefixMatch:
    block_tokens: int

    def __call__(self, cands: Sequence[Candidate], ask: Ask) -> list[float] | None:
        if not ask.best_match and not any(c.tier_blocks for c in cands):
            return None
        b = self.block_tokens
        return [(c.matched_blocks + c.tier_blocks) * b for c in cands]
