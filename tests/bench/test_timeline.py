"""The lifecycle bench's figures from a timeline (bench/harness/timeline.py): hit rates between
instants from cumulative counters, event windows and their ratios, detection and recovery."""

from __future__ import annotations

import pytest

from bench.harness.loadgen import Result
from bench.harness.timeline import (
    at,
    first_after,
    hit_rate,
    recovery_s,
    requests,
    series,
    versus,
    window,
)


def timeline(rates: list[float], prompt_per_s: int = 1000) -> list[tuple[float, int, int]]:
    """Samples each second of a fleet whose hit rate in second k is rates[k]."""
    out, p, c = [(0.0, 0, 0)], 0, 0
    for k, h in enumerate(rates):
        p += prompt_per_s
        c += round(h * prompt_per_s)
        out.append((float(k + 1), p, c))
    return out


def test_hit_rate_between_two_instants_is_the_counters_difference():
    s = timeline([0.5] * 10 + [1.0] * 10)
    assert hit_rate(s, 0, 10) == 0.5
    assert hit_rate(s, 10, 20) == 1.0
    assert hit_rate(s, 5, 15) == 0.75
    assert at(s, 4.5) == s[4]  # the last sample at or before
    assert at(s, -1) == s[0]
    assert hit_rate(s, 3, 3) is None  # no tokens: no rate


def test_recovery_is_the_first_instant_whose_next_span_is_back_at_the_level():
    # steady 0.8, a reset at t=10, 5 s at 0.2 then 0.8 again
    s = timeline([0.8] * 10 + [0.2] * 5 + [0.8] * 30)
    assert recovery_s(s, 10, 0.78, 5, 45) == 5.0
    # a span reaching into the dip is not back, however short the dip's share
    assert recovery_s(s, 10, 0.78, 10, 45) == 5.0
    # never back within the allowed time: the window from 15 ends after 19
    assert recovery_s(s, 10, 0.78, 5, 19) is None
    assert recovery_s(s, 10, 0.78, 5, 20) == 5.0
    # back at once when the event cost nothing
    assert recovery_s(timeline([0.8] * 40), 10, 0.78, 5, 40) == 0.0


def test_detection_is_the_earliest_time_at_or_after_the_event():
    assert first_after([12.5, None, 11.25, 3.0], 10.0) == 1.25
    assert first_after([None, 3.0], 10.0) is None
    assert first_after([10.0], 10.0) == 0.0  # found by the first look


def _res(sent: float, ttft: float | None, ok: bool = True) -> Result:
    return Result(0, 0, sent, ttft, None, ok, 1, 1)


def test_an_events_window_against_the_one_before():
    s = timeline([0.8] * 10 + [0.4] * 10)
    results = [_res(100 + k, 0.1) for k in range(10)] + [_res(110 + k, 0.3) for k in range(9)]
    results.append(_res(115.5, None, ok=False))
    before, after = (window(s, results, 100, a, b) for a, b in ((0, 10), (10, 20)))
    assert (before["requests"], before["errors"], before["ttft_p50_ms"]) == (10, 0, 100.0)
    assert (after["requests"], after["errors"], after["ttft_p99_ms"]) == (10, 1, 300.0)
    assert versus(after, before) == {"hit_ratio": 0.5, "ttft_p50_ratio": 3.0,
                                     "ttft_p99_ratio": 3.0}
    assert requests(results, 100, 20, 30)["requests"] == 0


def test_series_cuts_the_timeline_into_windows():
    s = timeline([0.2] * 5 + [0.6] * 5)
    got = series(s, [], 0.0, 5.0)
    assert [w["t"] for w in got] == [5.0, 10.0]
    assert [w["hit_rate"] for w in got] == pytest.approx([0.2, 0.6])
