"""Figures of a run along its timeline, in seconds from the load's start: the fleet's hit rate
between two instants (from samples of the engines' cumulative counters), the requests sent in
a window, an event's window after over the one before, and how long after an event the hit
rate comes back. Pure."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .loadgen import Result
from .stats import ms, percentile, ratio

# (t, prompt tokens, cached tokens): the fleet's counters so far at t, in order of t
Sample = tuple[float, int, int]


def at(samples: Sequence[Sample], t: float) -> Sample:
    """The last sample at or before `t` (the first, if all are later)."""
    best = samples[0]
    for s in samples:
        if s[0] > t:
            break
        best = s
    return best


def hit_rate(samples: Sequence[Sample], start: float, end: float) -> float | None:
    """Cached over prompt tokens the engines counted from `start` to `end` (None if none)."""
    a, b = at(samples, start), at(samples, end)
    return ratio(b[2] - a[2], b[1] - a[1])


def requests(results: Sequence[Result], t0: float, start: float,
             end: float) -> dict[str, Any]:
    """The requests sent in [start, end) (`t0`: the load's start on their clock): count,
    errors, TTFT p50 and p99 of those answered."""
    sent = [r for r in results if start <= r.sent_at - t0 < end]
    ttfts = [r.ttft for r in sent if r.ok and r.ttft is not None]
    return {"requests": len(sent), "errors": sum(not r.ok for r in sent),
            "ttft_p50_ms": ms(percentile(ttfts, 50)), "ttft_p99_ms": ms(percentile(ttfts, 99))}


def window(samples: Sequence[Sample], results: Sequence[Result], t0: float, start: float,
           end: float) -> dict[str, Any]:
    """A window's hit rate and requests."""
    return {"start": round(start, 2), "end": round(end, 2),
            "hit_rate": hit_rate(samples, start, end), **requests(results, t0, start, end)}


def versus(after: Mapping[str, Any], before: Mapping[str, Any]) -> dict[str, float | None]:
    """The window after an event as a ratio of the one before it."""
    return {"hit_ratio": ratio(after["hit_rate"], before["hit_rate"], 3),
            "ttft_p50_ratio": ratio(after["ttft_p50_ms"], before["ttft_p50_ms"], 3),
            "ttft_p99_ratio": ratio(after["ttft_p99_ms"], before["ttft_p99_ms"], 3)}


def recovery_s(samples: Sequence[Sample], event: float, level: float, span: float,
               until: float) -> float | None:
    """Seconds from `event` to the first sample instant r from which the hit rate over the
    next `span` seconds is `level` or more; None if no such window ends by `until`."""
    for t, _, _ in samples:
        if t < event:
            continue
        if t + span > until:
            return None
        h = hit_rate(samples, t, t + span)
        if h is not None and h >= level:
            return round(t - event, 2)
    return None


def first_after(times: Sequence[float | None], event: float) -> float | None:
    """Seconds from `event` to the earliest of `times` at or after it (None: none)."""
    later = [t for t in times if t is not None and t >= event]
    return round(min(later) - event, 3) if later else None


def series(samples: Sequence[Sample], results: Sequence[Result], t0: float,
           step: float) -> list[dict[str, Any]]:
    """The timeline in windows of `step` seconds, each its hit rate and TTFT p50/p99, for
    the plot (`t`: the window's end)."""
    if not samples:
        return []
    out = []
    start = samples[0][0]
    while start + step <= samples[-1][0] + 1e-9:
        w = window(samples, results, t0, start, start + step)
        out.append({"t": round(start + step, 2), "hit_rate": w["hit_rate"],
                    "ttft_p50_ms": w["ttft_p50_ms"], "ttft_p99_ms": w["ttft_p99_ms"]})
        start += step
    return out
