"""Figures of a run (percentiles, imbalance) and of a point's repeats (medians, spreads). Pure."""

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100); None for no data."""
    if not values:
        return None
    s = sorted(values)
    return s[max(0, min(len(s) - 1, math.ceil(q / 100.0 * len(s)) - 1))]


def imbalance(counts: Sequence[float]) -> float | None:
    """max / mean of per-replica requests served."""
    return max(counts) / (sum(counts) / len(counts)) if counts and sum(counts) else None


def ms(x: float | None) -> float | None:
    return None if x is None else round(x * 1000.0, 2)


def percentiles_ms(values: Sequence[float], name: str = "ttft") -> dict[str, float | None]:
    return {f"{name}_p{q}_ms": ms(percentile(values, q)) for q in (50, 90, 99)}


def ratio(a: float | None, b: float | None, digits: int = 4) -> float | None:
    return round(a / b, digits) if a is not None and b else None


def _median(vals: Sequence[Any]) -> float | int:
    m = statistics.median(vals)
    return int(m) if all(isinstance(v, int) for v in vals) and m == int(m) else round(m, 4)


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def merge(vals: Sequence[Any]) -> Any:
    """One field over the repeats: numbers by their median (a repeat without one left out),
    flags true only if true in all, lists of numbers element-wise, of strings joined (first 3),
    mappings key by key, anything else the first repeat's."""
    present = [v for v in vals if v is not None]
    if not present:
        return None
    if all(isinstance(v, dict) for v in present):
        return {k: merge([v.get(k) for v in present]) for k in present[0]}
    if all(_number(v) for v in present):
        return _median(present)
    if all(isinstance(v, bool) for v in present):
        return all(present)
    if all(isinstance(v, list) for v in present):
        if all(isinstance(x, str) for v in present for x in v):
            return sorted({x for v in present for x in v})[:3]
        if len({len(v) for v in present}) == 1 and all(_number(x) for v in present for x in v):
            return [_median(col) for col in zip(*present, strict=True)]
    return vals[0]


def point_row(head: Mapping[str, Any], runs: Sequence[Mapping[str, Any]],
              stamp: Mapping[str, Any]) -> dict[str, Any]:
    """One point's JSON: `head`, each figure merged over `runs` (its repeats), `stamp`; with
    more than one repeat, `repeats` and the repeats themselves under `runs`."""
    figs = [{k: v for k, v in r.items() if k not in ("repeat", "measured_at")} for r in runs]
    merged = {k: merge([f.get(k) for f in figs]) for k in figs[0]} if len(figs) > 1 else figs[0]
    row = {**head, **merged, **stamp, "measured_at": runs[-1]["measured_at"]}
    more = {"repeats": len(runs), "runs": [dict(r) for r in runs]} if len(runs) > 1 else {}
    return {**row, **more}


def values(row: Mapping[str, Any], key: str) -> list[float]:
    """`key` in each of the point's repeats (the point's own value when it ran once)."""
    return [v for r in row.get("runs") or [row] if (v := r.get(key)) is not None]


def spread(row: Mapping[str, Any], key: str) -> tuple[float, float] | None:
    """[min, max] of `key` over the point's repeats ([v, v] for one repeat); None if none."""
    vals = values(row, key) or [row[key]] if row.get(key) is not None else []
    return (min(vals), max(vals)) if vals else None


def beats(a: Mapping[str, Any], b: Mapping[str, Any], key: str, high: bool) -> bool:
    """`a` better than `b` on `key` outside both spreads (higher is better if `high`)."""
    sa, sb = spread(a, key), spread(b, key)
    return sa is not None and sb is not None and (sa[0] > sb[1] if high else sa[1] < sb[0])


def tied(a: Mapping[str, Any], b: Mapping[str, Any], key: str) -> bool:
    """The spreads overlap, one of more than one repeat: noise cannot tell them apart."""
    if a.get("repeats", 1) <= 1 and b.get("repeats", 1) <= 1:
        return False
    sa, sb = spread(a, key), spread(b, key)
    return sa is not None and sb is not None and sa[0] <= sb[1] and sb[0] <= sa[1]


def round_ratios(a: Mapping[str, Any], b: Mapping[str, Any], key: str) -> list[float]:
    """Round i of `a` over round i of `b` (measured minutes apart, under the same drift)."""
    return [x / y for x, y in zip(values(a, key), values(b, key), strict=False) if y]
