"""Writes each engine pod's deletion cost (deletion_cost.py) from the routers' engine values.

Runs on the figures timer (a modest rate, never per request): lists the model's engine pods,
plans the patches, writes them within the model's budget. Level-triggered: the costs already
on the pods are the state, so a restarted operator carries on from them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from .config import OperatorConfig
from .deletion_cost import ANNOTATION, Budget, Engine, parse_cost, plan
from .kube import Kube
from .naming import MODEL_SERVER, selector_string
from .spec import Model

log = logging.getLogger(__name__)


def engine_url(pod: dict[str, Any], port: int, annotation: str = "") -> str | None:
    """The pod as the routers name it: the base URL their discovery builds from its
    endpoint (the pod IP and the engine port; the test-only address annotation first)."""
    override = (pod["metadata"].get("annotations") or {}).get(annotation) if annotation else None
    if override:
        return f"http://{override}"
    ip = (pod.get("status") or {}).get("podIP")
    return f"http://{ip}:{port}" if ip else None


def live(pod: dict[str, Any]) -> bool:
    """A pod the ReplicaSet may still choose to delete."""
    if pod["metadata"].get("deletionTimestamp"):
        return False
    return (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")


class CostWriter:
    def __init__(self, kube: Kube, cfg: OperatorConfig,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.kube = kube
        self.cfg = cfg
        self.clock = clock
        self.budgets: dict[tuple[str, str], Budget] = {}
        self.patches = 0  # written since start (the bench reads the rate)

    async def refresh(self, model: Model, values: Mapping[str, float]) -> list[tuple[str, int]]:
        """Write the patches the plan allows now; returns them."""
        if self.cfg.deletion_cost_patches_per_minute <= 0:
            return []
        pods = await self.kube.list_pods(model.namespace, selector_string(model, MODEL_SERVER))
        port = model.spec.engine.port
        engines = []
        for pod in filter(live, pods):
            url = engine_url(pod, port, self.cfg.engine_address_annotation)
            cost = parse_cost((pod["metadata"].get("annotations") or {}).get(ANNOTATION))
            engines.append(Engine(pod["metadata"]["name"], values.get(url, 0.0) if url else 0.0,
                                  cost))
        budget = self.budgets.setdefault(
            (model.namespace, model.name),
            Budget(self.cfg.deletion_cost_patches_per_minute, self.cfg.deletion_cost_burst))
        written = []
        for pod, cost in plan(engines, budget.available(self.clock())):
            budget.spend(1)
            if await self.kube.annotate_pod(model.namespace, pod, {ANNOTATION: str(cost)}):
                self.patches += 1
                written.append((pod, cost))
        if written:
            log.info("deletion costs of %s/%s: %s", model.namespace, model.name,
                     ", ".join(f"{p}={c}" for p, c in written))
        return written
