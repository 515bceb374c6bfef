from __future__ import annotations

from typing import Any

from operator_builders import model

from prefix_operator import conditions as c
from prefix_operator.conditions import Condition
from prefix_operator.status import (
    Observed,
    compute_conditions,
    compute_status,
    deployment_condition,
    redact_url,
    significant_changes,
)
from prefix_operator.validation import Problem

T0, T1 = "2026-01-01T00:00:00Z", "2026-01-01T00:05:00Z"


def deploy(name: str, *, desired: int, ready: int, updated: int | None = None,
           total: int | None = None, generation: int = 1, observed: int = 1,
           conditions: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": name, "generation": generation},
            "spec": {"replicas": desired},
            "status": {"observedGeneration": observed, "readyReplicas": ready,
                       "updatedReplicas": desired if updated is None else updated,
                       "replicas": desired if total is None else total,
                       "conditions": conditions or []}}


def by_type(conds: list[Condition]) -> dict[str, Condition]:
    return {x.type: x for x in conds}


def test_last_transition_time_moves_only_on_a_flip() -> None:
    first = c.merge([], [Condition("Ready", "False", "ModelServersUnavailable", "0/1")],
                    now=T0, generation=1)
    same = c.merge(first, [Condition("Ready", "False", "RouterUnavailable", "1/2")],
                   now=T1, generation=2)
    assert same[0]["lastTransitionTime"] == T0  # still False: time kept
    assert same[0]["reason"] == "RouterUnavailable" and same[0]["message"] == "1/2"
    assert same[0]["observedGeneration"] == 2
    flipped = c.merge(same, [Condition("Ready", "True", "AllComponentsReady")], now=T1,
                      generation=2)
    assert flipped[0]["lastTransitionTime"] == T1


def test_merge_keeps_foreign_types_and_orders_ours() -> None:
    prev = [{"type": "SomeoneElses", "status": "True", "reason": "X", "message": "",
             "lastTransitionTime": T0}]
    out = c.merge(prev, [Condition("Degraded", "False", "AsExpected"),
                         Condition("Ready", "True", "AllComponentsReady")],
                  now=T1, generation=1)
    assert [x["type"] for x in out] == ["Ready", "Degraded", "SomeoneElses"]
    assert out[2] == prev[0]


def test_ready_is_the_and_of_its_parts_and_the_first_false_explains_it() -> None:
    parts = [Condition("ModelServersReady", "True", "ModelServersReady"),
             Condition("RouterReady", "False", "RouterUnavailable", "Deployment x: 1/2"),
             Condition("CacheStoreReady", "False", "CacheStoreNotCreated", "nope")]
    ready = c.aggregate_ready(parts)
    assert (ready.status, ready.reason, ready.message) == ("False", "RouterUnavailable",
                                                           "Deployment x: 1/2")
    ok = c.aggregate_ready([Condition(p.type, "True", p.reason) for p in parts], "serving")
    assert (ok.status, ok.reason, ok.message) == ("True", "AllComponentsReady", "serving")
    unknown = c.aggregate_ready([Condition("CacheStoreReady", "Unknown", "NotChecked")])
    assert unknown.status == "Unknown"


def test_deployment_condition_states() -> None:
    t = "ModelServersReady"
    assert deployment_condition(t, "ModelServers", None, 1).reason == "ModelServersNotCreated"
    assert deployment_condition(t, "ModelServers", deploy("d", desired=1, ready=0,
                                generation=2, observed=1), 1).reason == "ModelServersRollingOut"
    assert deployment_condition(t, "ModelServers", deploy("d", desired=2, ready=1, updated=1),
                                2).reason == "ModelServersRollingOut"
    unavailable = deployment_condition(t, "ModelServers", deploy("d", desired=2, ready=1), 2)
    assert unavailable.reason == "ModelServersUnavailable" and "1/2" in unavailable.message
    assert deployment_condition(t, "ModelServers", deploy("d", desired=2, ready=2, total=3),
                                2).reason == "ModelServersRollingOut"
    ok = deployment_condition(t, "ModelServers", deploy("d", desired=2, ready=2), 2)
    assert ok.is_true and ok.reason == "ModelServersReady"
    assert deployment_condition(t, "ModelServers", deploy("d", desired=0, ready=0),
                                0).reason == "ModelServersScaledToZero"
    stuck = deploy("d", desired=1, ready=0, conditions=[
        {"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded",
         "message": "ReplicaSet d-1 has timed out progressing."}])
    s = deployment_condition(t, "ModelServers", stuck, 1)
    assert s.reason == "ModelServersProgressDeadlineExceeded" and "timed out" in s.message
    quota = deploy("d", desired=1, ready=0, conditions=[
        {"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate",
         "message": "exceeded quota"}])
    assert deployment_condition(t, "ModelServers", quota,
                                1).reason == "ModelServersReplicaFailure"


def _all_ready(**spec: Any) -> Observed:
    return Observed(model_server=deploy("llama-model-server", desired=1, ready=1),
                    router=deploy("llama-router", desired=2, ready=2),
                    redis=deploy("llama-redis", desired=1, ready=1))


def test_everything_ready() -> None:
    conds = by_type(compute_conditions(model(), _all_ready()))
    assert conds["Ready"].is_true and conds["Ready"].reason == "AllComponentsReady"
    assert conds["Progressing"].status == "False"
    assert conds["Progressing"].reason == "RolloutComplete"
    assert conds["Degraded"].status == "False"
    assert conds["AutoscalingReady"].reason == "AutoscalingDisabled"


def test_starting_up_is_progressing_and_not_ready() -> None:
    obs = Observed(model_server=deploy("llama-model-server", desired=1, ready=0),
                   router=deploy("llama-router", desired=2, ready=2), redis=None)
    conds = by_type(compute_conditions(model(), obs))
    assert conds["Ready"].status == "False"
    assert conds["Ready"].reason == "ModelServersUnavailable"  # first False part
    assert conds["CacheStoreReady"].reason == "CacheStoreNotCreated"
    assert conds["Progressing"].status == "True"
    assert conds["Degraded"].status == "False"


def test_invalid_spec_overrides_ready_and_is_degraded() -> None:
    obs = _all_ready()
    obs.spec_problems = [Problem("ConflictingEngineArgs", "spec.engine.args sets --port")]
    conds = by_type(compute_conditions(model(), obs))
    assert (conds["Ready"].status, conds["Ready"].reason) == ("False", "ConflictingEngineArgs")
    assert conds["Degraded"].status == "True"
    assert conds["Progressing"].reason == "InvalidSpec"


def test_stuck_rollout_is_degraded_not_progressing() -> None:
    obs = _all_ready()
    obs.model_server = deploy("llama-model-server", desired=1, ready=0, conditions=[
        {"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded"}])
    conds = by_type(compute_conditions(model(), obs))
    assert conds["Degraded"].reason == "ModelServersProgressDeadlineExceeded"
    assert conds["Progressing"].reason == "RolloutStalled"


def test_external_store_conditions() -> None:
    m = model(cacheStore={"type": "external", "url": "redis://:hunter2@store:6379"})
    obs = _all_ready()
    obs.redis = None
    obs.store_reachable, obs.store_error = False, "ConnectionError: refused"
    conds = by_type(compute_conditions(m, obs))
    assert conds["CacheStoreReady"].reason == "ExternalStoreUnreachable"
    assert "hunter2" not in conds["CacheStoreReady"].message
    assert conds["Ready"].reason == "ExternalStoreUnreachable"
    assert conds["Progressing"].status == "False"  # waiting will not fix it
    obs.store_reachable = True
    assert by_type(compute_conditions(m, obs))["Ready"].is_true
    obs.store_problem = Problem("StoreSecretNotFound", "Secret x does not exist")
    conds = by_type(compute_conditions(m, obs))
    assert conds["Ready"].reason == "StoreSecretNotFound"
    assert conds["Degraded"].status == "True"


def test_autoscaling_condition_from_the_hpa() -> None:
    m = model(autoscaling={"enabled": True}, router={"kvCapacityTokens": 1000})
    obs = _all_ready()
    assert by_type(compute_conditions(m, obs))["AutoscalingReady"].reason == \
        "AutoscalerNotCreated"
    obs.hpa = {"status": {"conditions": [
        {"type": "AbleToScale", "status": "True", "reason": "SucceededGetScale"},
        {"type": "ScalingActive", "status": "False", "reason": "FailedGetExternalMetric",
         "message": "unable to get external metric"}]}}
    a = by_type(compute_conditions(m, obs))["AutoscalingReady"]
    assert (a.status, a.reason) == ("False", "FailedGetExternalMetric")
    obs.hpa["status"]["conditions"][1] = {"type": "ScalingActive", "status": "True",
                                          "reason": "ValidMetricFound", "message": "ok"}
    assert by_type(compute_conditions(m, obs))["AutoscalingReady"].is_true
    # autoscaling never decides Ready
    assert by_type(compute_conditions(m, obs))["Ready"].is_true


def test_compute_status_fields_and_events() -> None:
    m = model(replicas=1)
    st = compute_status(m, _all_ready(), None, T0)
    assert st["observedGeneration"] == 1
    assert st["readyReplicas"] == 1 and st["replicas"] == 1 and st["updatedReplicas"] == 1
    assert st["replicasSummary"] == "1/1"
    assert st["selector"] == "prefixrouter.io/model=llama,app.kubernetes.io/component=model-server"
    assert st["routerURL"] == "http://llama-router.ml.svc:8080"
    assert st["storeURL"] == "redis://llama-redis.ml.svc:6379/0"
    again = compute_status(m, _all_ready(), st, T1)
    assert again == st  # nothing changed: nothing to write, times kept
    assert significant_changes(st["conditions"], again["conditions"]) == []
    assert {x["type"] for x in significant_changes(None, st["conditions"])} == set(c.ORDER)


def test_redact_url() -> None:
    assert redact_url("redis://:pw@h:6379/0") == "redis://***@h:6379/0"
    assert redact_url("rediss://user:pw@h") == "rediss://***@h"
    assert redact_url("redis://h:6379") == "redis://h:6379"
