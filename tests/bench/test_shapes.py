"""Rate shapes (bench/harness/shapes.py): the arrivals follow the shape, the same seed gives the
same starts, and no shape leaves the steady Poisson starts exactly as they were."""

from __future__ import annotations

import random

from bench.harness.shapes import Bursts, Ramp
from bench.harness.workloads import build, session_starts


def test_a_ramp_goes_linearly_from_start_to_end() -> None:
    r = Ramp(0.1, 1.0)
    assert [round(r.multiple(t, 100.0), 3) for t in (0, 50, 100, 150)] == [0.1, 0.55, 1.0, 1.0]
    assert r.peak == 1.0


def test_bursts_come_every_period_from_the_first_one() -> None:
    b = Bursts(every_s=15.0, burst_s=4.0, factor=4.0, first_s=10.0)
    assert [b.multiple(t, 90.0) for t in (0, 9.9, 10, 13.9, 14, 24.9, 25, 28)] == [
        1.0, 1.0, 4.0, 4.0, 1.0, 1.0, 4.0, 4.0]
    assert b.peak == 4.0


def test_arrivals_follow_the_shape_and_repeat_with_the_seed() -> None:
    wl = build("system-prompts", 4000)
    ramp = session_starts(wl, 20.0, 100.0, 7, Ramp(0.1, 1.0))
    assert ramp == session_starts(wl, 20.0, 100.0, 7, Ramp(0.1, 1.0))
    first, last = (sum(1 for t in ramp if lo <= t < lo + 20) for lo in (0, 80))
    # 20 s at a mean of 0.19 x and of 0.91 x the rate: about 76 and 364
    assert 50 < first < 110 and 310 < last < 420
    b = Bursts(20.0, 5.0, 4.0)
    starts = session_starts(wl, 10.0, 100.0, 7, b)
    inside = sum(1 for t in starts if t % 20.0 < 5.0)
    # 25 s of bursts at 40/s, 75 s at 10/s: about 1,000 and 750
    assert 880 < inside < 1120 and 650 < len(starts) - inside < 850


def test_without_a_shape_the_starts_are_the_steady_poisson_ones() -> None:
    wl = build("system-prompts", 500)
    rng, at, steady = random.Random(7), 0.0, []
    for _ in wl.sessions:
        at += rng.expovariate(10.0)
        if at >= 30.0:
            break
        steady.append(at)
    assert session_starts(wl, 10.0, 30.0, 7) == steady
