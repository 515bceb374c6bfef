"""Cache-aware scale-down on a real control plane (kube-controller-manager's ReplicaSet
controller, kwok nodes): the operator ranks the engine pods by the value the routers publish
for each (what only it holds) and writes their deletion costs; scaling the model down by one
removes the pod it marked cheapest, not the one the ReplicaSet controller would pick alone.
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
from processes import Operator
from redis_process import running_redis

from prefix_operator.deletion_cost import ANNOTATION
from prefix_router.contract import EngineValues, StoreKeys

pytestmark = pytest.mark.k8s


@pytest.fixture(scope="module")
def ns(cp: Any) -> Iterator[str]:
    name = f"dc-{uuid.uuid4().hex[:6]}"
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
    binary = os.environ.get("REDIS_SERVER") or shutil.which("redis-server")
    if not binary:
        pytest.skip("redis-server not installed")
    with running_redis(binary, "s3cret") as port:
        yield "127.0.0.1", port, "s3cret"


def engine_pods(cp: Any, ns: str, name: str) -> list[dict[str, Any]]:
    items = cp.kubectl_json("get", "pods", "-n", ns, "-l",
                            f"prefixrouter.io/model={name},"
                            "app.kubernetes.io/component=model-server")["items"]
    return [p for p in items if not p["metadata"].get("deletionTimestamp")]


def running(cp: Any, ns: str, name: str, n: int) -> list[dict[str, Any]] | None:
    pods = engine_pods(cp, ns, name)
    ok = [p for p in pods if p.get("status", {}).get("podIP")
          and any(c["type"] == "Ready" and c["status"] == "True"
                  for c in p["status"].get("conditions") or [])]
    return ok if len(pods) == n and len(ok) == n else None


def test_scale_down_removes_the_engine_the_operator_marked_cheapest(
        cp: Any, ns: str, operator: Operator, store: tuple[str, int, str]) -> None:
    host, port, password = store
    r = redis.Redis(host=host, port=port, password=password, decode_responses=True)
    cp.kubectl("create", "-n", ns, "-f", "-", input=json.dumps(
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "auth"},
         "data": {"password": base64.b64encode(password.encode()).decode()}}))
    cp.kubectl("create", "-n", ns, "-f", "-", input=json.dumps({
        "apiVersion": "prefixrouter.io/v1alpha1", "kind": "PrefixRoutedModel",
        "metadata": {"name": "cold"},
        "spec": {"model": {"name": "llama", "source": "meta-llama/Llama-3.1-8B-Instruct"},
                 "replicas": 2,
                 "cacheStore": {"type": "external", "url": f"redis://{host}:{port}/0",
                                "passwordSecretRef": {"name": "auth"}}}}))
    first = cp.wait_for(lambda: running(cp, ns, "cold", 2), 90, "two engine pods Ready")
    # One more, made later: the ReplicaSet controller alone would remove a pod that shares a
    # node with another, newest first, so the cheapest is an older pod alone on its node.
    cp.kubectl("scale", "prm", "cold", "-n", ns, "--replicas=3")
    pods = cp.wait_for(lambda: running(cp, ns, "cold", 3), 90, "three engine pods Ready")
    per_node: dict[str, int] = {}
    for p in pods:
        per_node[p["spec"]["nodeName"]] = per_node.get(p["spec"]["nodeName"], 0) + 1
    first_names = {p["metadata"]["name"] for p in first}
    cheapest = min((p for p in pods if p["metadata"]["name"] in first_names),
                   key=lambda p: (per_node[p["spec"]["nodeName"]], p["metadata"]["name"]))
    name_of = {f"http://{p['status']['podIP']}:8000": p["metadata"]["name"] for p in pods}
    values = {url: (0.5 if name_of[url] == cheapest["metadata"]["name"] else 800.0 + i * 400)
              for i, url in enumerate(sorted(name_of))}
    keys = StoreKeys(f"{ns}/cold")

    def marked() -> dict[str, int] | None:
        # what a router replica would publish, again on every look (values expire)
        r.hset(keys.engine_values("ra"), mapping=EngineValues(values, time.time()).as_hash())
        costs = {p["metadata"]["name"]: (p["metadata"].get("annotations") or {}).get(ANNOTATION)
                 for p in engine_pods(cp, ns, "cold")}
        if len(costs) != 3 or None in costs.values():
            return None
        ints = {k: int(v) for k, v in costs.items() if v is not None}
        return ints if min(ints, key=ints.__getitem__) == cheapest["metadata"]["name"] else None

    costs = cp.wait_for(marked, 60, "deletion costs on every engine pod", interval=0.5)
    assert len(set(costs.values())) == 3  # a strict order, coldest first
    cp.kubectl("scale", "prm", "cold", "-n", ns, "--replicas=2")
    left = cp.wait_for(lambda: running(cp, ns, "cold", 2), 90, "two engine pods left")
    gone = {p["metadata"]["name"] for p in pods} - {p["metadata"]["name"] for p in left}
    assert gone == {cheapest["metadata"]["name"]}
