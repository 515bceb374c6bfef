"""The local control plane is a real one: scheduling, kwok pods, garbage collection,
server-side apply, CRDs with a status subresource, service-account tokens."""

from __future__ import annotations

import json
import uuid

import pytest
from waiting import kubectl_timeout

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
                          "statusReplicasPath": ".status.replicas",
                          "labelSelectorPath": ".status.selector"},
            },
            "schema": {"openAPIV3Schema": {
                "type": "object",
                "properties": {
                    "spec": {"type": "object",
                             "properties": {"replicas": {"type": "integer"}}},
                    "status": {"type": "object",
                               "properties": {"replicas": {"type": "integer"},
                                              "selector": {"type": "string"},
                                              "phase": {"type": "string"}}},
                },
            }},
        }],
    },
}


def test_crd_with_status_subresource(control_plane, namespace):
    cp = control_plane
    cp.apply(CRD)
    cp.kubectl("wait", "--for=condition=Established", f"--timeout={kubectl_timeout(30)}",
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


def test_hpa_scales_a_custom_resource(control_plane, namespace):
    """The HPA controller (5s sync) drives a CR through its scale subresource."""
    cp = control_plane
    cp.apply(CRD)
    cp.kubectl("wait", "--for=condition=Established", f"--timeout={kubectl_timeout(30)}",
               "crd/widgets.cptest.prefixrouter.io")
    cr = {"apiVersion": "cptest.prefixrouter.io/v1", "kind": "Widget",
          "metadata": {"name": "scaled", "namespace": namespace}, "spec": {"replicas": 1}}
    cp.wait_for(lambda: cp.kubectl("apply", "--server-side", "-f", "-", input=json.dumps(cr),
                                   check=False).returncode == 0,
                30, "the Widget kind to be served")
    cp.kubectl("patch", "widget", "scaled", "-n", namespace, "--subresource=status",
               "--type=merge", "-p", '{"status": {"replicas": 1, "selector": "app=scaled"}}')
    hpa = {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
           "metadata": {"name": "scaled", "namespace": namespace},
           "spec": {"scaleTargetRef": {"apiVersion": "cptest.prefixrouter.io/v1",
                                       "kind": "Widget", "name": "scaled"},
                    "minReplicas": 3, "maxReplicas": 5,
                    "metrics": [{"type": "Resource", "resource": {
                        "name": "cpu", "target": {"type": "Utilization",
                                                  "averageUtilization": 50}}}]}}
    cp.apply(hpa)
    cp.wait_for(lambda: cp.kubectl_json("get", "widget", "scaled", "-n", namespace)["spec"]
                ["replicas"] == 3, 60, "the HPA to raise the Widget to minReplicas")


def test_service_account_token(control_plane, namespace):
    token = control_plane.kubectl("create", "token", "default", "-n", namespace).stdout.strip()
    assert token.count(".") == 2  # a signed JWT from the service-account signing key
    review = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
              "spec": {"token": token}}
    out = json.loads(control_plane.kubectl("create", "-o", "json", "-f", "-",
                                           input=json.dumps(review)).stdout)
    assert out["status"]["authenticated"] is True
    assert out["status"]["user"]["username"] == f"system:serviceaccount:{namespace}:default"


AGG_GROUP = "cptest.metrics.prefixrouter.io"


def test_aggregated_api_served_by_a_local_process(control_plane, tmp_path):
    """The aggregation layer works: an APIService backed by a process on this machine, reached
    through an ExternalName Service, gets the front-proxy client cert and the user identity."""
    import base64
    import http.server
    import ssl
    import threading

    from controlplane import free_port

    cp = control_plane
    if not hasattr(cp, "expose_local_service"):
        pytest.skip("needs the local control plane")
    port = free_port()
    dns_name = cp.expose_local_service("cptest-agg", "default", port)
    crt, key = cp.issue_serving_cert("cptest-agg", [dns_name, "localhost", "127.0.0.1"])
    seen: list[dict[str, str]] = []
    gv = f"{AGG_GROUP}/v1beta1"

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            if self.path.split("?")[0] == f"/apis/{gv}":
                body = {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv,
                        "resources": [{"name": "things", "singularName": "thing",
                                       "namespaced": True, "kind": "Thing",
                                       "verbs": ["get", "list"]}]}
            elif self.path.startswith(f"/apis/{gv}/namespaces/"):
                seen.append({"user": self.headers.get("X-Remote-User", ""),
                             "groups": ",".join(self.headers.get_all("X-Remote-Group") or []),
                             "cn": self.connection.getpeercert()["subject"][0][0][1]})
                body = {"kind": "ThingList", "apiVersion": gv, "metadata": {}, "items": []}
            else:
                self.send_response(404)
                self.end_headers()
                return
            raw = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(str(crt), str(key))
    ctx.load_verify_locations(str(cp.front_proxy_ca_file))
    ctx.verify_mode = ssl.CERT_REQUIRED  # only the apiserver's front-proxy client gets in
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        cp.apply({
            "apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
            "metadata": {"name": f"v1beta1.{AGG_GROUP}"},
            "spec": {"group": AGG_GROUP, "version": "v1beta1",
                     "service": {"namespace": "default", "name": "cptest-agg", "port": port},
                     "caBundle": base64.b64encode(cp.ca_file.read_bytes()).decode(),
                     "groupPriorityMinimum": 100, "versionPriority": 100},
        })
        cp.kubectl("wait", "--for=condition=Available", f"--timeout={kubectl_timeout(30)}",
                   f"apiservice/v1beta1.{AGG_GROUP}")
        out = json.loads(cp.kubectl("get", "--raw", f"/apis/{gv}/namespaces/default/things")
                         .stdout)
        assert out["kind"] == "ThingList"
        assert seen and seen[-1]["user"] == "admin" and "system:masters" in seen[-1]["groups"]
        assert seen[-1]["cn"] == "front-proxy-client"
    finally:
        cp.kubectl("delete", "apiservice", f"v1beta1.{AGG_GROUP}", "--ignore-not-found",
                   check=False)
        cp.kubectl("delete", "service", "cptest-agg", "-n", "default", "--ignore-not-found",
                   check=False)
        server.shutdown()
        server.server_close()
