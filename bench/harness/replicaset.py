"""A ReplicaSet's scale-down without Kubernetes: the deletion costs the operator would write on
the engine pods (its own ranking, operator deletion_cost.py) and the pods the ReplicaSet
controller would then delete. Pure (clock passed in); a pod is named by its engine's URL."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence

from prefix_operator.config import OperatorConfig
from prefix_operator.deletion_cost import Budget, Engine, plan


def victims(pods: Sequence[str], costs: Mapping[str, int | None], count: int,
            rng: random.Random) -> list[str]:
    """The `count` pods a ReplicaSet controller deletes when it scales down pods that are
    otherwise alike (running, ready, one to a node, started within the same power of two of
    seconds): lowest `controller.kubernetes.io/pod-deletion-cost` first (no annotation
    counts as 0), and among equal costs its semi-random choice (LogarithmicScaleDown), a
    seeded draw here."""
    keyed = sorted((costs.get(p) or 0, rng.random(), p) for p in pods)
    return [p for _, _, p in keyed[:count]]


class CostKeeper:
    """The pods' deletion costs as the operator keeps them (cost_writer.py, with a dict in
    the API server's place): each refresh ranks the engines by the routers' published values
    through deletion_cost.plan, within the operator's default patch budget."""

    def __init__(self, cfg: OperatorConfig | None = None) -> None:
        cfg = cfg or OperatorConfig()
        self.costs: dict[str, int] = {}
        self.budget = Budget(cfg.deletion_cost_patches_per_minute, cfg.deletion_cost_burst)
        self.patches = 0  # written so far

    def refresh(self, pods: Sequence[str], values: Mapping[str, float],
                now: float) -> list[tuple[str, int]]:
        """The patches the operator writes now for these pods (its ranking of `values`,
        fleet-wide tokens a second by engine URL); applied to `costs`."""
        self.costs = {p: c for p, c in self.costs.items() if p in pods}  # deleted pods
        engines = [Engine(p, values.get(p, 0.0), self.costs.get(p)) for p in pods]
        written = plan(engines, self.budget.available(now))
        self.budget.spend(len(written))
        self.costs.update(written)
        self.patches += len(written)
        return written
