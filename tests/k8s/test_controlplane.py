"""The local control plane is a real one: scheduling, kwok pods, garbage collection,
server-side apply, CRDs with a status subresource, service-account tokens."""

from __future__ import annotations

import json
import uuid

import pytest

pytestmark = pytest.mark.k8s


@pytest.fixture
def namespace(control_plane):
    name = f"t-{uuid.uuid4().hex[:8]}"
    control_plane.kubectl("create", "namespace", name)
    # pods are admitted only once the namespace's default ServiceAccount exists
    control_plane.wait_for(
        lambda: control_plane.kubectl("get", "serviceaccount", "default", "-n", name,
                                      check=False).returncode == 0,
        30, f"the default ServiceAccount in {name}")
    yield name
    control_plane.kubectl("delete", "namespace", name, "--wait=false", check=False)


def test_fake_gpu_nodes_are_ready(control_plane):
    nodes = control_plane.kubectl_json("get", "nodes", "-l", "type=kwok")["items"]
    assert len(nodes) >= 2
    for node in nodes:
        assert node["status"]["allocatable"]["nvidia.com/gpu"] == "8"
        ready = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
        assert ready and ready[0]["status"] == "True"


def test_deployment_pods_run_and_are_garbage_collected(control_plane, namespace):
    cp = control_plane
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web", "namespace": namespace},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{
                    "name": "web",
                    "image": "example.invalid/web:1",
                    "resources": {"limits": {"nvidia.com/gpu": "1"}},
                }]},
            },
        },
    }
    cp.apply(deployment)

    def two_ready_pods():
        pods = cp.kubectl_json("get", "pods", "-n", namespace, "-l", "app=web")["items"]
        ok = [
            p for p in pods
            if p["status"].get("phase") == "Running"
            and p["spec"].get("nodeName") in cp.node_names
            and any(c["type"] == "Ready" and c["status"] == "True"
                    for c in p["status"].get("conditions", []))
        ]
        return ok if len(ok) == 2 else None

    pods = cp.wait_for(two_ready_pods, 60, "2 Running+Ready pods of the Deployment")
    assert all(p["status"].get("podIP") for p in pods)
    cp.wait_for(
        lambda: cp.kubectl_json("get", "deployment", "web", "-n", namespace)["status"]
        .get("readyReplicas") == 2,
        30, "deployment readyReplicas == 2")
    rs = cp.kubectl_json("get", "replicasets", "-n", namespace, "-l", "app=web")["items"]
    assert len(rs) == 1
    assert rs[0]["metadata"]["ownerReferences"][0]["kind"] == "Deployment"

    cp.kubectl("delete", "deployment", "web", "-n", namespace, "--wait=false")

    def all_gone():
        left = cp.kubectl_json("get", "replicasets,pods", "-n", namespace, "-l", "app=web")
        return not left["items"]

    cp.wait_for(all_gone, 60, "the ReplicaSet and pods to be garbage-collected")


def test_server_side_apply_with_field_manager(control_plane, namespace):
    cp = control_plane
    cm = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "ssa", "namespace": namespace},
        "data": {"owner": "a"},
    }
    cp.kubectl("apply", "--server-side", "--field-manager=manager-a", "-f", "-",
               input=json.dumps(cm))
    obj = cp.kubectl_json("get", "configmap", "ssa", "-n", namespace, "--show-managed-fields")
    managers = {(m["manager"], m["operation"]) for m in obj["metadata"]["managedFields"]}
    assert ("manager-a", "Apply") in managers

    cm["data"]["owner"] = "b"
    conflict = cp.kubectl("apply", "--server-side", "--field-manager=manager-b", "-f", "-",
                          input=json.dumps(cm), check=False)
    assert conflict.returncode != 0 and "conflict" in conflict.stderr.lower()
    cp.kubectl("apply", "--server-side", "--field-manager=manager-b", "--force-conflicts",
               "-f", "-", input=json.dumps(cm))
    obj = cp.kubectl_json("get", "configmap", "ssa", "-n", namespace, "--show-managed-fields")
    assert obj["data"]["owner"] == "b"
    assert "manager-b" in {m["manager"] for m in obj["metadata"]["managedFields"]}


CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "widgets.cptest.prefixrouter.io"},
    "spec": {
        "group": "cptest.prefixrouter.io",
        "scope": "Namespaced",
        "names": {"plural": "widgets", "singular": "widget", "kind": "Widget",
                  "shortNames": ["wdg"]},
        "versions": [{
            "name": "v1",
            "served": True,
            "storage": True,
            "subresources": {
                "status": {},
                "scale": {"specReplicasPath": ".spec.replicas",
                          "statusReplicasPath": ".status.replicas"},
            },
            "schema": {"openAPIV3Schema": {
                "type": "object",
                "properties": {
                    "spec": {"type": "object",
                             "properties": {"replicas": {"type": "integer"}}},
                    "status": {"type": "object",
                               "properties": {"replicas": {"type": "integer"},
                                              "phase": {"type": "string"}}},
                },
            }},
        }],
    },
}


def test_crd_with_status_subresource(control_plane, namespace):
    cp = control_plane
    cp.apply(CRD)
    cp.kubectl("wait", "--for=condition=Established", "--timeout=30s",
               "crd/widgets.cptest.prefixrouter.io")
    cr = {"apiVersion": "cptest.prefixrouter.io/v1", "kind": "Widget",
          "metadata": {"name": "w1", "namespace": namespace}, "spec": {"replicas": 1}}
    cp.wait_for(lambda: cp.kubectl("apply", "--server-side", "-f", "-", input=json.dumps(cr),
                                   check=False).returncode == 0,
                30, "the Widget kind to be served")

    cp.kubectl("patch", "widget", "w1", "-n", namespace, "--subresource=status",
               "--type=merge", "-p", '{"status": {"phase": "Ready", "replicas": 1}}')
    obj = cp.kubectl_json("get", "widget", "w1", "-n", namespace)
    assert obj["status"] == {"phase": "Ready", "replicas": 1}
    generation = obj["metadata"]["generation"]

    # status is ignored on the main resource, spec on the status subresource
    cp.kubectl("patch", "widget", "w1", "-n", namespace, "--type=merge",
               "-p", '{"status": {"phase": "Bogus"}}')
    assert cp.kubectl_json("get", "widget", "w1", "-n", namespace)["status"]["phase"] == "Ready"
    assert cp.kubectl_json("get", "widget", "w1", "-n", namespace)["metadata"][
        "generation"] == generation

    # the scale subresource (what an HPA targets)
    cp.kubectl("scale", "widget", "w1", "-n", namespace, "--replicas=3")
    assert cp.kubectl_json("get", "widget", "w1", "-n", namespace)["spec"]["replicas"] == 3


def test_service_account_token(control_plane, namespace):
    token = control_plane.kubectl("create", "token", "default", "-n", namespace).stdout.strip()
    assert token.count(".") == 2  # a signed JWT from the service-account signing key
    review = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
              "spec": {"token": token}}
    out = json.loads(control_plane.kubectl("create", "-o", "json", "-f", "-",
                                           input=json.dumps(review)).stdout)
    assert out["status"]["authenticated"] is True
    assert out["status"]["user"]["username"] == f"system:serviceaccount:{namespace}:default"
