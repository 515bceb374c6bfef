"""Repeated runs of one point: the medians a table shows, the spreads its verdicts read, the
per-round ratios (bench/harness/stats.py)."""

from __future__ import annotations

import json
from typing import Any

from bench.harness.stats import beats, point_row, round_ratios, spread, tied


def fig(hit: float, p50: float, p99: float, **kw: Any) -> dict[str, Any]:
    return {"engine_hit_rate": hit, "ttft_p50_ms": p50, "ttft_p99_ms": p99, "errors": 0,
            "per_replica_requests": [10, 12], "first_errors": [], "engine_ttft_mean_ms": 60.0,
            "caches_emptied_before": True, **kw}


def aggregate(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The figures of a point of these repeats."""
    return point_row({}, [{**r, "measured_at": "t"} for r in runs], {})


def test_medians_of_numbers_lists_element_by_element_and_flags_only_if_all() -> None:
    runs = [fig(0.80, 46.0, 210.0, errors=0, per_replica_requests=[10, 14], first_errors=[]),
            fig(0.78, 50.0, 260.0, errors=2, per_replica_requests=[12, 12], first_errors=["b"],
                caches_emptied_before=False),
            fig(0.81, 44.0, 230.0, errors=1, per_replica_requests=[11, 13], first_errors=["a"])]
    a = aggregate(runs)
    assert (a["engine_hit_rate"], a["ttft_p50_ms"], a["ttft_p99_ms"]) == (0.80, 46.0, 230.0)
    assert a["errors"] == 1 and isinstance(a["errors"], int)
    assert a["per_replica_requests"] == [11, 13]
    assert a["first_errors"] == ["a", "b"]
    assert a["caches_emptied_before"] is False


def test_an_even_count_takes_the_middle_twos_mean_and_a_missing_value_is_left_out() -> None:
    a = aggregate([fig(0.5, 40.0, 100.0, engine_ttft_mean_ms=None, errors=1),
                   fig(0.7, 60.0, 300.0, engine_ttft_mean_ms=80.0, errors=2)])
    assert (a["engine_hit_rate"], a["ttft_p99_ms"], a["errors"]) == (0.6, 200.0, 1.5)
    assert a["engine_ttft_mean_ms"] == 80.0
    assert aggregate([fig(0.5, 40.0, 100.0, x=None), fig(0.7, 60.0, 300.0, x=None)])["x"] is None


def test_a_point_keeps_its_rounds_and_reads_its_spread_from_them() -> None:
    runs = [{**fig(h, p, 4 * p), "measured_at": f"12:0{i}"}
            for i, (h, p) in enumerate(((0.83, 47.0), (0.84, 44.0), (0.82, 45.0)))]
    row = point_row({"workload": "system-prompts", "router": "prefix"}, runs,
                    {"command": "c", "machine": "m", "version": "v"})
    assert row["repeats"] == 3 and len(row["runs"]) == 3
    assert row["ttft_p50_ms"] == 45.0 and spread(row, "ttft_p50_ms") == (44.0, 47.0)
    assert spread(row, "engine_hit_rate") == (0.82, 0.84)
    assert row["measured_at"] == "12:02" and row["command"] == "c"
    json.dumps(row)
    one = point_row({"router": "prefix"}, runs[:1], {"command": "c"})
    assert "runs" not in one and "repeats" not in one and spread(one, "ttft_p50_ms") == (47.0,) * 2


def test_overlapping_spreads_tie_disjoint_ones_beat() -> None:
    def pt(hits: list[float]) -> dict[str, Any]:
        runs = [{"engine_hit_rate": h} for h in hits]
        return {"engine_hit_rate": sorted(hits)[len(hits) // 2], "repeats": len(hits),
                "runs": runs}

    a, b, c = pt([0.79, 0.80, 0.81]), pt([0.80, 0.805, 0.82]), pt([0.44, 0.45, 0.46])
    assert tied(a, b, "engine_hit_rate") and not beats(b, a, "engine_hit_rate", True)
    assert beats(a, c, "engine_hit_rate", True) and not tied(a, c, "engine_hit_rate")
    # single runs: a plain comparison, equal values are not called a tie
    e, f = {"x": 0.8}, {"x": 0.8}
    assert not tied(e, f, "x") and not beats(e, f, "x", True)


def test_per_round_ratios_pair_round_i_with_round_i() -> None:
    a = {"x": 45.0, "runs": [{"x": 44.0}, {"x": 47.0}, {"x": 45.0}]}
    b = {"x": 198.0, "runs": [{"x": 200.0}, {"x": 196.0}, {"x": 198.0}]}
    assert [round(r, 3) for r in round_ratios(a, b, "x")] == [0.22, 0.24, 0.227]
