"""The operator against a real control plane (kube-apiserver, etcd, kube-controller-manager,
kube-scheduler, kwok nodes): the `prefix-operator` command runs as a subprocess in standalone
mode, watching one namespace, with second-scale timers.

Covers: owned objects and their specs, conditions from False/Progressing to Ready, printer
columns with live figures, drift repair, the scale subresource, spec updates rolling only what
they affect, invalid combinations, autoscaling, operator restarts (also mid-reconcile), and
deletion (garbage collection and the cache-store finalizer, bounded when the store is away).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import yaml
from processes import Operator
from redis_process import running_redis

from prefix_router.contract import RouterFigures, StoreKeys, store_prefix

pytestmark = pytest.mark.k8s



@pytest.fixture(scope="module")
def ns(cp: Any) -> Iterator[str]:
    name = f"op-{uuid.uuid4().hex[:6]}"
    cp.kubectl("create", "namespace", name)
    cp.wait_for(lambda: cp.kubectl("get", "serviceaccount", "default", "-n", name,
                                   check=False).returncode == 0, 30, "default ServiceAccount")
    yield name
    cp.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture(scope="module")
def operator(cp: Any, ns: str, tmp_path_factory: pytest.TempPathFactory,
             request: pytest.FixtureRequest) -> Iterator[Operator]:
    op = Operator(cp, ns, tmp_path_factory.mktemp("operator"))
    op.start()
    yield op
    op.stop()
    if request.session.testsfailed:
        sys.stderr.write(f"\n--- operator log ({op.log_path}) ---\n{op.tail()}\n")


@pytest.fixture(scope="module")
def store() -> Iterator[tuple[str, int, str]]:
    """A real redis-server with a password: the 'external' cache store."""
    binary = os.environ.get("REDIS_SERVER") or shutil.which("redis-server")
    if not binary:
        pytest.fail("redis-server is not installed (make test installs it)", pytrace=False)
    password = "s3cret"
    with running_redis(binary, password) as port:
        yield "127.0.0.1", port, password


# --------------------------------------------------------------------------- helpers


def prm(name: str, **spec: Any) -> dict[str, Any]:
    spec.setdefault("model", {"name": "llama", "source": "meta-llama/Llama-3.1-8B-Instruct"})
    return {"apiVersion": "prefixrouter.io/v1alpha1", "kind": "PrefixRoutedModel",
            "metadata": {"name": name}, "spec": spec}


def create(cp: Any, ns: str, obj: dict[str, Any]) -> None:
    cp.kubectl("create", "-n", ns, "-f", "-", input=json.dumps(obj))


def get(cp: Any, ns: str, kind: str, name: str) -> dict[str, Any] | None:
    proc = cp.kubectl("get", kind, name, "-n", ns, "-o", "json", check=False)
    return json.loads(proc.stdout) if proc.returncode == 0 else None


def cond(obj: dict[str, Any] | None, type_: str) -> dict[str, Any]:
    for c in ((obj or {}).get("status") or {}).get("conditions") or []:
        if c["type"] == type_:
            return c
    return {}


def wait_ready(cp: Any, ns: str, name: str, timeout: float = 60) -> dict[str, Any]:
    def ready() -> dict[str, Any] | None:
        obj = get(cp, ns, "prm", name)
        if cond(obj, "Ready").get("status") == "True" and \
                obj["status"].get("observedGeneration") == obj["metadata"]["generation"]:
            return obj
        return None
    return cp.wait_for(ready, timeout, f"{name} Ready=True", interval=0.3)


def wait_condition(cp: Any, ns: str, name: str, type_: str, status: str, reason: str,
                   timeout: float = 60) -> dict[str, Any]:
    def match() -> dict[str, Any] | None:
        obj = get(cp, ns, "prm", name)
        c = cond(obj, type_)
        return obj if (c.get("status"), c.get("reason")) == (status, reason) else None
    return cp.wait_for(match, timeout, f"{name} {type_}={status} ({reason})", interval=0.3)


def events(cp: Any, ns: str, name: str) -> list[dict[str, Any]]:
    items = cp.kubectl_json("get", "events", "-n", ns,
                            "--field-selector", f"involvedObject.name={name},"
                            "involvedObject.kind=PrefixRoutedModel")["items"]
    return items


def event_reasons(cp: Any, ns: str, name: str) -> set[str]:
    return {e["reason"] for e in events(cp, ns, name)}


def children(cp: Any, ns: str, name: str) -> list[str]:
    out = cp.kubectl("get", "deployments,services,configmaps,serviceaccounts,roles,"
                     "rolebindings,poddisruptionbudgets,horizontalpodautoscalers",
                     "-n", ns, "-l", f"prefixrouter.io/model={name}", "-o", "name").stdout
    return sorted(out.split())


def container(deploy: dict[str, Any]) -> dict[str, Any]:
    return deploy["spec"]["template"]["spec"]["containers"][0]


# --------------------------------------------------------------------------- lifecycle


def test_model_goes_from_progressing_to_ready_with_every_owned_object(
        cp: Any, ns: str, operator: Operator) -> None:
    # Pods that fit no node keep the model servers Pending: a deterministic "not yet" state.
    create(cp, ns, prm("alpha", resources={"nodeSelector": {"prefixrouter.io/test": "none"}}))
    obj = wait_condition(cp, ns, "alpha", "Ready", "False", "ModelServersUnavailable")
    assert cond(obj, "Progressing")["status"] == "True"
    assert cond(obj, "ModelServersReady")["status"] == "False"
    assert cond(obj, "Degraded")["status"] == "False"
    wait_condition(cp, ns, "alpha", "RouterReady", "True", "RouterReady")
    wait_condition(cp, ns, "alpha", "CacheStoreReady", "True", "CacheStoreReady")

    cp.kubectl("patch", "prm", "alpha", "-n", ns, "--type=merge",
               "-p", '{"spec": {"resources": {"nodeSelector": null}}}')
    obj = wait_ready(cp, ns, "alpha")
    st = obj["status"]
    assert cond(obj, "Progressing")["status"] == "False"
    assert (st["replicas"], st["readyReplicas"], st["updatedReplicas"]) == (1, 1, 1)
    assert st["routerURL"] == f"http://alpha-router.{ns}.svc:8080"
    assert st["selector"] == "prefixrouter.io/model=alpha,app.kubernetes.io/component=model-server"
    assert {"Created", "Ready"} <= event_reasons(cp, ns, "alpha")

    uid = obj["metadata"]["uid"]
    assert children(cp, ns, "alpha") == sorted([
        "configmap/alpha-router",
        "deployment.apps/alpha-model-server", "deployment.apps/alpha-redis",
        "deployment.apps/alpha-router",
        "poddisruptionbudget.policy/alpha-model-server",
        "poddisruptionbudget.policy/alpha-router",
        "role.rbac.authorization.k8s.io/alpha-router",
        "rolebinding.rbac.authorization.k8s.io/alpha-router",
        "service/alpha-model-server", "service/alpha-redis", "service/alpha-router",
        "serviceaccount/alpha-router",
    ])
    for ref in children(cp, ns, "alpha"):
        o = cp.kubectl_json("get", ref, "-n", ns, "--show-managed-fields")
        owner = o["metadata"]["ownerReferences"][0]
        assert (owner["uid"], owner["controller"]) == (uid, True)
        assert "prefix-operator" in {m["manager"] for m in o["metadata"]["managedFields"]}

    ms = get(cp, ns, "deployment", "alpha-model-server")
    c = container(ms)
    assert "--enable-prefix-caching" in c["args"]
    assert c["args"][c["args"].index("--block-size") + 1] == "16"
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert c["readinessProbe"]["httpGet"]["path"] == "/health"
    assert c["startupProbe"]["failureThreshold"] * c["startupProbe"]["periodSeconds"] >= 1800
    vols = {v["name"]: v for v in ms["spec"]["template"]["spec"]["volumes"]}
    assert vols["dshm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "8Gi"}
    pods = cp.kubectl_json("get", "pods", "-n", ns, "-l",
                           "prefixrouter.io/model=alpha,app.kubernetes.io/component=model-server")
    assert [p["spec"]["nodeName"] in cp.node_names for p in pods["items"]] == [True]

    svc = get(cp, ns, "service", "alpha-model-server")
    assert svc["spec"]["clusterIP"] == "None"
    cm = get(cp, ns, "configmap", "alpha-router")
    router_yaml = yaml.safe_load(cm["data"]["router.yaml"])
    assert router_yaml["block_size"] == 16 and router_yaml["model_key"] == f"{ns}/alpha"
    assert router_yaml["discovery"]["service"] == "alpha-model-server"
    assert router_yaml["store"]["url"] == f"redis://alpha-redis.{ns}.svc:6379/0"
    rt = get(cp, ns, "deployment", "alpha-router")
    assert rt["spec"]["template"]["spec"]["serviceAccountName"] == "alpha-router"
    role = get(cp, ns, "role", "alpha-router")
    assert role["rules"][0]["resources"] == ["endpointslices"]
    # the router's ServiceAccount may really watch EndpointSlices, and nothing more
    can = cp.kubectl("auth", "can-i", "watch", "endpointslices.discovery.k8s.io", "-n", ns,
                     f"--as=system:serviceaccount:{ns}:alpha-router", check=False)
    assert can.stdout.strip() == "yes"
    cannot = cp.kubectl("auth", "can-i", "list", "secrets", "-n", ns,
                        f"--as=system:serviceaccount:{ns}:alpha-router", check=False)
    assert cannot.stdout.strip() == "no"

    # kopf's bookkeeping is in annotations (status would be pruned), and our finalizer is on
    meta = obj["metadata"]
    assert "prefixrouter.io/cache-cleanup" in meta["finalizers"]
    assert "prefixrouter.io/last-handled-configuration" in meta["annotations"]
    assert "kopf" not in st


def test_drift_is_repaired(cp: Any, ns: str, operator: Operator) -> None:
    create(cp, ns, prm("drift"))
    wait_ready(cp, ns, "drift")
    old_uid = get(cp, ns, "deployment", "drift-router")["metadata"]["uid"]
    cp.kubectl("delete", "deployment", "drift-router", "-n", ns, "--wait=false")
    cp.kubectl("delete", "configmap", "drift-router", "-n", ns, "--wait=false")
    # a hand edit of a field the operator owns
    cp.kubectl("patch", "deployment", "drift-model-server", "-n", ns, "--type=json",
               "-p", json.dumps([{"op": "replace",
                                  "path": "/spec/template/spec/containers/0/image",
                                  "value": "example.invalid/hacked:1"}]))
    cp.kubectl("patch", "role", "drift-router", "-n", ns, "--type=json",
               "-p", '[{"op": "replace", "path": "/rules/0/verbs", "value": ["get"]}]')

    def repaired() -> bool:
        rt = get(cp, ns, "deployment", "drift-router")
        ms = get(cp, ns, "deployment", "drift-model-server")
        role = get(cp, ns, "role", "drift-router")
        return bool(rt and rt["metadata"]["uid"] != old_uid
                    and get(cp, ns, "configmap", "drift-router")
                    and container(ms)["image"].startswith("vllm/vllm-openai:")
                    and role["rules"][0]["verbs"] == ["get", "list", "watch"])
    cp.wait_for(repaired, 30, "owned objects restored", interval=0.3)
    wait_ready(cp, ns, "drift")
    assert "DriftRepaired" in event_reasons(cp, ns, "drift")


def test_kubectl_scale_changes_the_model_server_replicas(cp: Any, ns: str,
                                                         operator: Operator) -> None:
    create(cp, ns, prm("scaled"))
    wait_ready(cp, ns, "scaled")
    cp.kubectl("scale", "prm", "scaled", "-n", ns, "--replicas=3")
    cp.wait_for(lambda: get(cp, ns, "deployment", "scaled-model-server")["spec"]["replicas"] == 3,
                30, "model-server Deployment scaled to 3")
    obj = wait_ready(cp, ns, "scaled")
    assert obj["status"]["readyReplicas"] == 3 and obj["status"]["replicasSummary"] == "3/3"
    scale = json.loads(cp.kubectl(
        "get", "--raw",
        f"/apis/prefixrouter.io/v1alpha1/namespaces/{ns}/prefixroutedmodels/scaled/scale").stdout)
    assert scale["status"]["replicas"] == 3
    assert scale["status"]["selector"] == obj["status"]["selector"]


def test_spec_update_rolls_only_what_it_affects(cp: Any, ns: str, operator: Operator) -> None:
    create(cp, ns, prm("roll"))
    wait_ready(cp, ns, "roll")

    def generations() -> tuple[int, int, int]:
        return tuple(get(cp, ns, "deployment", f"roll-{c}")["metadata"]["generation"]
                     for c in ("model-server", "router", "redis"))  # type: ignore[return-value]

    ms0, rt0, rd0 = generations()
    cp.kubectl("patch", "prm", "roll", "-n", ns, "--type=merge",
               "-p", '{"spec": {"router": {"loadBound": 0.75}}}')
    wait_ready(cp, ns, "roll")
    ms1, rt1, rd1 = generations()
    assert (ms1, rd1) == (ms0, rd0), "a router setting must not roll model servers or Redis"
    assert rt1 > rt0
    cm = yaml.safe_load(get(cp, ns, "configmap", "roll-router")["data"]["router.yaml"])
    assert cm["load_bound"] == 0.75

    # the block size is shared: engine and router roll together, Redis does not
    cp.kubectl("patch", "prm", "roll", "-n", ns, "--type=merge",
               "-p", '{"spec": {"router": {"blockSize": 32}}}')
    wait_ready(cp, ns, "roll")
    ms2, rt2, rd2 = generations()
    assert ms2 > ms1 and rt2 > rt1 and rd2 == rd1
    args = container(get(cp, ns, "deployment", "roll-model-server"))["args"]
    assert args[args.index("--block-size") + 1] == "32"
    assert "Updated" in event_reasons(cp, ns, "roll")


def test_invalid_combination_is_reported_not_crashed_on(cp: Any, ns: str,
                                                        operator: Operator) -> None:
    create(cp, ns, prm("conflict", engine={"args": ["--block-size", "32"]}))
    obj = wait_condition(cp, ns, "conflict", "Ready", "False", "ConflictingEngineArgs")
    assert "--block-size" in cond(obj, "Ready")["message"]
    assert cond(obj, "Degraded")["status"] == "True"
    assert children(cp, ns, "conflict") == []  # nothing half-applied
    assert operator.alive()
    cp.kubectl("patch", "prm", "conflict", "-n", ns, "--type=merge",
               "-p", '{"spec": {"engine": {"args": ["--max-model-len", "4096"]}}}')
    wait_ready(cp, ns, "conflict")


def test_autoscaler_is_created_and_pruned(cp: Any, ns: str, operator: Operator) -> None:
    create(cp, ns, prm("auto", router={"kvCapacityTokens": 100000},
                       autoscaling={"enabled": True}))
    wait_ready(cp, ns, "auto")
    hpa = get(cp, ns, "hpa", "auto")
    assert hpa["spec"]["scaleTargetRef"]["kind"] == "PrefixRoutedModel"
    # The HPA controller (kube-controller-manager) reads the model through its scale
    # subresource; no metrics adapter runs here, so it settles on the missing external metric.
    # Before that it may say FailedGetScale: its REST mapper learns a new CRD only when it
    # resets (every 30 s), so the wait allows for one reset plus one HPA sync (15 s).
    obj = cp.wait_for(
        lambda: (o := get(cp, ns, "prm", "auto")) and
        cond(o, "AutoscalingReady").get("reason") in ("FailedGetExternalMetric",
                                                      "AutoscalerActive") and o,
        120, "AutoscalingReady from the HPA's conditions", interval=0.5)
    assert cond(obj, "AutoscalingReady")["status"] in ("True", "False")
    assert cond(obj, "Ready")["status"] == "True"  # autoscaling does not decide Ready
    cp.kubectl("patch", "prm", "auto", "-n", ns, "--type=merge",
               "-p", '{"spec": {"autoscaling": {"enabled": false}}}')
    cp.wait_for(lambda: get(cp, ns, "hpa", "auto") is None, 30, "the HPA pruned")
    assert "Pruned" in event_reasons(cp, ns, "auto")


def test_external_store_figures_columns_and_finalizer(cp: Any, ns: str, operator: Operator,
                                                      store: tuple[str, int, str]) -> None:
    host, port, password = store
    r = redis.Redis(host=host, port=port, password=password, decode_responses=True)
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "store-auth"},
              "data": {"password": base64.b64encode(password.encode()).decode()}}
    create(cp, ns, prm("ext", router={"kvCapacityTokens": 50000},
                       cacheStore={"type": "external", "url": f"redis://{host}:{port}/0",
                                   "passwordSecretRef": {"name": "store-auth"}}))
    obj = wait_condition(cp, ns, "ext", "CacheStoreReady", "False", "StoreSecretNotFound")
    assert cond(obj, "Ready")["reason"] == "StoreSecretNotFound"
    create(cp, ns, secret)
    obj = wait_ready(cp, ns, "ext")
    assert cond(obj, "CacheStoreReady")["reason"] == "ExternalStoreReachable"
    assert get(cp, ns, "deployment", "ext-redis") is None
    env = container(get(cp, ns, "deployment", "ext-router"))["env"]
    assert [e for e in env if e["name"] == "REDIS_PASSWORD"] == [
        {"name": "REDIS_PASSWORD", "valueFrom": {"secretKeyRef": {
            "name": "store-auth", "key": "password"}}}]

    # What two router replicas would publish, again on every look: figures older than a
    # working-set window are stale, however long the operator takes to show them.
    ext, other = StoreKeys(f"{ns}/ext"), StoreKeys(f"{ns}/other")

    def publish() -> None:
        for rid, (prompt, cached, ws, inflight) in {"a": (1000, 700, 20000, 2),
                                                    "b": (1000, 100, 25000, 2)}.items():
            # b's index knows one engine less exactly: the column shows the lesser view
            exact = 3 if rid == "a" else 2
            r.hset(ext.figures(rid), mapping=RouterFigures(
                prompt_tokens=prompt, cached_tokens=cached, working_set_tokens=ws,
                in_flight=inflight, updated_at=time.time(), engines=4, engines_exact=exact,
                engines_degraded=4 - exact).as_hash())

    r.set(ext.owners_prefix("llama") + "123", "x")
    r.set(other.owners_prefix("llama") + "123", "keep")

    def columns() -> list[str] | None:
        publish()
        lines = cp.kubectl("get", "prm", "ext", "-n", ns).stdout.splitlines()
        row = lines[1].split()
        # NAME READY REPLICAS HIT CACHE-PRESSURE EXACT AGE (kubectl reads the API's Table)
        return row if len(row) == 7 else None
    row = cp.wait_for(columns, 30, "figures in kubectl get prm", interval=0.5)
    assert row[:6] == ["ext", "True", "1/1", "0.4", "0.5", "2/4"]
    routing = get(cp, ns, "prm", "ext")["status"]["routing"]
    assert (routing["engines"], routing["exactEngines"], routing["degradedEngines"],
            routing["estimatedEngines"]) == (4, 2, 2, 0)
    wide = cp.kubectl("get", "prm", "ext", "-n", ns, "-o", "wide").stdout.splitlines()
    assert wide[0].split()[-3:] == ["DEGRADED", "ROUTER", "AGE"]
    assert wide[1].split()[-3] == "2"  # the degraded engines, as the router that knows least

    cp.kubectl("delete", "prm", "ext", "-n", ns, "--wait=false")
    cp.wait_for(lambda: get(cp, ns, "prm", "ext") is None, 60, "ext deleted")
    assert r.keys(store_prefix(f"{ns}/ext") + "*") == []
    assert r.get(other.owners_prefix("llama") + "123") == "keep"
    assert "CacheKeysRemoved" in event_reasons(cp, ns, "ext")


def test_operator_restart_converges(cp: Any, ns: str, operator: Operator) -> None:
    create(cp, ns, prm("restart"))
    wait_ready(cp, ns, "restart")
    # Crash mid-reconcile: a new model whose children are only partly there.
    create(cp, ns, prm("midway"))
    cp.wait_for(lambda: children(cp, ns, "midway"), 20, "midway's first children",
                interval=0.05)
    operator.kill()
    # While the operator is down: drift, a scale, a spec change.
    cp.kubectl("delete", "deployment", "restart-router", "-n", ns, "--wait=false")
    cp.kubectl("scale", "prm", "restart", "-n", ns, "--replicas=2")
    cp.kubectl("patch", "prm", "midway", "-n", ns, "--type=merge",
               "-p", '{"spec": {"router": {"replicas": 1}}}')
    operator.start()
    obj = wait_ready(cp, ns, "restart")
    assert obj["status"]["readyReplicas"] == 2
    assert get(cp, ns, "deployment", "restart-router") is not None
    midway = wait_ready(cp, ns, "midway")
    assert get(cp, ns, "deployment", "midway-router")["spec"]["replicas"] == 1
    assert len(children(cp, ns, "midway")) == 12
    assert midway["status"]["observedGeneration"] == midway["metadata"]["generation"]


def test_deletion_garbage_collects_everything(cp: Any, ns: str, operator: Operator) -> None:
    create(cp, ns, prm("gone"))
    wait_ready(cp, ns, "gone")
    assert len(children(cp, ns, "gone")) == 12
    cp.kubectl("delete", "prm", "gone", "-n", ns, "--wait=false")
    # The managed Redis is unreachable from outside the cluster: the finalizer tries a
    # bounded number of times, records why, and lets the deletion go.
    cp.wait_for(lambda: get(cp, ns, "prm", "gone") is None, 60, "the model deleted")
    assert "CacheCleanupAbandoned" in event_reasons(cp, ns, "gone")

    def collected() -> bool:
        left = cp.kubectl("get", "deployments,replicasets,pods,services,configmaps,"
                          "serviceaccounts,roles,rolebindings,poddisruptionbudgets",
                          "-n", ns, "-l", "prefixrouter.io/model=gone", "-o", "name").stdout
        return not left.strip()
    cp.wait_for(collected, 60, "every owned object garbage-collected", interval=0.5)
