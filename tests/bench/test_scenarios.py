"""Scenarios as data (bench/scenarios.py) and the order the runner takes them in: the setups a
user declares, the rounds, the same request sequence for every setup."""

from __future__ import annotations

import dataclasses

import pytest

from bench.__main__ import declared, parser
from bench.harness.capacity import slices
from bench.harness.workloads import WORKLOADS, build
from bench.runner import capacities, plan, point_path, workload_for
from bench.scenarios import DRIFT, MODES, SCENARIOS, SETUPS, TOKENIZER, Setup, setup, speaks_tokens


def test_a_setup_is_a_name_or_our_router_with_more_settings() -> None:
    assert setup("round-robin") == Setup("round-robin", "round-robin", compared=True)
    s = setup("prefix-3x-redis,load_bound=1.0,store.near_cache_ttl_ms=0,salt_header=null")
    assert (s.router, s.replicas, s.store) == ("prefix", 3, "redis")
    assert s.settings == {"load_bound": 1.0, "store": {"near_cache_ttl_ms": 0},
                          "salt_header": None}
    assert s.name == "prefix-3x-redis,load_bound=1.0,store.near_cache_ttl_ms=0,salt_header=null"
    for bad in ("prefix,load_bound", "no-such-router", "sglang-cache_aware,cache_threshold=1"):
        with pytest.raises(ValueError):
            setup(bad)
    # every declared setup of every scenario exists
    for sc in SCENARIOS.values():
        for name in sc.setups:
            setup(name)


def test_rounds_go_over_every_setup_so_a_drift_of_the_host_hits_them_alike() -> None:
    sc = dataclasses.replace(SCENARIOS["routing"], workloads=("unique",),
                             setups=("prefix", "round-robin"), repeats=3)
    order = [(r.round, r.setup.name) for r in plan(sc)]
    assert order == [(1, "prefix"), (1, "round-robin"), (2, "prefix"), (2, "round-robin"),
                     (3, "prefix"), (3, "round-robin")]
    stairs = plan(dataclasses.replace(SCENARIOS["compare"], workloads=("customers",)))
    assert {r.rates for r in stairs} == {WORKLOADS["customers"].rates}  # one staircase each
    assert len(stairs) == len(SCENARIOS["compare"].setups)
    # a router is in the comparison by its one declaration
    assert SCENARIOS["compare"].setups == tuple(n for n, s in SETUPS.items() if s.compared)


def test_every_setup_is_sent_the_same_requests() -> None:
    a, b = build("system-prompts", 200), build("system-prompts", 200)
    assert [(s.system, [t.user for t in s.turns]) for s in a.sessions] == [
        (s.system, [t.user for t in s.turns]) for s in b.sessions]
    # a staircase's steps are consecutive slices of the one sequence, covering the arrivals
    cuts = slices(1.0, [8.0, 16.0], 11.0)
    assert cuts == [(0, 137), (137, 269)]


def test_point_files_keep_the_names_of_the_committed_results() -> None:
    r = SCENARIOS
    assert str(point_path(r["routing"], "unique", "prefix", 24.0, "loadgen")).endswith(
        "results/routing/unique-prefix.json")
    assert str(point_path(r["sweep"], "system-prompts", "prefix", 12.0, "loadgen")).endswith(
        "results/sweep-12/system-prompts-prefix.json")
    assert str(point_path(r["compare"], "unique", "chwbl", 8.0, "loadgen")).endswith(
        "results/compare/full/unique-chwbl-8.json")
    assert str(point_path(r["overhead"], "", "prefix-redis", 500.0, "loadgen")).endswith(
        "results/overhead/prefix-redis.json")


def test_no_two_scenarios_write_the_same_point_file() -> None:
    # a scenario sharing another's folder (fault beside shared-store) must not overwrite it
    written: dict[str, str] = {}
    for sc in SCENARIOS.values():
        if sc.kind != "routing" or not sc.out:
            continue
        for w in sc.workloads:
            for one in sc.setups:
                name = one if isinstance(one, str) else one.name
                for rate in sc.rates_of(w):
                    for client in sc.clients:
                        path = str(point_path(sc, w, name, rate, client))
                        assert written.setdefault(path, sc.name) == sc.name, path


def test_the_command_line_overrides_the_declaration() -> None:
    args = parser().parse_args(["overhead", "--setups", "prefix", "prefix,upstream_client=x",
                                "--repeat", "3"])
    [sc] = declared(args)
    assert sc.setups == ("prefix", "prefix,upstream_client=x") and sc.repeats == 3
    [sc] = declared(parser().parse_args(["compare", "--quick"]))
    assert (sc.out, sc.seconds, sc.rates) == ("compare/quick", 4.0, (12.0, 32.0))
    routing, sweep, overhead = declared(parser().parse_args(["suite", "--quick", "--seconds", "5",
                                                             "--out", "/tmp/x"]))
    assert (routing.seconds, routing.repeats, routing.out) == (5.0, 1, "/tmp/x/routing")
    assert (sweep.out, overhead.seconds) == ("/tmp/x/sweep-{rate:g}", 5.0)
    # the folder is under bench/results whether or not the command spells that prefix out
    for out in ("upstream-ab", "bench/results/upstream-ab"):
        [sc] = declared(parser().parse_args(["overhead", "--out", out]))
        assert sc.out == "upstream-ab"
    [sc] = declared(parser().parse_args(["run", "--workload", "unique", "--router",
                                       "prefix,load_bound=1.0", "--router-replicas", "3",
                                       "--store", "redis", "--rate", "12"]))
    [s] = sc.setups
    assert isinstance(s, Setup) and (s.replicas, s.store, s.settings) == (3, "redis",
                                                                          {"load_bound": 1.0})
    assert (sc.workloads, sc.rates, sc.fresh_fleet) == (("unique",), (12.0,), True)
    assert set(SETUPS) >= {"prefix", "prefix-3x-redis", "round-robin", "sglang-cache_aware"}


def test_index_modes_are_setups_of_our_prefix_router_that_differ_only_in_the_mode() -> None:
    for mode, name in zip(("approx", "corrected", "events"), MODES, strict=True):
        assert setup(name).settings == {"index": mode, "tokenizer": TOKENIZER,
                                        "cached_tokens_reported": True}
    # a setup in an index mode makes the whole scenario speak vLLM's tokens and KV events
    assert speaks_tokens(setup("prefix-events")) and not speaks_tokens(setup("prefix"))


def test_every_drift_case_runs_the_three_modes_on_one_fleet_with_the_same_requests() -> None:
    for sc in DRIFT:
        assert sc.kv_events and set(MODES) <= set(sc.setups), sc.name
        runs = plan(sc)
        assert len({(r.workload, r.rates) for r in runs}) == 1  # one sequence, one fleet
    mixed = SCENARIOS["drift-mixed"]
    caps = capacities(mixed, 32_272)
    assert len(caps) == 8 and sum(caps) == 8 * 32_272 and min(caps) == 16_128


def test_the_llm_d_shape_holds_its_working_set_in_73_percent_of_the_fleet() -> None:
    sc = SCENARIOS["drift-llmd"]
    wl, kv, ws = workload_for(sc, "llm-d", sc.rates)
    # 150 x 6,000 + 750 x 1,200 tokens of the tokenizer the simulators run
    assert abs(ws - 1_800_000) < 0.01 * 1_800_000
    assert abs(ws / (8 * kv) - 0.732) < 0.001
    assert {s.group for s in wl.sessions} <= {f"c{i}" for i in range(150)}
    assert abs(kv - 307_328) < 0.01 * 307_328  # llm-d's instances' capacity
