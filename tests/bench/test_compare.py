"""bench/compare.py: the sweep plan, its time budget, step figures, verdicts and tables (pure)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from bench import compare
from bench.compare import (
    ANCHOR_NAMES,
    FULL_LIMIT_S,
    MARGIN,
    QUICK_LIMIT_S,
    ROUTERS,
    best_anchor,
    budget,
    client_load,
    fit_seconds,
    make_plan,
    point_saturated,
    points_table,
    restrict,
    saturated,
    slices,
    snapshot_of,
    step_figures,
    unique_verdict,
    verdict,
    verdict_table,
)
from bench.loadgen import Result, RunLog
from bench.workloads import WORKLOADS

# ---- plan and budget --------------------------------------------------------------------------


def test_every_router_and_anchor_is_in_the_plan() -> None:
    assert set(ROUTERS) == {
        "prefix",
        "prefix-3x-redis",
        "round-robin",
        "least-loaded",
        "chwbl",
        "sglang-cache_aware",
        "vllm-cache_aware",
        "vllm-consistent_hash",
    }
    assert set(ANCHOR_NAMES) <= set(compare.ANCHORS)
    assert set(compare.SETUP_S) == set(ROUTERS)


def test_quick_plan_fits_five_minutes() -> None:
    p = make_plan(quick=True)
    assert p.workloads == ("system-prompts", "unique")
    assert all(len(p.rates[w]) == 2 for w in p.workloads)
    assert p.routers == ROUTERS
    assert budget(p).total <= QUICK_LIMIT_S * MARGIN
    # one more second per step would not fit: the step is as long as the limit allows
    longer = dataclasses.replace(p, seconds=p.seconds + 1)
    assert budget(longer).total > QUICK_LIMIT_S * MARGIN
    assert p.seconds >= 3


def test_full_plan_fits_45_minutes_with_4_rates_per_workload() -> None:
    p = make_plan(quick=False)
    assert p.workloads == WORKLOADS
    assert p.client_workloads == WORKLOADS
    for w in WORKLOADS:
        rates = p.rates[w]
        assert 4 <= len(rates) <= 5
        assert list(rates) == sorted(rates)  # light to past saturation
    b = budget(p)
    assert b.total <= FULL_LIMIT_S * MARGIN
    assert b.load == len(p.points()) * p.seconds
    assert len(p.points()) == 5 * 4 * 8
    assert p.seconds >= 8


def test_budget_arithmetic() -> None:
    p = dataclasses.replace(
        make_plan(quick=True),
        workloads=("unique",),
        routers=("prefix", "round-robin"),
        client_workloads=(),
        seconds=10.0,
    )
    b = budget(p)
    assert b.load == 2 * 2 * 10.0  # 2 routers x 2 rates x 10 s
    assert b.drains == 2 * p.drain_s
    assert b.setups == compare.SETUP_S["prefix"] + compare.SETUP_S["round-robin"]
    assert b.fleets == compare.FLEET_S
    assert b.clients == 0
    assert b.total == pytest.approx(
        b.load + b.drains + b.setups + b.fleets + b.settles + compare.FIXED_S
    )


def test_the_45_second_steps_of_the_brief_do_not_fit() -> None:
    p = dataclasses.replace(make_plan(quick=False), seconds=45.0)
    assert budget(p).total > FULL_LIMIT_S  # 160 points x 45 s = 7,200 s of load alone
    q = dataclasses.replace(make_plan(quick=True), seconds=20.0)
    assert budget(q).total > QUICK_LIMIT_S  # 32 points x 20 s = 640 s


def test_fit_seconds_refuses_an_impossible_limit() -> None:
    p = dataclasses.replace(make_plan(quick=False), limit_s=100.0)
    with pytest.raises(ValueError):
        fit_seconds(p)


def test_restrict_keeps_the_step_length() -> None:
    full = make_plan(quick=False)
    sub = restrict(full, ["unique"], ["prefix", "chwbl"], clients=False)
    assert sub.seconds == full.seconds
    assert sub.workloads == ("unique",)
    assert sub.routers == ("prefix", "chwbl")
    assert sub.client_workloads == ()
    assert restrict(full, None, None, clients=True) == full


def test_slices_are_consecutive_and_cover_the_arrivals() -> None:
    cuts = slices(1.0, [8.0, 16.0], 10.0)
    assert cuts == [(0, 125), (125, 245)]
    multi = slices(6.5, [8.0, 16.0], 10.0)
    assert multi[0] == (0, 24)  # ceil(8 x 10 x 1.5 / 6.5) + 5
    assert multi[1][0] == 24


# ---- one step's figures -----------------------------------------------------------------------


def _res(ttft: float | None, ok: bool = True, cached: int = 0, prompt: int = 100) -> Result:
    return Result(0, 0, 0.0, ttft, 1.0 if ok else None, ok, 200, 10, cached, prompt, "u")


def _snap(t: float, requests: list[int], prompt: int, cached: int, gen: int, ts: float, tc: float):
    stats = [
        {"requests": r, "prompt_tokens": 0, "cached_tokens": 0, "generation_tokens": 0}
        for r in requests
    ]
    stats[0].update(prompt_tokens=prompt, cached_tokens=cached, generation_tokens=gen)
    return snapshot_of(stats, (ts, tc), t)


def test_step_figures_from_counter_deltas_and_the_steps_own_requests() -> None:
    log = RunLog()
    log.sent = [[{"role": "user", "content": "x"}]] * 5  # 5 sent, 4 answered, 1 unfinished
    log.results = [_res(0.1, cached=50), _res(0.2, cached=50), _res(0.3), _res(None, ok=False)]
    before = _snap(10.0, [2, 2], prompt=1000, cached=100, gen=500, ts=1.0, tc=10)
    end = _snap(20.0, [5, 3], prompt=1900, cached=500, gen=2500, ts=1.9, tc=13)
    after = _snap(25.0, [6, 4], prompt=2000, cached=600, gen=3000, ts=2.2, tc=14)
    f = step_figures(log, before, after, end)
    assert f["requests_sent"] == 5
    assert f["requests_ok"] == 3
    assert f["errors"] == 1
    assert f["unfinished"] == 1
    assert f["engine_hit_rate"] == 0.5  # (600 - 100) / (2000 - 1000)
    assert f["usage_hit_rate"] == round(100 / 300, 4)
    assert f["ttft_p50_ms"] == 200.0
    assert f["ttft_p99_ms"] == 300.0
    assert f["output_tokens_per_s"] == 200.0  # (2500 - 500) / (20 - 10): the step, not the drain
    assert f["per_replica_requests"] == [4, 2]
    assert f["imbalance"] == round(4 / 3, 3)
    assert f["engine_ttft_mean_ms"] == 300.0  # (2.2 - 1.0) / (14 - 10)
    assert f["queued_at_end"] == 0


def test_step_figures_with_nothing_sent() -> None:
    s = _snap(0.0, [0, 0], 0, 0, 0, 0.0, 0)
    f = step_figures(RunLog(), s, s, s)
    assert f["engine_hit_rate"] == 0.0
    assert f["ttft_p50_ms"] is None
    assert f["engine_ttft_mean_ms"] is None
    assert f["output_tokens_per_s"] == 0.0


# ---- verdicts ---------------------------------------------------------------------------------


def row(router: str, hit: float, p99: float, p50: float = 50.0, **kw: Any) -> dict[str, Any]:
    r = {
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
    r.update(kw)
    return r


def test_prefix_best_on_both() -> None:
    pt = [
        row("prefix", 0.80, 200.0),
        row("prefix-3x-redis", 0.85, 150.0),  # ours: not a competitor of prefix
        row("round-robin", 0.45, 900.0),
        row("sglang-cache_aware", 0.80, 210.0),  # a tie on hit rate counts as best
    ]
    v = verdict(pt)
    assert v["verdict"] == "best on both"
    assert v["best_hit"] == ("prefix-3x-redis", 0.85)  # best of all routers, shown
    assert v["best_p99"] == ("prefix-3x-redis", 150.0)
    assert v["best_hit_ok"] and v["best_p99_ok"]


def test_prefix_loses_the_p99_to_an_anchor() -> None:
    pt = [
        row("prefix", 0.80, 300.0),
        row("round-robin", 0.45, 900.0),
        row("vllm-cache_aware", 0.79, 250.0),
    ]
    v = verdict(pt)
    assert v["best_hit_ok"] is True
    assert v["best_p99_ok"] is False
    assert v["verdict"] == "NOT best: TTFT p99 (best vllm-cache_aware)"


def test_past_saturation_is_reported_not_judged() -> None:
    pt = [
        row("prefix", 0.80, 300.0),
        row("round-robin", 0.45, 9000.0, p50=4000.0),
        row("least-loaded", 0.45, 8000.0, p50=200.0, queued_at_end=8),
        row("chwbl", 0.7, 250.0),
    ]
    assert point_saturated(pt)
    assert verdict(pt)["verdict"] == "past saturation"
    # one load balancer still under: not past saturation
    pt[2]["queued_at_end"] = 7
    assert not point_saturated(pt)
    assert verdict(pt)["verdict"].startswith("NOT best")


def test_saturated_router() -> None:
    assert not saturated(row("x", 0, 0, p50=999.0, unfinished=50, queued_at_end=7))
    assert saturated(row("x", 0, 0, p50=1001.0))
    assert saturated(row("x", 0, 0, errors=6))
    assert saturated(row("x", 0, 0, queued_at_end=8))
    assert saturated(row("x", 0, 0, p50=None))


def test_no_prefix_row_gives_no_verdict() -> None:
    assert verdict([row("round-robin", 0.4, 500.0)])["verdict"] == "-"


def test_unique_five_percent_rule_against_the_best_load_balancer() -> None:
    pt = [
        row("prefix", 0.0, 300.0, p50=159.0, workload="unique"),
        row("round-robin", 0.0, 250.0, p50=155.0, workload="unique"),
        row("least-loaded", 0.0, 260.0, p50=152.0, workload="unique"),
        row("vllm-cache_aware", 0.0, 200.0, p50=100.0, workload="unique"),  # not a balancer
    ]
    v = unique_verdict(pt)
    assert v["best_lb"] == ("least-loaded", 152.0)
    assert v["ratio"] == round(159 / 152, 3)  # 1.046
    assert v["verdict"] == "met"
    pt[0]["ttft_p50_ms"] = 160.0  # 1.053
    assert unique_verdict(pt)["verdict"] == "NOT met"


def test_best_anchor_by_hit_rate_then_p99() -> None:
    rows = [
        row("sglang-cache_aware", 0.62, 400.0),
        row("vllm-cache_aware", 0.618, 300.0),  # within 0.005: equal hit, lower p99 wins
        row("vllm-consistent_hash", 0.40, 100.0),
        row("prefix", 0.9, 50.0),
    ]
    assert best_anchor(rows, "system-prompts") == "vllm-cache_aware"
    rows[1]["engine_hit_rate"] = 0.5
    assert best_anchor(rows, "system-prompts") == "sglang-cache_aware"
    assert best_anchor(rows, "unique") is None


# ---- tables and client shapes -----------------------------------------------------------------


def test_tables_are_sorted_by_rate_then_router_order() -> None:
    rows = [
        row("round-robin", 0.4, 500.0, rate=32.0),
        row("prefix", 0.8, 200.0, rate=32.0),
        row("prefix", 0.7, 180.0, rate=8.0),
    ]
    lines = points_table(rows, "system-prompts").splitlines()
    assert lines[0].startswith("| rate | router | engine hit rate |")
    assert [ln.split("|")[1:3] for ln in lines[2:]] == [
        [" 8 ", " prefix "],
        [" 32 ", " prefix "],
        [" 32 ", " round-robin "],
    ]
    vt = verdict_table(rows, "system-prompts")
    assert "| 32 | prefix | prefix 0.800 | 0.800 | prefix 200.0 | 200.0 | best on both |" in vt


def test_client_load_follows_the_workload() -> None:
    sp = client_load("system-prompts", 8.0, 10.0)
    assert (sp.groups, sp.system_prompt_len, sp.rate, sp.seconds) == (64, 2000, 8.0, 10)
    cu = client_load("customers", 5.0, 10.0)
    assert (cu.groups, cu.prompts_per_group, cu.system_prompt_len) == (150, 5, 6000)
    un = client_load("unique", 8.0, 10.0)
    assert un.prompts_per_group == 1 and un.groups > 8 * 10  # nothing shared
    for w in WORKLOADS:
        assert client_load(w, 4.0, 5.0).num_workers == 1
