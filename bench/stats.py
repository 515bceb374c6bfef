"""Figures of a run: percentiles, hit rates, imbalance. Pure."""

from __future__ import annotations

import math
from collections.abc import Sequence


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100); None for no data."""
    if not values:
        return None
    s = sorted(values)
    k = max(0, min(len(s) - 1, math.ceil(q / 100.0 * len(s)) - 1))
    return s[k]


def imbalance(counts: Sequence[float]) -> float | None:
    """max / mean of per-replica requests served."""
    if not counts or sum(counts) == 0:
        return None
    mean = sum(counts) / len(counts)
    return max(counts) / mean


def ms(x: float | None) -> float | None:
    return None if x is None else round(x * 1000.0, 2)


def percentiles_ms(values: Sequence[float], name: str = "ttft") -> dict[str, float | None]:
    """`<name>_p50_ms`, `<name>_p90_ms`, `<name>_p99_ms` of `values` (seconds)."""
    return {f"{name}_p{q}_ms": ms(percentile(values, q)) for q in (50, 90, 99)}


def histogram_sum_count(text: str, name: str) -> tuple[float, float]:
    """(sum, count) of the Prometheus histogram `name` in exposition `text` (unlabelled)."""
    total = count = 0.0
    for line in text.splitlines():
        if line.startswith(name + "_sum"):
            total = float(line.rsplit(" ", 1)[1])
        elif line.startswith(name + "_count"):
            count = float(line.rsplit(" ", 1)[1])
    return total, count
