"""Cache-aware scale-down on real pods: the routers publish what only each engine holds, the
operator writes each engine pod's `controller.kubernetes.io/pod-deletion-cost` from it, and
scaling the model down by one removes the pod it marked cheapest.

Two tenants' traffic on three engines: at least one engine holds no tenant of its own (its
value is 0, the fleet's least), so the operator's cheapest pod is known from the published
values without waiting for values that may never separate."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import product
import pytest
import redis
import traffic
from nodesuite import Cluster, scaled

from prefix_operator.deletion_cost import ANNOTATION
from prefix_router.contract import EngineValues, StoreKeys

NAMESPACE = "node-cost"
NAME = "cost"


@pytest.fixture(scope="module")
def three_engines(node: Cluster, release: dict[str, float]) -> Iterator[dict[str, str]]:
    cp = node.cp
    cp.kubectl("create", "namespace", NAMESPACE, check=False)
    cp.apply(product.model_manifest(NAME, NAMESPACE, node.images["product"], replicas=3,
                                    routers=1, kv_capacity_tokens=3000))
    cp.apply(product.router_nodeport(NAME, NAMESPACE))
    product.wait_model_ready(cp, NAMESPACE, NAME, 3, scaled(300))
    try:
        yield {"url": product.nodeport_url(cp, NAME, NAMESPACE)}
    finally:
        product.delete_model(cp, NAME, NAMESPACE, scaled(180))


def published_values(cp: Any) -> dict[str, float]:
    """The engine values every router of the model published, added up (as the operator)."""
    (store,) = product.ready_pods(cp, NAMESPACE, NAME, "cache-store")
    r = redis.Redis(host=store["status"]["podIP"], port=6379, decode_responses=True,
                    socket_timeout=5)
    try:
        out: dict[str, float] = {}
        for key in r.scan_iter(match=StoreKeys(f"{NAMESPACE}/{NAME}").engine_values_prefix + "*"):
            for url, v in EngineValues.from_hash(r.hgetall(key)).values.items():
                out[url] = out.get(url, 0.0) + v
        return out
    finally:
        r.close()


def test_scale_down_removes_the_engine_pod_marked_cheapest(node: Cluster,
                                                          three_engines: dict[str, str]) -> None:
    cp = node.cp
    requests = traffic.tenants_requests(range(900, 902), per_tenant=1000, prompt_tokens=400,
                                        max_tokens=4)
    load = traffic.Load(three_engines["url"], product.SERVED_MODEL, traffic.cycle(requests),
                        concurrency=2, timeout=scaled(60)).start()
    seen: dict[str, Any] = {}
    try:
        def marked() -> str | None:
            """The lowest-cost engine pod once every pod has a cost and it is an engine of
            the least published value (the operator read the routers)."""
            pods = [p for p in product.pods(cp, NAMESPACE, NAME, "model-server")
                    if not p["metadata"].get("deletionTimestamp")]
            costs = {p["metadata"]["name"]: (p["metadata"].get("annotations") or {})
                     .get(ANNOTATION) for p in pods}
            values = published_values(cp)
            seen.update(costs=costs, values=values)
            if len(pods) != 3 or None in costs.values() or sum(values.values()) <= 0:
                return None
            url = {p["metadata"]["name"]: f"http://{p['status']['podIP']}:{product.ENGINE_PORT}"
                   for p in pods}
            value = {name: values.get(url[name], 0.0) for name in url}
            cheapest = min(costs, key=lambda n: int(costs[n] or 0))
            return cheapest if value[cheapest] == min(value.values()) else None

        try:
            cheapest = cp.wait_for(marked, scaled(180), "deletion costs on the engine pods",
                                   interval=2)
        except Exception as e:
            raise AssertionError(f"{e}; last seen {seen}") from e
    finally:
        results = load.stop()
    s = traffic.summary(results)
    assert s["ok"] == s["requests"], (s, [r for r in results if not r.ok][:3])
    before = {p["metadata"]["name"] for p in product.pods(cp, NAMESPACE, NAME, "model-server")}
    cp.kubectl("scale", "prm", NAME, "-n", NAMESPACE, "--replicas=2")

    def two_left() -> set[str] | None:
        names = {p["metadata"]["name"] for p in product.pods(cp, NAMESPACE, NAME, "model-server")
                 if not p["metadata"].get("deletionTimestamp")}
        return names if len(names) == 2 else None

    left = cp.wait_for(two_left, scaled(120), "one engine pod removed")
    assert before - left == {cheapest}, seen
