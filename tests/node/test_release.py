"""The chart on a real kubelet: our image runs as the operator and the metrics adapter, and
kube-apiserver reaches the adapter through its ClusterIP Service, as on any cluster."""

from __future__ import annotations

import json

import product
from node import NODE_NAME
from nodesuite import Cluster

from prefix_operator.external_metrics import METRICS


def test_release_pods_run_our_image_on_the_node(node: Cluster, release: dict[str, float]) -> None:
    pods = node.cp.kubectl_json("get", "pods", "-n", product.RELEASE_NAMESPACE)["items"]
    components = {p["metadata"]["labels"].get("app.kubernetes.io/component") for p in pods}
    assert {"operator", "metrics-adapter"} <= components, components
    for pod in pods:
        name = pod["metadata"]["name"]
        assert pod["spec"]["nodeName"] == NODE_NAME, name
        assert product.is_ready(pod), f"{name} is not Ready"
        for status in pod["status"]["containerStatuses"]:
            assert status["image"].endswith(node.images["product"].split("/", 1)[1]), status
            assert status["ready"] and status["state"].get("running"), (name, status)
        # the chart's non-root, read-only settings hold on a real runtime
        assert pod["spec"]["securityContext"]["runAsUser"] == 10001


def test_metrics_api_is_served_through_the_adapter_service(node: Cluster,
                                                           release: dict[str, float]) -> None:
    cp = node.cp
    apiservice = cp.kubectl_json("get", "apiservice", product.APISERVICE)
    assert product.condition(apiservice, "Available") == "True", apiservice["status"]
    ref = apiservice["spec"]["service"]
    svc = cp.kubectl_json("get", "service", ref["name"], "-n", ref["namespace"])
    assert svc["spec"]["type"] == "ClusterIP" and svc["spec"]["clusterIP"].startswith("198.19.")
    # a discovery request goes kube-apiserver -> ClusterIP (kube-proxy) -> the adapter pod,
    # which lists every metric it serves (the HPA test reads them through the same path)
    listing = json.loads(cp.kubectl("get", "--raw",
                                    "/apis/external.metrics.k8s.io/v1beta1").stdout)
    names = sorted(r["name"] for r in listing["resources"])
    assert names == sorted(METRICS), names
