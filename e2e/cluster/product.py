"""Our product on the real node, as a user installs and uses it: the chart with helm, a
PrefixRoutedModel whose model servers are the simulator (`engine-sim` from our image, a
`custom` engine), a NodePort Service for its routers, and look-ups of its pods.

Shared by tests/node and e2e/node_figures.py. `cp` is anything with kubectl, kubectl_json,
apply and wait_for (controlplane.ControlPlane, controlplane.ExistingCluster).
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
import urllib.request
from typing import Any

from controlplane import REPO_ROOT
from node import NODE_IP

CHART = REPO_ROOT / "charts" / "prefix-router"
RELEASE = "prefix-router"
RELEASE_NAMESPACE = "prefix-router-system"
APISERVICE = "v1beta1.external.metrics.k8s.io"
MODEL_LABEL = "prefixrouter.io/model"
COMPONENT_LABEL = "app.kubernetes.io/component"
ENGINE_PORT = 8000
SERVED_MODEL = "sim-model"


def helm_binary() -> str:
    """hack/ensure-helm.sh --check: the cached helm (`make helm` builds it)."""
    proc = subprocess.run(["bash", str(REPO_ROOT / "hack" / "ensure-helm.sh"), "--check"],
                          capture_output=True, text=True, check=False, timeout=60)
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"no helm: {proc.stderr.strip()} (run `make helm`)")
    return lines[-1]


def install_chart(cp: Any, helm: str, images: dict[str, str], *, timeout: str = "600s",
                  extra: tuple[str, ...] = ()) -> float:
    """helm upgrade --install of the chart with our images, the APIService on and short
    operator timers; waits for the release's pods and the APIService. Returns the seconds."""
    t0 = time.monotonic()
    repo, _, tag = images["product"].rpartition(":")
    cmd = [helm, "upgrade", "--install", RELEASE, str(CHART), "--namespace", RELEASE_NAMESPACE,
           "--create-namespace", "--kubeconfig", str(cp.kubeconfig),
           "--set", f"image.repository={repo}", "--set", f"image.tag={tag}",
           "--set", "image.pullPolicy=Never",
           "--set", f"operator.redisImage={images['redis']}",
           "--set", "adapter.apiService.enabled=true",
           "--set", "operator.replicas=1",
           "--set", "operator.resyncSeconds=10", "--set", "operator.figuresSeconds=2",
           "--set", "adapter.staleAfterSeconds=30",
           "--wait", "--timeout", timeout, *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"helm install failed ({proc.returncode}):\n{proc.stderr}\n"
                           f"{describe(cp, RELEASE_NAMESPACE)}")
    cp.wait_for(lambda: condition(cp.kubectl_json("get", "apiservice", APISERVICE),
                                  "Available") == "True", 180, f"APIService {APISERVICE} Available")
    return time.monotonic() - t0


def uninstall_chart(cp: Any, helm: str) -> None:
    subprocess.run([helm, "uninstall", RELEASE, "--namespace", RELEASE_NAMESPACE, "--wait",
                    "--kubeconfig", str(cp.kubeconfig)], capture_output=True, check=False,
                   timeout=300)
    cp.kubectl("delete", "namespace", RELEASE_NAMESPACE, "--ignore-not-found", "--wait=false",
               check=False)


def condition(obj: dict[str, Any], kind: str) -> str | None:
    for c in obj.get("status", {}).get("conditions", []) or []:
        if c.get("type") == kind:
            return c.get("status")
    return None


def describe(cp: Any, namespace: str) -> str:
    """Pods and recent events of a namespace, for failure messages."""
    pods = cp.kubectl("get", "pods", "-n", namespace, "-o", "wide", check=False).stdout
    events = cp.kubectl("get", "events", "-n", namespace, "--sort-by=.lastTimestamp",
                        check=False).stdout.splitlines()[-25:]
    return f"pods in {namespace}:\n{pods}\nevents:\n" + "\n".join(events)


# --------------------------------------------------------------------------- a model


def engine_args(kv_capacity_tokens: int, time_scale: float = 1.0,
                profile: str = "fast") -> list[str]:
    """The simulator with a timing profile (`fast`: a 2 ms step, 2 us a prefill token;
    `llama-3.1-70b-h100`: 15 ms and 79 us), every duration times time_scale."""
    return ["engine-sim", "--host", "0.0.0.0", "--port", str(ENGINE_PORT),
            "--model", SERVED_MODEL, "--profile", profile, "--time-scale", str(time_scale),
            "--kv-capacity-tokens", str(kv_capacity_tokens), "--block-size", "16"]


def model_manifest(name: str, namespace: str, image: str, *, replicas: int = 2,
                   routers: int = 2, kv_capacity_tokens: int = 20_000,
                   autoscaling: dict[str, Any] | None = None, time_scale: float = 1.0,
                   profile: str = "fast", min_replicas: int = 1,
                   max_replicas: int = 4) -> dict[str, Any]:
    """A PrefixRoutedModel served by the simulator from our image, sized for a 2-core node."""
    return {
        "apiVersion": "prefixrouter.io/v1alpha1", "kind": "PrefixRoutedModel",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "replicas": replicas, "minReplicas": min_replicas, "maxReplicas": max_replicas,
            "model": {"name": SERVED_MODEL, "source": "hf://prefixrouter/sim-model"},
            "engine": {"type": "custom", "image": image, "port": ENGINE_PORT,
                       "startupTimeoutSeconds": 120,
                       "args": engine_args(kv_capacity_tokens, time_scale, profile)},
            "resources": {"gpus": 0, "cpu": "50m", "memory": "192Mi",
                          "sharedMemorySize": "16Mi"},
            "router": {"replicas": routers, "cpu": "50m", "memory": "256Mi",
                       "kvCapacityTokens": kv_capacity_tokens},
            "cacheStore": {"type": "managed", "maxMemoryMiB": 64},
            "autoscaling": autoscaling or {"enabled": False},
        },
    }


def delete_model(cp: Any, name: str, namespace: str, timeout: float) -> None:
    """Delete the model first (its finalizer clears its Redis keys while Redis still runs),
    then its namespace."""
    cp.kubectl("delete", "prm", name, "-n", namespace, "--ignore-not-found",
               f"--timeout={int(timeout)}s", check=False, timeout=timeout + 30)
    cp.kubectl("delete", "namespace", namespace, "--ignore-not-found",
               f"--timeout={int(timeout)}s", check=False, timeout=timeout + 30)


def router_nodeport(name: str, namespace: str) -> dict[str, Any]:
    """A NodePort Service over the model's router pods: how a client off the cluster (this
    machine) reaches them, balanced by kube-proxy over the Ready ones."""
    return {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": f"{name}-router-nodeport", "namespace": namespace},
        "spec": {"type": "NodePort",
                 "selector": {MODEL_LABEL: name, COMPONENT_LABEL: "router"},
                 "ports": [{"name": "http", "port": 8080, "targetPort": 8080,
                            "protocol": "TCP"}]},
    }


def nodeport_url(cp: Any, name: str, namespace: str, timeout: float = 60.0) -> str:
    """The routers' NodePort URL, once kube-proxy sends it to a Ready router."""
    svc = cp.kubectl_json("get", "service", f"{name}-router-nodeport", "-n", namespace)
    url = f"http://{NODE_IP}:{svc['spec']['ports'][0]['nodePort']}"

    def answers() -> bool:
        with urllib.request.urlopen(f"{url}/readyz", timeout=2) as r:
            return r.status == 200

    cp.wait_for(answers, timeout, f"{url} answering (kube-proxy's rules for the NodePort)")
    return url


def pods(cp: Any, namespace: str, model: str, component: str) -> list[dict[str, Any]]:
    sel = f"{MODEL_LABEL}={model},{COMPONENT_LABEL}={component}"
    return cp.kubectl_json("get", "pods", "-n", namespace, "-l", sel)["items"]


def is_ready(pod: dict[str, Any]) -> bool:
    return (not pod["metadata"].get("deletionTimestamp")
            and condition(pod, "Ready") == "True")


def ready_pods(cp: Any, namespace: str, model: str, component: str) -> list[dict[str, Any]]:
    return [p for p in pods(cp, namespace, model, component) if is_ready(p)]


def engine_urls(cp: Any, namespace: str, model: str) -> dict[str, str]:
    """Ready model-server pods -> their own base URL (pod IPs are routed to this machine)."""
    return {p["metadata"]["name"]: f"http://{p['status']['podIP']}:{ENGINE_PORT}"
            for p in ready_pods(cp, namespace, model, "model-server")}


def wait_model_ready(cp: Any, namespace: str, name: str, replicas: int, timeout: float) -> None:
    """The model Ready in its status, with `replicas` model servers and all its routers Ready
    (and no pod of either on its way out)."""
    def ready() -> bool:
        prm = cp.kubectl_json("get", "prm", name, "-n", namespace)
        st = prm.get("status", {})
        routers = prm["spec"].get("router", {}).get("replicas", 2)
        return (condition(prm, "Ready") == "True"
                and st.get("observedGeneration") == prm["metadata"]["generation"]
                and len(ready_pods(cp, namespace, name, "model-server")) == replicas
                and len(pods(cp, namespace, name, "model-server")) == replicas
                and len(ready_pods(cp, namespace, name, "router")) == routers
                and len(pods(cp, namespace, name, "router")) == routers)

    try:
        cp.wait_for(ready, timeout, f"{namespace}/{name}: Ready with {replicas} model servers")
    except Exception as e:
        raise AssertionError(f"{e}\n{describe(cp, namespace)}") from e


def ready_seconds(pod: dict[str, Any]) -> float | None:
    """Seconds from the pod's creation to its Ready condition."""
    from datetime import datetime

    def ts(s: str) -> float:
        return datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()

    for c in pod.get("status", {}).get("conditions", []) or []:
        if c["type"] == "Ready" and c["status"] == "True":
            return ts(c["lastTransitionTime"]) - ts(pod["metadata"]["creationTimestamp"])
    return None


def external_metric(cp: Any, namespace: str, metric: str, model: str) -> float | None:
    """The value the aggregated API serves (through kube-apiserver, our adapter behind it)."""
    sel = f"{MODEL_LABEL}%3D{model}"
    raw = cp.kubectl("get", "--raw", f"/apis/external.metrics.k8s.io/v1beta1/namespaces/"
                     f"{namespace}/{metric}?labelSelector={sel}", check=False)
    if raw.returncode != 0:
        return None
    items = json.loads(raw.stdout).get("items", [])
    if not items:
        return None
    value = items[0]["value"]
    return float(value[:-1]) / 1000 if value.endswith("m") else float(value)


class ScaleTimeline:
    """Samples of a model's HPA, spec, pods and working set every `period` s, in a background
    thread (`with ScaleTimeline(cp, ns, name) as tl: ...`; tl.samples, tl.t0 its clock)."""

    def __init__(self, cp: Any, namespace: str, name: str, period: float = 2.0) -> None:
        self.cp, self.namespace, self.name, self.period = cp, namespace, name, period
        self._working_set_metric = ""
        self.samples: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="timeline", daemon=True)
        self.t0 = time.monotonic()

    def __enter__(self) -> ScaleTimeline:
        self.t0 = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)

    def now(self) -> float:
        return round(time.monotonic() - self.t0, 1)

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            try:
                self.samples.append(self.sample())
            except Exception as e:  # a busy apiserver: note it, keep sampling
                self.samples.append({"t": self.now(), "error": str(e)[:200]})

    def sample(self) -> dict[str, Any]:
        ns, name = self.namespace, self.name
        hpa_obj = self.cp.kubectl_json("get", "hpa", name, "-n", ns)
        hpa = hpa_obj.get("status", {})
        if not self._working_set_metric:
            # the metric the operator's HPA scales on, by the name it gives it
            self._working_set_metric = next(
                m["external"]["metric"]["name"] for m in hpa_obj["spec"]["metrics"]
                if "working_set" in m["external"]["metric"]["name"])
        prm = self.cp.kubectl_json("get", "prm", name, "-n", ns)
        servers = pods(self.cp, ns, name, "model-server")
        return {"t": self.now(),
                "desired": hpa.get("desiredReplicas"),
                "spec_replicas": prm["spec"]["replicas"],
                "pods": len(servers),
                "ready_pods": sum(is_ready(p) for p in servers),
                "working_set": external_metric(self.cp, ns, self._working_set_metric, name)}

    def brief(self, last: int = 40) -> str:
        return "\n".join(str(s) for s in self.samples[-last:])
