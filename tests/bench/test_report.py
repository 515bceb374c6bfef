"""The verdicts a report prints, computed from the points (bench/report.py judge, load)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench import report
from bench.report import demo_sentences, judge, load
from bench.scenarios import SCENARIOS, Rule


def pt(router: str, key: str, values: list[float], **kw: Any) -> dict[str, Any]:
    """A point of 1 or more rounds: its median, its rounds under `runs`."""
    row: dict[str, Any] = {"scenario": "routing", "workload": "system-prompts", "rate": 24.0,
                           "router": router, key: sorted(values)[len(values) // 2], **kw}
    if len(values) > 1:
        row.update(repeats=len(values), runs=[{key: v} for v in values])
    return row


def rules(name: str) -> dict[str, Rule]:
    return {r.text: r for r in SCENARIOS[name].rules}


def test_a_ratio_is_judged_on_the_medians_with_the_per_round_ratios_beside() -> None:
    rule = rules("suite")["system-prompts: prefix TTFT p50 <= 0.23 x round-robin"]
    rr = pt("round-robin", "ttft_p50_ms", [200.0, 196.0, 198.0])
    [(_, text, met)] = judge(rule, [pt("prefix", "ttft_p50_ms", [44.0, 47.0, 45.0]), rr])
    assert met is True  # 45 / 198 = 0.227
    assert text == "45.0 (44.0-47.0) / 198.0 (196.0-200.0) = 0.227 (per round 0.220-0.240)"
    [(_, _, met)] = judge(rule, [pt("prefix", "ttft_p50_ms", [46.0, 47.0, 45.0]), rr])
    assert met is False  # 46 / 198 = 0.232
    # the sweep's points of the same router are another scenario's: not judged here
    assert judge(rule, [pt("prefix", "ttft_p50_ms", [45.0], scenario="sweep"), rr]) == []


def test_a_figure_over_another_of_the_same_point() -> None:
    rule = rules("suite")["system-prompts: prefix hit rate >= 0.95 x oracle"]
    [(_, text, met)] = judge(rule, [pt("prefix", "engine_hit_rate", [0.835],
                                       oracle_hit_rate=0.840)])
    assert (text, met) == ("0.835 / 0.840 = 0.994", True)
    [(_, _, met)] = judge(rule, [pt("prefix", "engine_hit_rate", [0.70], oracle_hit_rate=0.84)])
    assert met is False


def test_best_of_all_calls_a_lead_inside_the_spread_a_tie_and_one_outside_a_loss() -> None:
    rule = next(r for r in SCENARIOS["compare"].rules
                if r.key == "ttft_p99_ms" and r.where["router"] == "prefix")
    base = {"scenario": "compare", "rate": 16.0, "requests_sent": 100, "errors": 0,
            "ttft_p50_ms": 50.0}
    ours = pt("prefix", "ttft_p99_ms", [190.0, 230.0, 260.0], **base)
    tie = pt("sglang-cache_aware", "ttft_p99_ms", [200.0, 210.0, 240.0], **base)
    rr = pt("round-robin", "ttft_p99_ms", [850.0, 900.0, 950.0], **base)
    [(what, text, met)] = judge(rule, [ours, tie, rr])
    assert met is True and "tied with sglang-cache_aware" in text
    assert what == "system-prompts at 16 req/s: prefix best TTFT p99 of every router not ours"
    better = pt("vllm-cache_aware", "ttft_p99_ms", [150.0, 160.0, 170.0], **base)
    [(_, text, met)] = judge(rule, [ours, tie, rr, better])
    assert met is False and "beaten by vllm-cache_aware" in text
    # past saturation (both load balancers' p50 over 1 s) nothing is judged
    slow = {**base, "ttft_p50_ms": 4000.0}
    point = [ours, tie, better, pt("round-robin", "ttft_p99_ms", [9000.0], **slow),
             pt("least-loaded", "ttft_p99_ms", [8000.0], **slow)]
    [(_, text, met)] = judge(rule, point)
    assert met is None and "past saturation" in text


def test_the_unique_rule_divides_by_the_best_load_balancer() -> None:
    rule = next(r for r in SCENARIOS["compare"].rules if r.where.get("workload") == "unique")
    base = {"scenario": "compare", "workload": "unique", "rate": 16.0, "requests_sent": 100}
    point = [pt("prefix", "ttft_p50_ms", [158.0], **base),
             pt("round-robin", "ttft_p50_ms", [152.0], **base),
             pt("least-loaded", "ttft_p50_ms", [149.0], **base)]
    [(what, text, met)] = judge(rule, point)
    assert text == "158.0 / 149.0 (least-loaded) = 1.060" and met is False
    assert what.startswith("unique at 16 req/s: prefix")


def test_shared_store_judges_each_workload_against_its_own_single_router() -> None:
    r = rules("shared-store")
    def row(router: str, workload: str, hit: float, imb: float = 1.1) -> dict[str, Any]:
        return {"scenario": "shared-store", "workload": workload, "rate": 24.0, "router": router,
                "engine_hit_rate": hit, "imbalance": imb}

    rows = [row("prefix", "a", 0.80), row("prefix-3x-redis", "a", 0.78),
            row("prefix-3x-local", "a", 0.60), row("prefix", "b", 0.50),
            row("prefix-3x-redis", "b", 0.47, imb=1.31)]
    hit = {w: met for w, _, met in judge(r["{workload}: 3 routers on Redis: hit rate >= 0.97 x "
                                           "1 router"], rows)}
    assert hit == {"a: 3 routers on Redis: hit rate >= 0.97 x 1 router": True,
                   "b: 3 routers on Redis: hit rate >= 0.97 x 1 router": False}
    imb = [met for _, _, met in judge(r["{workload}: 3 routers on Redis: imbalance <= 1.3"], rows)]
    assert imb == [True, False]


def test_two_clients_agree_within_five_percent() -> None:
    [rule] = SCENARIOS["client-check"].rules
    def row(client: str, p50: float) -> dict[str, Any]:
        return {"scenario": "client-check", "workload": "system-prompts", "rate": 8.0,
                "router": "prefix", "client": client, "ttft_p50_ms": p50}

    assert [m for _, _, m in judge(rule, [row("loadgen", 100.0), row("inference-perf", 104)])] \
        == [True]
    assert [m for _, _, m in judge(rule, [row("loadgen", 100.0), row("inference-perf", 94)])] \
        == [False]


def test_the_demo_says_what_the_table_means() -> None:
    rows = [{"router": "prefix", "ttft_p50_ms": 43.6, "engine_hit_rate": 0.835,
             "oracle_hit_rate": 0.840}, {"router": "round-robin", "ttft_p50_ms": 191.9}]
    first, second = demo_sentences(rows).splitlines()
    assert "cut the median time to first token by 77% against round-robin" in first
    assert "(44 ms against 192 ms)" in first
    assert "83.5% of prompt tokens from cache, 0.99 of the 84.0%" in second


def test_a_report_reads_its_own_points_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(report, "RESULTS", tmp_path)
    d = tmp_path / "shared-store"
    d.mkdir()
    (d / "a.json").write_text(json.dumps({"scenario": "shared-store", "router": "prefix"}))
    (d / "b.json").write_text(json.dumps({"scenario": "fault", "router": "prefix-3x-redis"}))
    (d / "c.json").write_text(json.dumps({"workload": "x", "rows": []}))  # not a point
    assert [r["router"] for r in load(SCENARIOS["shared-store"])] == ["prefix"]
    assert [r["router"] for r in load(SCENARIOS["fault"])] == ["prefix-3x-redis"]
    # a point written before points named their scenario belongs to its folder's
    (tmp_path / "routing").mkdir()
    (tmp_path / "routing" / "x.json").write_text(json.dumps({"router": "prefix"}))
    assert [r["scenario"] for r in load(SCENARIOS["suite"])] == ["routing"]


def test_a_report_written_again_keeps_its_hand_written_note(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(report, "RESULTS", tmp_path)
    sc = SCENARIOS["shared-store"]
    path = report.write(sc)
    fresh = path.read_text()
    assert report.preface(fresh) == []
    title, _, body = fresh.partition("\n\n")
    note = "> Re-run at abc1234: why,\n> and what it replaced.\n\n> A second paragraph.\n"
    path.write_text(f"{title}\n\n{note}\n{body}")
    report.write(sc)
    again = path.read_text()
    assert again == f"{title}\n\n{note}\n{body}"
    report.write(sc)
    assert path.read_text() == again  # not twice


def test_a_report_of_points_in_one_folder_per_rate_plots_beside_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(report, "RESULTS", tmp_path)
    for rate in (12, 32):
        (tmp_path / f"sweep-{rate}").mkdir()
        for router, ttft in (("prefix", 45.0), ("round-robin", 190.0)):
            point = {"scenario": "sweep", "workload": "system-prompts", "rate": float(rate),
                     "router": router, "engine_hit_rate": 0.5, "ttft_p50_ms": ttft,
                     "seconds": 90.0}
            (tmp_path / f"sweep-{rate}" / f"{router}.json").write_text(json.dumps(point))
    path = report.write(SCENARIOS["sweep"])
    assert path == tmp_path / "sweep.md"
    pngs = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*.png"))
    assert all(f"]({png})" in path.read_text() for png in pngs)
    assert pngs and all(png.startswith("sweep-") and "/" not in png for png in pngs)


def drift(scenario: str, router: str, hit: float, oracle: float = 0.8) -> dict[str, Any]:
    return {"scenario": scenario, "workload": "system-prompts", "rate": 24.0, "router": router,
            "engine_hit_rate": hit, "oracle_hit_rate": oracle}


def test_the_drift_rules_judge_each_mode_over_the_oracle() -> None:
    events, corrected, approx = SCENARIOS["drift-f2"].rules
    low = [drift("drift-f2", "prefix-approx", 0.56), drift("drift-f2", "prefix-corrected", 0.70)]
    [(what, text, met)] = judge(corrected, low)
    assert what.startswith("drift-f2: corrected") and met is False
    assert text == "0.700 / 0.800 = 0.875"
    [(_, _, met)] = judge(corrected, [drift("drift-f2", "prefix-corrected", 0.73)])
    assert met is True  # 0.9125
    [(_, _, met)] = judge(events, [drift("drift-f2", "prefix-events", 0.78)])
    assert met is True  # 0.975
    assert judge(approx, low)[0][2] is None  # shown, not judged
