"""The recovery figure of `python -m bench fault` (pure arithmetic on the sampled series)."""

from bench.fault import recovery_seconds


def test_recovery_is_measured_from_the_restart_to_the_level_before_the_kill() -> None:
    series = [(5, 0.2), (10, 0.8), (20, 0.8), (30, 0.8), (45, 0.3), (65, 0.5), (70, 0.75)]
    # level = 0.9 * 0.8 = 0.72: reached at 70 s, 10 s after the restart at 60 s
    assert recovery_seconds(series, kill_at=40, restart_at=60) == 10


def test_no_recovery_and_no_baseline_are_reported_as_none() -> None:
    assert recovery_seconds([(10, 0.8), (65, 0.1)], kill_at=40, restart_at=60) is None
    assert recovery_seconds([(65, 0.9)], kill_at=40, restart_at=60) is None
