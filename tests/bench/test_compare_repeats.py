"""bench/compare.py `--repeat N`: aggregation of a point's repeats, ties within the spreads,
the table cells, the budget and the command (pure)."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from bench import compare
from bench.compare import (
    aggregate,
    beats,
    budget,
    budget_lines,
    cell,
    command,
    make_plan,
    mode_section,
    point_row,
    points_table,
    repeats_note,
    slices,
    tied,
    unique_verdict,
    verdict,
    verdict_table,
)
from bench.workloads import build


def fig(hit: float, p50: float, p90: float, p99: float, **kw: Any) -> dict[str, Any]:
    """One repeat's figures, shaped as `step_figures` returns them."""
    f = {
        "requests_sent": 100,
        "requests_ok": 100,
        "errors": 0,
        "unfinished": 0,
        "engine_hit_rate": hit,
        "usage_hit_rate": hit,
        "ttft_p50_ms": p50,
        "ttft_p90_ms": p90,
        "ttft_p99_ms": p99,
        "output_tokens_per_s": 2500.0,
        "imbalance": 1.2,
        "per_replica_requests": [10, 12],
        "engine_ttft_mean_ms": 60.0,
        "queued_at_end": 0,
        "first_errors": [],
        "step": 1,
        "window_s": [11.0, 22.0],
    }
    f.update(kw)
    return f


# ---- aggregation ------------------------------------------------------------------------------


def test_aggregate_takes_medians_and_keeps_the_spread_of_the_key_figures() -> None:
    runs = [
        fig(0.80, 46.0, 190.0, 210.0, errors=0, per_replica_requests=[10, 14], first_errors=[]),
        fig(0.78, 50.0, 200.0, 260.0, errors=2, per_replica_requests=[12, 12], first_errors=["b"]),
        fig(0.81, 44.0, 185.0, 230.0, errors=1, per_replica_requests=[11, 13], first_errors=["a"]),
    ]
    a = aggregate(runs)
    assert a["engine_hit_rate"] == 0.80
    assert (a["engine_hit_rate_min"], a["engine_hit_rate_max"]) == (0.78, 0.81)
    assert a["ttft_p50_ms"] == 46.0
    assert (a["ttft_p50_ms_min"], a["ttft_p50_ms_max"]) == (44.0, 50.0)
    assert (a["ttft_p90_ms"], a["ttft_p90_ms_min"], a["ttft_p90_ms_max"]) == (190.0, 185.0, 200.0)
    assert (a["ttft_p99_ms"], a["ttft_p99_ms_min"], a["ttft_p99_ms_max"]) == (230.0, 210.0, 260.0)
    assert a["errors"] == 1 and isinstance(a["errors"], int)
    assert a["per_replica_requests"] == [11, 13]  # element by element
    assert a["first_errors"] == ["a", "b"]
    # the spread only for the key figures; min/max sit right after their median
    assert "output_tokens_per_s_min" not in a and "errors_max" not in a
    keys = list(a)
    assert keys[keys.index("ttft_p99_ms") + 1 : keys.index("ttft_p99_ms") + 3] == [
        "ttft_p99_ms_min",
        "ttft_p99_ms_max",
    ]


def test_aggregate_even_count_missing_values_and_flags() -> None:
    runs = [
        fig(0.5, 40.0, 90.0, 100.0, usage_hit_rate=None, engine_ttft_mean_ms=None, errors=1),
        fig(0.7, 60.0, 110.0, 300.0, usage_hit_rate=None, engine_ttft_mean_ms=80.0, errors=2),
    ]
    runs[0]["caches_emptied_before"] = True
    runs[1]["caches_emptied_before"] = False
    a = aggregate(runs)
    assert a["engine_hit_rate"] == 0.6  # the mean of the middle two
    assert a["ttft_p99_ms"] == 200.0
    assert a["errors"] == 1.5
    assert a["usage_hit_rate"] is None  # none in any repeat
    assert a["engine_ttft_mean_ms"] == 80.0  # a repeat without one is left out
    assert a["caches_emptied_before"] is False  # true only if true in every repeat


def test_aggregate_of_one_repeat_is_that_repeat() -> None:
    one = fig(0.8, 46.0, 190.0, 210.0)
    assert aggregate([one]) == one
    assert "engine_hit_rate_min" not in aggregate([one])


HEAD = {"workload": "system-prompts", "router": "prefix", "kind": "ours", "rate": 16.0}


def _run(f: dict[str, Any], at: str, rep: int | None = None) -> dict[str, Any]:
    return {
        **({"repeat": rep} if rep else {}),
        **f,
        "caches_emptied_before": True,
        "measured_at": at,
    }


def test_point_row_of_one_repeat_looks_as_before_repeats() -> None:
    f = fig(0.8, 46.0, 190.0, 210.0)
    row = point_row(HEAD, [_run(f, "2026-12-03 18:00 UTC")], "cmd", "box")
    # the JSON of a run without --repeat: same keys, same order, nothing added
    before = {
        **HEAD,
        **f,
        "caches_emptied_before": True,
        "command": "cmd",
        "measured_at": "2026-12-03 18:00 UTC",
        "machine": "box",
    }
    assert list(row.items()) == list(before.items())


def test_point_row_of_three_repeats_has_the_runs() -> None:
    runs = [
        _run(fig(0.80, 46.0, 190.0, 210.0), "18:00", 1),
        _run(fig(0.78, 50.0, 200.0, 260.0), "18:10", 2),
        _run(fig(0.81, 44.0, 185.0, 230.0), "18:20", 3),
    ]
    row = point_row(HEAD, runs, "cmd --repeat 3", "box")
    assert row["repeats"] == 3
    assert [r["repeat"] for r in row["runs"]] == [1, 2, 3]
    assert [r["ttft_p99_ms"] for r in row["runs"]] == [210.0, 260.0, 230.0]
    assert row["ttft_p99_ms"] == 230.0 and row["ttft_p99_ms_max"] == 260.0
    assert row["measured_at"] == "18:20"  # when the last repeat ended
    assert "repeat" not in row  # the index belongs to the runs, not the aggregate
    assert row["workload"] == "system-prompts" and row["rate"] == 16.0
    json.dumps(row)  # writable as is


def test_the_same_request_sequence_for_every_repeat() -> None:
    # a staircase takes the same sessions (built from a fixed seed) and the same cuts each time
    a, b = build("system-prompts", 200), build("system-prompts", 200)
    assert [(s.system, [t.user for t in s.turns]) for s in a.sessions] == [
        (s.system, [t.user for t in s.turns]) for s in b.sessions
    ]
    assert slices(1.0, [8.0, 16.0], 11.0) == slices(1.0, [8.0, 16.0], 11.0)


# ---- ties within the spreads ------------------------------------------------------------------


def pt(
    router: str,
    hit: float,
    p99: float,
    lo_hi: tuple[float, float, float, float] | None = None,
    p50: float = 50.0,
    **kw: Any,
) -> dict[str, Any]:
    """A point; `lo_hi` = (hit min, hit max, p99 min, p99 max) of 3 repeats."""
    r: dict[str, Any] = {
        "workload": "system-prompts",
        "rate": 16.0,
        "router": router,
        "engine_hit_rate": hit,
        "ttft_p50_ms": p50,
        "ttft_p99_ms": p99,
        "requests_sent": 100,
        "errors": 0,
        "unfinished": 0,
    }
    if lo_hi is not None:
        r.update(
            repeats=3,
            engine_hit_rate_min=lo_hi[0],
            engine_hit_rate_max=lo_hi[1],
            ttft_p99_ms_min=lo_hi[2],
            ttft_p99_ms_max=lo_hi[3],
            ttft_p50_ms_min=p50 - 2,
            ttft_p50_ms_max=p50 + 3,
        )
    r.update(kw)
    return r


def test_overlapping_spreads_tie_disjoint_do_not() -> None:
    a = pt("prefix", 0.80, 200.0, (0.79, 0.81, 190.0, 230.0))
    b = pt("sglang-cache_aware", 0.805, 210.0, (0.80, 0.82, 220.0, 240.0))
    c = pt("round-robin", 0.45, 900.0, (0.44, 0.46, 850.0, 950.0))
    assert tied(a, b, "engine_hit_rate") and tied(a, b, "ttft_p99_ms")
    assert not beats(b, a, "engine_hit_rate", True)  # a higher median, inside the spread
    assert not tied(a, c, "engine_hit_rate") and not tied(a, c, "ttft_p99_ms")
    assert beats(a, c, "engine_hit_rate", True) and beats(a, c, "ttft_p99_ms", False)
    assert not beats(c, a, "ttft_p99_ms", False)
    # touching ends overlap
    d = pt("chwbl", 0.83, 300.0, (0.81, 0.85, 280.0, 320.0))
    assert tied(a, d, "engine_hit_rate")
    # single repeats: a plain comparison, and equal values are not called a tie
    e, f = pt("prefix", 0.8, 200.0), pt("chwbl", 0.8, 210.0)
    assert not tied(e, f, "engine_hit_rate")
    assert beats(e, f, "ttft_p99_ms", False) and not beats(f, e, "ttft_p99_ms", False)


def test_verdict_calls_a_lead_inside_the_spread_a_tie_not_a_loss() -> None:
    point = [
        pt("prefix", 0.80, 230.0, (0.79, 0.81, 190.0, 260.0)),
        pt("round-robin", 0.45, 900.0, (0.44, 0.46, 850.0, 950.0)),
        pt("sglang-cache_aware", 0.805, 210.0, (0.80, 0.82, 200.0, 240.0)),
    ]
    v = verdict(point)
    assert v["best_hit_ok"] and v["best_p99_ok"]
    assert v["hit_ties"] == ["sglang-cache_aware"] and v["p99_ties"] == ["sglang-cache_aware"]
    assert v["verdict"] == (
        "best on both; hit rate tied with sglang-cache_aware; TTFT p99 tied with sglang-cache_aware"
    )
    assert v["best_hit"] == ("sglang-cache_aware", 0.805)  # the best median is still shown
    # the same medians from one run each: the anchor is ahead on both, as before repeats
    single = [
        {k: x for k, x in r.items() if k != "repeats" and not k.endswith(("_min", "_max"))}
        for r in point
    ]
    assert verdict(single)["verdict"] == (
        "NOT best: hit rate (best sglang-cache_aware), TTFT p99 (best sglang-cache_aware)"
    )


def test_verdict_names_the_router_strictly_better_outside_the_spread() -> None:
    point = [
        pt("prefix", 0.80, 300.0, (0.79, 0.81, 280.0, 320.0)),
        pt("vllm-cache_aware", 0.79, 240.0, (0.78, 0.80, 230.0, 250.0)),  # p99 disjoint: better
        pt("chwbl", 0.70, 290.0, (0.69, 0.71, 270.0, 330.0)),  # p99 tied, hit worse
    ]
    v = verdict(point)
    assert v["best_hit_ok"] is True
    assert v["best_p99_ok"] is False
    assert v["verdict"] == (
        "NOT best: TTFT p99 (best vllm-cache_aware); hit rate tied with vllm-cache_aware; "
        "TTFT p99 tied with chwbl"
    )


def test_unique_verdict_says_when_the_spreads_allow_either() -> None:
    mine = pt("prefix", 0.0, 300.0, (0.0, 0.0, 290.0, 310.0), p50=158.0, workload="unique")
    lb = pt("round-robin", 0.0, 250.0, (0.0, 0.0, 240.0, 260.0), p50=152.0, workload="unique")
    v = unique_verdict([mine, lb])
    # medians 158 / 152 = 1.039 (met); 156 / 155 .. 161 / 150 spans 1.006 .. 1.073
    assert v["verdict"] == "met (the spreads allow either)"
    for r in (mine, lb):
        r["ttft_p50_ms_min"], r["ttft_p50_ms_max"] = r["ttft_p50_ms"], r["ttft_p50_ms"]
    assert unique_verdict([mine, lb])["verdict"] == "met"


# ---- tables -----------------------------------------------------------------------------------


def test_cells_show_median_min_max_only_with_repeats() -> None:
    r3 = pt("prefix", 0.80, 230.0, (0.79, 0.812, 190.0, 260.5), p50=46.0)
    assert cell(r3, "engine_hit_rate") == "0.800 (0.790-0.812)"
    assert cell(r3, "ttft_p99_ms") == "230.0 (190.0-260.5)"
    assert cell(r3, "ttft_p50_ms") == "46.0 (44.0-49.0)"
    assert cell(r3, "errors") == 0  # other figures: the median alone
    r1 = pt("prefix", 0.80, 230.0)
    assert cell(r1, "engine_hit_rate") == 0.80  # rendered by md_table as before


def test_points_and_verdict_tables_with_and_without_repeats() -> None:
    rows3 = [
        pt("prefix", 0.80, 230.0, (0.79, 0.81, 190.0, 260.0)),
        pt("round-robin", 0.45, 900.0, (0.44, 0.46, 850.0, 950.0)),
    ]
    lines = points_table(rows3, "system-prompts").splitlines()
    assert lines[2].startswith(
        "| 16 | prefix | 0.800 (0.790-0.810) | 50.0 (48.0-53.0) | - | 230.0 (190.0-260.0) |"
    )
    vt = verdict_table(rows3, "system-prompts")
    assert (
        "| 16 | prefix | prefix 0.800 | 0.800 (0.790-0.810) | prefix 230.0 | "
        "230.0 (190.0-260.0) | best on both |" in vt
    )
    rows1 = [pt("prefix", 0.80, 230.0), pt("round-robin", 0.45, 900.0)]
    assert (
        points_table(rows1, "system-prompts")
        .splitlines()[2]
        .startswith("| 16 | prefix | 0.800 | 50.0 | - | 230.0 |")
    )
    assert "| 16 | prefix | prefix 0.800 | 0.800 | prefix 230.0 | 230.0 | best on both |" in (
        verdict_table(rows1, "system-prompts")
    )


def test_the_readme_explains_repeats_only_when_there_are_some(tmp_path: Path) -> None:
    assert repeats_note([pt("prefix", 0.8, 200.0)]) == []
    assert repeats_note([]) == []
    note = repeats_note([pt("prefix", 0.8, 200.0, (0.79, 0.81, 190.0, 210.0))])
    assert note[0].startswith("Repeats (`--repeat`): a point with `repeats` in its JSON (3)")
    d = tmp_path / "full"
    d.mkdir()
    (d / "run.json").write_text(
        json.dumps(
            {
                "command": "cmd --repeat 3",
                "measured_at": "now",
                "elapsed_s": 1.0,
                "machine": "box",
                "seconds": 11.0,
                "routers": list(compare.ROUTERS),
                "budget": ["b"],
                "skipped": [],
            }
        )
    )
    for r in (
        pt("prefix", 0.80, 230.0, (0.79, 0.81, 190.0, 260.0), seconds=11.0),
        pt("round-robin", 0.45, 900.0, (0.44, 0.46, 850.0, 950.0), seconds=11.0),
    ):
        (d / f"system-prompts-{r['router']}-16.json").write_text(json.dumps(r))
    text = "\n".join(mode_section(d, "full"))
    assert "(3) ran its staircase that many times" in text
    assert "| 16 | prefix | 0.800 (0.790-0.810) |" in text


# ---- budget and command -----------------------------------------------------------------------


def test_budget_scales_with_repeats_but_not_fleets_or_clients() -> None:
    one = make_plan(quick=False)
    three = dataclasses.replace(one, repeats=3)
    b1, b3 = budget(one), budget(three)
    for part in ("setups", "load", "drains", "settles"):
        assert getattr(b3, part) == pytest.approx(3 * getattr(b1, part)), part
    for part in ("fleets", "clients", "fixed"):
        assert getattr(b3, part) == getattr(b1, part), part
    assert b3.total > 2.5 * b1.total
    assert three.seconds == one.seconds  # the step length stays comparable
    assert three.points() == one.points()
    lines = budget_lines(three)
    assert "40 staircases x 3 repeats" in lines[0]
    assert f"160 points x 3 repeats x {one.seconds:g} s = {b3.load:.0f} s of load" in lines[0]
    assert lines[1].startswith(f"drains 120 x {one.drain_s:g} s")
    assert lines[-1].startswith("(3 repeats of the step length fitted for one")
    assert not any("repeats" in ln for ln in budget_lines(one))


def test_command_carries_the_repeat() -> None:
    one = make_plan(quick=True)
    assert command(one, "unique", "prefix") == (
        ".venv/bin/python -m bench compare --quick --workloads unique --routers prefix"
    )
    three = dataclasses.replace(one, repeats=3)
    assert command(three) == ".venv/bin/python -m bench compare --quick --repeat 3"
    assert "--repeat 3 --workloads unique --routers prefix" in command(three, "unique", "prefix")


def test_repeat_argument(capsys: pytest.CaptureFixture[str]) -> None:
    p = argparse.ArgumentParser()
    compare.add_arguments(p)
    assert p.parse_args([]).repeat == 1
    args = p.parse_args(["--quick", "--repeat", "2", "--dry-run"])
    assert args.repeat == 2
    compare.main(args)  # a dry run prints the plan and returns
    out = capsys.readouterr().out
    assert "x 2 repeats" in out
    with pytest.raises(SystemExit):
        p.parse_args(["--repeat", "0"])


def test_provenance_names_the_span_and_the_repeats() -> None:
    one = compare.provenance([{"measured_at": "2026-12-03 18:51 UTC", "repeats": 3}])
    assert one == "Measured 2026-12-03 18:51 UTC; each point 3 times (`--repeat`)."
    mixed = compare.provenance(
        [
            {"measured_at": "2026-12-03 19:00 UTC"},
            {"measured_at": "2026-12-03 13:42 UTC", "repeats": 3},
        ]
    )
    assert mixed == (
        "Measured 2026-12-03 13:42 UTC to 2026-12-03 19:00 UTC; each point 1 or 3 times "
        "(`--repeat`)."
    )


def test_provenance_names_the_hosts() -> None:
    one = compare.provenance([{"measured_at": "t", "machine": "A"}, {"measured_at": "t"}])
    assert one == "Measured t on A; each point 1 time (`--repeat`)."
    two = compare.provenance([{"measured_at": "t", "machine": "B"},
                              {"measured_at": "t", "machine": "A"}])
    assert two == "Measured t on A and B; each point 1 time (`--repeat`)."
