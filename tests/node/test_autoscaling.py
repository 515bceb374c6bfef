"""The HPA scales real model-server pods on cache pressure, and back after the window.

Routers publish the working set (distinct prompt blocks of the last 60 s) into the model's
Redis; our adapter serves it through the aggregated API; the HPA created by the operator
divides it by kvCapacityTokens x targetCachePressure per replica and scales the model's scale
subresource; the operator's Deployment brings up real simulator pods. Once the load stops the
working set leaves the window and, after the stabilisation window, the HPA scales back."""

from __future__ import annotations

import time
from collections.abc import Iterator

import product
import pytest
import traffic
from nodesuite import Cluster, scaled

NAMESPACE = "node-hpa"
NAME = "auto"
KV_CAPACITY = 3000
TARGET_PRESSURE = 0.5  # the HPA's target: 1,500 working-set tokens per replica


@pytest.fixture(scope="module")
def autoscaled(node: Cluster, release: dict[str, float]) -> Iterator[dict[str, str]]:
    cp = node.cp
    cp.kubectl("create", "namespace", NAMESPACE, check=False)
    cp.apply(product.model_manifest(
        NAME, NAMESPACE, node.images["product"], replicas=1, routers=1,
        kv_capacity_tokens=KV_CAPACITY, min_replicas=1, max_replicas=3,
        autoscaling={"enabled": True, "targetCachePressure": TARGET_PRESSURE,
                     "targetLoad": 50, "scaleDownStabilizationSeconds": 10}))
    cp.apply(product.router_nodeport(NAME, NAMESPACE))
    product.wait_model_ready(cp, NAMESPACE, NAME, 1, scaled(300))
    try:
        yield {"url": product.nodeport_url(cp, NAME, NAMESPACE)}
    finally:
        product.delete_model(cp, NAME, NAMESPACE, scaled(180))


def test_hpa_scales_real_pods_on_cache_pressure_and_back(node: Cluster,
                                                         autoscaled: dict[str, str]) -> None:
    cp = node.cp

    def scaling_active() -> bool:
        hpa = cp.kubectl_json("get", "hpa", NAME, "-n", NAMESPACE)
        return product.condition(hpa, "ScalingActive") is not None

    cp.wait_for(scaling_active, scaled(120), "the operator's HPA evaluated")
    # 8 tenants x 400-token prompts: a working set of ~3,300 tokens, over 2 replicas' worth
    requests = traffic.tenants_requests(range(800, 808), per_tenant=1000, prompt_tokens=400,
                                        max_tokens=4)
    with product.ScaleTimeline(cp, NAMESPACE, NAME) as timeline:
        load = traffic.Load(autoscaled["url"], product.SERVED_MODEL, traffic.cycle(requests),
                            concurrency=2, timeout=scaled(60)).start()
        try:
            try:
                cp.wait_for(lambda: len(product.ready_pods(cp, NAMESPACE, NAME,
                                                           "model-server")) >= 2,
                            scaled(300), "the HPA's scale-out: 2+ Ready model-server pods")
            except Exception as e:
                raise AssertionError(f"{e}\n{timeline.brief()}") from e
            t_out = time.monotonic() - timeline.t0
        finally:
            results = load.stop()
        t_stop = time.monotonic() - timeline.t0

        def back_to_one() -> bool:
            prm = cp.kubectl_json("get", "prm", NAME, "-n", NAMESPACE)
            return (prm["spec"]["replicas"] == 1
                    and len(product.pods(cp, NAMESPACE, NAME, "model-server")) == 1)

        try:
            cp.wait_for(back_to_one, scaled(360), "the HPA's scale-in back to 1 pod")
        except Exception as e:
            raise AssertionError(f"{e}\n{timeline.brief()}") from e
        t_in = time.monotonic() - timeline.t0
    s = traffic.summary(results)
    assert s["ok"] == s["requests"], (s, [r for r in results if not r.ok][:3])
    peak = max(x.get("ready_pods", 0) for x in timeline.samples)
    sys_note = f"scale-out at {t_out:.0f}s, load stopped {t_stop:.0f}s, back {t_in:.0f}s"
    assert peak >= 2, sys_note
    # the scale-in came from the working set leaving its 60 s window, not before the stop
    assert t_in - t_stop > 30, sys_note
