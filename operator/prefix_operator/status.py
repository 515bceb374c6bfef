"""The model's status computed from what its owned objects report: pure.

Inputs are the live objects (as returned by the API server) and the outcome of checks the
reconciler made; output is the status to write. Nothing here reads a clock or a socket.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from . import conditions as c
from .conditions import Condition
from .naming import MODEL_SERVER, router_url, selector_string, store_url
from .spec import Model
from .validation import Problem

# Deployment states that waiting will not fix.
_STUCK = ("ProgressDeadlineExceeded", "ReplicaFailure")


@dataclass
class Observed:
    # The live children that feed a condition, filled by the reconciler from the rows of
    # children.CHILDREN that name these fields (None: not there, or not wanted by the spec).
    model_server: dict[str, Any] | None = None
    router: dict[str, Any] | None = None
    redis: dict[str, Any] | None = None
    hpa: dict[str, Any] | None = None
    spec_problems: list[Problem] = field(default_factory=list)
    # the API server rejected a rendered object (something the schema let through)
    apply_problem: Problem | None = None
    store_problem: Problem | None = None
    # external store: did a PING answer (None = not checked)
    store_reachable: bool | None = None
    store_error: str = ""


def _deploy_conditions(deploy: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {x.get("type"): x for x in (deploy.get("status") or {}).get("conditions") or []}


def deployment_condition(type_: str, prefix: str, deploy: dict[str, Any] | None,
                         desired: int) -> Condition:
    """One component's readiness from its Deployment; reasons are <Prefix><State>."""
    if deploy is None:
        return Condition(type_, "False", f"{prefix}NotCreated", "the Deployment does not exist yet")
    name = deploy["metadata"]["name"]
    st = deploy.get("status") or {}
    conds = _deploy_conditions(deploy)
    progressing = conds.get("Progressing") or {}
    if progressing.get("status") == "False" and \
            progressing.get("reason") == "ProgressDeadlineExceeded":
        return Condition(type_, "False", f"{prefix}ProgressDeadlineExceeded",
                         f"Deployment {name}: {progressing.get('message', '')}".strip())
    failure = conds.get("ReplicaFailure") or {}
    if failure.get("status") == "True":
        return Condition(type_, "False", f"{prefix}ReplicaFailure",
                         f"Deployment {name}: {failure.get('message', '')}".strip())
    if desired == 0:
        return Condition(type_, "False", f"{prefix}ScaledToZero",
                         f"Deployment {name} is scaled to zero replicas")
    generation = deploy["metadata"].get("generation", 0)
    if st.get("observedGeneration", 0) < generation:
        return Condition(type_, "False", f"{prefix}RollingOut",
                         f"Deployment {name}: generation {generation} not yet observed")
    ready = st.get("readyReplicas", 0) or 0
    updated = st.get("updatedReplicas", 0) or 0
    total = st.get("replicas", 0) or 0
    if updated < desired:
        return Condition(type_, "False", f"{prefix}RollingOut",
                         f"Deployment {name}: {updated}/{desired} replicas updated")
    if ready < desired:
        return Condition(type_, "False", f"{prefix}Unavailable",
                         f"Deployment {name}: {ready}/{desired} replicas ready")
    if total > desired:
        return Condition(type_, "False", f"{prefix}RollingOut",
                         f"Deployment {name}: {total - desired} old replicas terminating")
    return Condition(type_, "True", f"{prefix}Ready",
                     f"Deployment {name}: {ready}/{desired} replicas ready")


def cache_store_condition(model: Model, observed: Observed) -> Condition:
    if model.spec.cache_store.type == "managed":
        return deployment_condition(c.CACHE_STORE_READY, "CacheStore", observed.redis, 1)
    if observed.store_problem is not None:
        return Condition(c.CACHE_STORE_READY, "False", observed.store_problem.reason,
                         observed.store_problem.message)
    where = redact_url(store_url(model))
    if observed.store_reachable is None:
        return Condition(c.CACHE_STORE_READY, "Unknown", "ExternalStoreNotChecked",
                         f"{where} has not been checked yet")
    if observed.store_reachable:
        return Condition(c.CACHE_STORE_READY, "True", "ExternalStoreReachable",
                         f"{where} answers PING")
    return Condition(c.CACHE_STORE_READY, "False", "ExternalStoreUnreachable",
                     f"{where}: {observed.store_error}".rstrip(": "))


def autoscaling_condition(model: Model, hpa: dict[str, Any] | None) -> Condition:
    t = c.AUTOSCALING_READY
    if not model.spec.autoscaling.enabled:
        return Condition(t, "False", "AutoscalingDisabled",
                         "spec.autoscaling.enabled is false; spec.replicas is set by hand")
    if hpa is None:
        return Condition(t, "False", "AutoscalerNotCreated",
                         "the HorizontalPodAutoscaler does not exist yet")
    conds = {x.get("type"): x for x in (hpa.get("status") or {}).get("conditions") or []}
    for kind in ("AbleToScale", "ScalingActive"):
        x = conds.get(kind)
        if x is not None and x.get("status") != "True":
            # The HPA's own reasons (FailedGetExternalMetric, ...) are the searchable ones.
            return Condition(t, "False", x.get("reason") or f"Not{kind}", x.get("message", ""))
    if "ScalingActive" not in conds:
        return Condition(t, "False", "AutoscalerPending",
                         "the HorizontalPodAutoscaler has not computed a scale yet")
    active = conds["ScalingActive"]
    return Condition(t, "True", "AutoscalerActive", active.get("message", ""))


def compute_conditions(model: Model, observed: Observed) -> list[Condition]:
    spec = model.spec
    parts = [
        deployment_condition(c.MODEL_SERVERS_READY, "ModelServers", observed.model_server,
                             spec.replicas),
        deployment_condition(c.ROUTER_READY, "Router", observed.router, spec.router.replicas),
        cache_store_condition(model, observed),
    ]
    # Problems that waiting will not fix, in the order that best explains Ready.
    blocking = [*observed.spec_problems[:1],
                *([observed.apply_problem] if observed.apply_problem else []),
                *([observed.store_problem] if observed.store_problem else [])]
    if blocking:
        # A spec we will not apply (or a store we cannot use) explains Ready better than the
        # components' state.
        ready = Condition(c.READY, "False", blocking[0].reason, blocking[0].message)
    else:
        ready = c.aggregate_ready(parts, f"serving {spec.model.name} at {router_url(model)}")

    stuck = [p for p in parts if any(p.reason.endswith(s) for s in _STUCK)]
    hard = [(p.reason, p.message) for p in blocking] + [(p.reason, p.message) for p in stuck]
    if hard:
        degraded = Condition(c.DEGRADED, "True", hard[0][0], hard[0][1])
    else:
        degraded = Condition(c.DEGRADED, "False", "AsExpected", "")

    # Transitional states that waiting resolves; an external store's reachability is not one
    # (the operator does not roll it out).
    external_store = spec.cache_store.type == "external"
    waiting = [p for p in parts
               if not p.is_true and p not in stuck
               and not p.reason.endswith("ScaledToZero")
               and not (external_store and p.type == c.CACHE_STORE_READY)]
    if blocking:
        progressing = Condition(c.PROGRESSING, "False", "InvalidSpec" if observed.spec_problems
                                else blocking[0].reason, blocking[0].message)
    elif stuck:
        progressing = Condition(c.PROGRESSING, "False", "RolloutStalled", stuck[0].message)
    elif waiting:
        progressing = Condition(c.PROGRESSING, "True", "RollingOut",
                                f"{waiting[0].reason}: {waiting[0].message}")
    else:
        progressing = Condition(c.PROGRESSING, "False", "RolloutComplete",
                                f"generation {model.generation} is rolled out")

    return [ready, *parts, autoscaling_condition(model, observed.hpa), progressing, degraded]


_USERINFO = re.compile(r"^(\w+://)[^@/]*@")


def redact_url(url: str) -> str:
    """A store URL may carry a password (redis://:secret@host): never put that in status."""
    return _USERINFO.sub(r"\1***@", url)


def compute_status(model: Model, observed: Observed, previous: dict[str, Any] | None,
                   now: str) -> dict[str, Any]:
    """The status fields the reconciler owns (routing figures are written separately)."""
    prev = previous or {}
    conds = c.merge(prev.get("conditions"), compute_conditions(model, observed), now=now,
                    generation=model.generation)
    st = (observed.model_server or {}).get("status") or {}
    ready = st.get("readyReplicas", 0) or 0
    return {
        "observedGeneration": model.generation,
        "replicas": st.get("replicas", 0) or 0,
        "readyReplicas": ready,
        "updatedReplicas": st.get("updatedReplicas", 0) or 0,
        "replicasSummary": f"{ready}/{model.spec.replicas}",
        "selector": selector_string(model, MODEL_SERVER),
        "routerURL": router_url(model),
        "storeURL": redact_url(store_url(model)),
        "conditions": conds,
    }


def significant_changes(previous: list[dict[str, Any]] | None,
                        current: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Conditions whose status flipped: each is worth a Kubernetes Event."""
    out = []
    for cond in current:
        before = c.find(previous, cond["type"])
        if before is None or before.get("status") != cond["status"]:
            out.append(cond)
    return out
