"""A ReplicaSet's scale-down without Kubernetes (bench/harness/replicaset.py): the pods the
controller deletes by deletion cost, and the costs the operator's own ranking writes."""

from __future__ import annotations

import random

from bench.harness.replicaset import CostKeeper, victims
from prefix_operator.config import OperatorConfig

PODS = [f"http://127.0.0.1:{8000 + i}" for i in range(8)]


def test_the_controller_deletes_the_lowest_costs_first_and_a_missing_cost_is_zero():
    costs = {p: 1000 * (i + 1) for i, p in enumerate(PODS)}
    assert victims(PODS, costs, 2, random.Random(1)) == PODS[:2]
    costs[PODS[5]] = -500
    del costs[PODS[6]]  # no annotation: 0, below every positive cost
    assert victims(PODS, costs, 2, random.Random(1)) == [PODS[5], PODS[6]]


def test_without_costs_the_choice_is_a_seeded_draw_among_alike_pods():
    picks = {tuple(victims(PODS, {}, 2, random.Random(seed))) for seed in range(20)}
    assert len(picks) > 5  # not always the same pods (first, newest, ...)
    assert victims(PODS, {}, 2, random.Random(3)) == victims(PODS, {}, 2, random.Random(3))


def test_the_keeper_ranks_the_coldest_engine_cheapest_within_the_budget():
    # PODS[7] the coldest, PODS[6] next: each clearly colder (past the operator's hysteresis)
    values = {**{p: 1000.0 for p in PODS[:6]}, PODS[6]: 100.0, PODS[7]: 10.0}
    keeper = CostKeeper(OperatorConfig(deletion_cost_patches_per_minute=6,
                                       deletion_cost_burst=10))
    written = keeper.refresh(PODS, values, now=0.0)
    assert len(written) == 8 and keeper.patches == 8
    assert victims(PODS, keeper.costs, 2, random.Random(0)) == [PODS[7], PODS[6]]
    # the hottest goes cold: it is re-ranked, within what is left of the bucket
    values[PODS[0]] = 0.0
    keeper.refresh(PODS, values, now=1.0)
    assert victims(PODS, keeper.costs, 2, random.Random(0)) == [PODS[7], PODS[0]]
    # a pod that is gone takes its cost with it
    keeper.refresh(PODS[1:], values, now=2.0)
    assert PODS[0] not in keeper.costs
