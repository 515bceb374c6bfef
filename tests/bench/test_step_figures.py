"""The figures of one step (bench/harness/figures.py): the client's of the requests it sent,
the engines' from counter deltas between snapshots; and the timeline's figures (scale-out,
Redis fault) from the windows sampled."""

from __future__ import annotations

from typing import Any

from bench.harness.figures import (
    after_join,
    carried,
    recovery_seconds,
    router_figures,
    step_figures,
    time_to_share,
)
from bench.harness.loadgen import Result, RunLog


def _res(ttft: float | None, ok: bool = True) -> Result:
    return Result(0, 0, 100.0, ttft, 1.0 if ok else None, ok, 10, None, "" if ok else "boom")


def _snap(t: float, requests: list[int], prompt: int, cached: int, gen: int,
          ttfts: list[float], waiting: int = 0) -> dict[str, Any]:
    stats = [{"requests": r, "prompt_tokens": 0, "cached_tokens": 0, "generation_tokens": 0,
              "waiting": 0, "ttft_s": []} for r in requests]
    stats[0].update(prompt_tokens=prompt, cached_tokens=cached, generation_tokens=gen,
                    ttft_s=ttfts, waiting=waiting)
    return {"t": t, "stats": stats}


def test_client_figures_of_the_steps_requests_engine_figures_from_the_deltas() -> None:
    log = RunLog()
    log.sent = [[{"role": "user", "content": "x"}]] * 5  # 5 sent, 4 answered, 1 unfinished
    log.results = [_res(0.1), _res(0.2), _res(0.3), _res(None, ok=False)]
    log.planned, log.started, log.finished = 7, 0.0, 3.0
    before = _snap(10.0, [2, 2], prompt=1000, cached=100, gen=500, ttfts=[0.5, 0.5])
    end = _snap(20.0, [5, 3], prompt=1900, cached=500, gen=2500, ttfts=[0.5, 0.5, 0.1],
                waiting=3)
    after = _snap(25.0, [6, 4], prompt=2000, cached=600, gen=3000,
                  ttfts=[0.5, 0.5, 0.1, 0.3, 0.2])
    f = step_figures(log, before, after, end)
    assert (f["requests_sent"], f["requests_ok"], f["errors"]) == (5, 3, 1)
    assert (f["unfinished"], f["unsent"]) == (1, 2)
    assert f["engine_hit_rate"] == 0.5  # (600 - 100) / (2000 - 1000)
    assert (f["ttft_p50_ms"], f["ttft_p99_ms"]) == (200.0, 300.0)
    assert f["output_tokens_per_s"] == 200.0  # (2500 - 500) / (20 - 10): the step, not the drain
    assert f["per_replica_requests"] == [4, 2] and f["imbalance"] == round(4 / 3, 3)
    assert f["engine_ttft_mean_ms"] == 200.0  # the three new samples: 0.1, 0.3, 0.2
    assert f["engine_ttft_p50_ms"] == 200.0 and f["path_p50_ms"] == 0.0
    assert f["throughput_rps"] == 1.0  # 3 answered over the log's 3 s
    assert f["queued_at_end"] == 3
    assert f["first_errors"] == ["boom"]


def test_a_restarted_engines_counters_from_before_are_added_to_the_new_processs() -> None:
    before = _snap(0.0, [0, 0], 0, 0, 0, [])
    # sim 0 served 5 requests (1,000 prompt tokens, 600 cached, 1 preemption), then restarted
    # and counted 2 (300 tokens, 0 cached) in its new process
    killed = {"requests": 5, "prompt_tokens": 1000, "cached_tokens": 600, "generation_tokens": 0,
              "preemptions": 1, "ttft_s": [0.1, 0.2]}
    after = _snap(10.0, [2, 3], prompt=300, cached=0, gen=0, ttfts=[0.3])
    whole = carried(after, 0, killed)
    assert whole["stats"][1] == after["stats"][1] and after["stats"][0]["requests"] == 2
    f = step_figures(RunLog(), before, whole)
    assert f["per_replica_requests"] == [7, 3] and f["engine_hit_rate"] == round(600 / 1300, 4)
    assert f["preemptions"] == 1 and f["engine_ttft_mean_ms"] == 200.0  # 0.1, 0.2, 0.3


def test_the_routers_corrections_and_prediction_error_over_the_step() -> None:
    c0 = {'prefix_router_index_corrections_total{direction="over"}': 2.0,
          "prefix_router_cache_prediction_error_tokens_sum": 100.0,
          "prefix_router_cache_prediction_error_tokens_count": 10.0}
    c1 = {'prefix_router_index_corrections_total{direction="over"}': 7.0,
          'prefix_router_index_corrections_total{direction="under"}': 1.0,
          "prefix_router_cache_prediction_error_tokens_sum": 1700.0,
          "prefix_router_cache_prediction_error_tokens_count": 20.0}
    f = router_figures({"counters": c1, "decisions": {}}, {"counters": c0, "decisions": {}},
                       10, None)
    assert (f["index_corrections_over"], f["index_corrections_under"]) == (5, 1)
    assert f["prediction_error_mean_tokens"] == 160.0  # 1,600 tokens over 10 answers


def test_a_step_with_nothing_sent() -> None:
    s = _snap(0.0, [0, 0], 0, 0, 0, [])
    f = step_figures(RunLog(), s, s)
    assert f["engine_hit_rate"] == 0.0 and f["output_tokens_per_s"] == 0.0
    assert f["ttft_p50_ms"] is None and f["engine_ttft_mean_ms"] is None


def w(t: float, share: float = 0.0, hit: float = 0.5, ttft: float | None = 100.0) -> dict:
    return {"t": t, "new_share": share, "hit_rate": hit, "ttft_p50_ms": ttft}


def test_time_to_share_counts_from_the_join_and_ignores_windows_before_it() -> None:
    series = [w(25, 0.9), w(35, 0.1), w(40, 0.3), w(45, 0.45), w(50, 0.5)]
    assert time_to_share(series, 30.0, 0.40) == 15.0
    assert time_to_share(series, 30.0, 0.60) is None


def test_after_join_averages_only_the_windows_in_the_span() -> None:
    series = [w(30, 0.0, 0.9), w(35, 0.2, 0.6, 200.0), w(40, 0.4, 0.8, None), w(70, 1.0, 0.0)]
    assert after_join(series, 30.0, 10.0) == {"after_join_hit_rate": 0.7,
                                              "after_join_new_share": 0.3,
                                              "after_join_ttft_p50_ms": 200.0}
    assert after_join(series, 100.0, 10.0) == {}


def test_recovery_is_measured_from_the_restart_to_the_level_before_the_kill() -> None:
    series = [w(t, hit=h) for t, h in ((5, 0.2), (10, 0.8), (20, 0.8), (30, 0.8), (45, 0.3),
                                       (65, 0.5), (70, 0.75))]
    # level = 0.9 * 0.8 = 0.72: reached at 70 s, 10 s after the restart at 60 s
    assert recovery_seconds(series, 40, 60) == 10
    assert recovery_seconds([w(10, hit=0.8), w(65, hit=0.1)], 40, 60) is None
    assert recovery_seconds([w(65, hit=0.9)], 40, 60) is None  # nothing before the kill
