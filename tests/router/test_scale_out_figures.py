"""The scale-out bench's figures (bench/scale_out.py), pure."""

from bench.scale_out import after_join, time_to_share


def w(t: float, share: float, hit: float = 0.5, ttft: float | None = 100.0) -> dict:
    return {"t": t, "new_share": share, "hit_rate": hit, "ttft_p50_ms": ttft}


def test_time_to_share_counts_from_the_join_and_ignores_windows_before_it() -> None:
    series = [w(25, 0.9), w(35, 0.1), w(40, 0.3), w(45, 0.45), w(50, 0.5)]
    assert time_to_share(series, 30.0, 0.40) == 15.0
    assert time_to_share(series, 30.0, 0.60) is None


def test_after_join_averages_only_the_windows_in_the_span() -> None:
    series = [w(30, 0.0, 0.9), w(35, 0.2, 0.6, 200.0), w(40, 0.4, 0.8, None), w(70, 1.0, 0.0)]
    got = after_join(series, 30.0, 10.0)
    assert got == {"hit_rate": 0.7, "new_share": 0.3, "ttft_p50_ms": 200.0}
    assert after_join(series, 100.0, 10.0) == {}
