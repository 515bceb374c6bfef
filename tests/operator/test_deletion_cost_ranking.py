"""Deletion costs from engine values (deletion_cost.py): rank, hysteresis, fewest writes, budget."""

from __future__ import annotations

import random

from prefix_operator.deletion_cost import Budget, Engine, Policy, assign, order, plan


def engines(values: dict[str, float], costs: dict[str, int] | None = None) -> list[Engine]:
    costs = costs or {}
    return [Engine(p, v, costs.get(p)) for p, v in values.items()]


def apply(costs: dict[str, int], patches: list[tuple[str, int]]) -> dict[str, int]:
    return {**costs, **dict(patches)}


def test_fresh_pods_are_ranked_coldest_first_and_every_one_gets_a_cost():
    es = engines({"a": 500.0, "b": 0.0, "c": 120.0, "d": 40.0})
    patches = plan(es, budget=10)
    costs = dict(patches)
    assert sorted(costs, key=costs.__getitem__) == ["b", "d", "c", "a"]
    assert [p for p, _ in patches] == ["b", "d", "c", "a"]  # coldest first


def test_values_that_jitter_around_each_other_write_nothing():
    costs = dict(plan(engines({"a": 100.0, "b": 200.0, "c": 300.0}), 10))
    rng = random.Random(1)
    for _ in range(200):  # each within +-20% of where it was ranked
        jitter = {p: v * rng.uniform(0.8, 1.2) for p, v in {"a": 100, "b": 200, "c": 300}.items()}
        assert plan(engines(jitter, costs), 10) == []
    # and a real change of order is written
    moved = plan(engines({"a": 900.0, "b": 200.0, "c": 300.0}, costs), 10)
    assert moved and sorted(apply(costs, moved), key=apply(costs, moved).__getitem__)[-1] == "a"


def test_a_change_of_order_rewrites_only_the_pods_that_move():
    values = {f"p{i}": float(100 * (i + 1)) for i in range(8)}
    costs = dict(plan(engines(values), 20))
    values["p0"] = 5000.0  # the coldest becomes the hottest: one pod moves, one patch
    patches = plan(engines(values, costs), 20)
    assert [p for p, _ in patches] == ["p0"]
    new = apply(costs, patches)
    assert sorted(new, key=new.__getitem__) == [f"p{i}" for i in range(1, 8)] + ["p0"]
    # a new, empty engine joins: one patch, at the cold end
    values["fresh"] = 0.0
    patches = plan(engines(values, new), 20)
    assert [p for p, _ in patches] == ["fresh"]
    assert dict(patches)["fresh"] < min(new.values())


def test_no_room_between_two_costs_renumbers_all_in_order():
    ranked = ["a", "b", "c"]
    out = assign(ranked, {"a": 5, "c": 6})  # b must fit strictly between 5 and 6
    assert out["a"] < out["b"] < out["c"]


def test_pods_with_the_same_value_keep_their_order():
    costs = {"a": 2000, "b": 0, "c": 1000}
    assert order(engines({"a": 0.0, "b": 0.0, "c": 0.0}, costs)) == ["b", "c", "a"]
    assert plan(engines({"a": 0.0, "b": 0.0, "c": 0.0}, costs), 10) == []


def test_the_budget_bounds_the_patches_and_refills_at_its_rate():
    b = Budget(per_minute=6, burst=10)
    assert b.available(0.0) == 10
    b.spend(10)
    assert b.available(5.0) == 0  # half a patch
    assert b.available(10.0) == 1
    b.spend(1)
    assert b.available(70.0) == 6
    assert b.available(10_000.0) == 10  # never more than the burst
    es = engines({f"p{i}": float(i) * 100 for i in range(8)})
    assert len(plan(es, budget=3)) == 3
    assert [p for p, _ in plan(es, budget=3)] == ["p0", "p1", "p2"]  # the cold end first


def test_hysteresis_floor_keeps_near_idle_engines_still():
    costs = {"a": 0, "b": 1000}
    # 0.8 tokens/s against 0.1: over the factor, under the floor of 1 token a second
    assert plan(engines({"a": 0.8, "b": 0.1}, costs), 10, Policy()) == []
    assert plan(engines({"a": 0.8, "b": 0.1}, costs), 10, Policy(floor=0.0, floor_share=0.0))
