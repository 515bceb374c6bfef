"""The real node's figures: `python e2e/node_figures.py` (root; `make image` first).

Brings up the real single-node cluster (or uses the one `make cluster` runs), installs the
chart with our image, and measures, on real pods:

1. build steps, cached: hack/cluster/ensure-binaries.sh, hack/ensure-helm.sh,
   hack/image/build.sh (each timed as `make test` runs it, everything already built);
2. the cluster's start (control plane, containerd, image import, node Ready, kube-proxy,
   CoreDNS) and the helm install;
3. pod Ready times (creation -> Ready) of every pod it ran;
4. `prefix` against `round-robin` through a router Service, the same requests: 3 simulator
   pods with a small KV cache (6,000 tokens each) and 12 tenants' system prompts of 1,000
   tokens, so the working set fits the fleet only if each prefix stays with one engine. The
   hit rate is the engines' own counters (vllm:prefix_cache_hits / queries); TTFT is the
   client's, through the Service. The round-robin routers are a second Deployment of the
   same router image and config with `--policy round-robin --store local`; the engines'
   caches are emptied (POST /reset) before each run;
5. the HPA scaling real pods on cache pressure and back: a sample every 2 s.

Writes figures.json and hpa-timeline.png into bench/results/real-node/ (or --out). The JSON
records the command, the host, the commit and whether the code differed from it
(bench/provenance.py): run it on committed code.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import os
import platform
import random
import subprocess
import sys
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent / "cluster"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import cluster as node_cluster
import product
import traffic
from controlplane import REPO_ROOT, ExistingCluster

from bench.provenance import stamp

OUT = REPO_ROOT / "bench" / "results" / "real-node"
CMP_NS, CMP = "figures-cmp", "cmp"
# Engine timing for the comparison: Llama-3.1-70B on 4 x H100 (sim/engine_sim/profiles.py), so
# that a miss's prefill (79 us a token) shows in TTFT as it would on the hardware.
PROFILE = "llama-3.1-70b-h100"
HPA_NS, HPA = "figures-hpa", "auto"


def timed(cmd: list[str]) -> float:
    t0 = time.monotonic()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   cwd=REPO_ROOT)
    return round(time.monotonic() - t0, 2)


def cached_builds() -> dict[str, float]:
    return {
        "ensure-binaries (k8s, etcd, kwok, kubelet, kube-proxy, coredns)":
            timed(["bash", "hack/cluster/ensure-binaries.sh"]),
        "ensure-helm": timed(["bash", "hack/ensure-helm.sh"]),
        "images (pause, coredns, redis, product)": timed(["bash", "hack/image/build.sh"]),
    }


def pod_ready_times(cp: Any, namespaces: list[str]) -> list[dict[str, Any]]:
    out = []
    for ns in namespaces:
        for pod in cp.kubectl_json("get", "pods", "-n", ns)["items"]:
            labels = pod["metadata"].get("labels", {})
            out.append({"namespace": ns, "pod": pod["metadata"]["name"],
                        "component": labels.get("app.kubernetes.io/component")
                        or labels.get("k8s-app", ""),
                        "ready_seconds": product.ready_seconds(pod)})
    return out


# --------------------------------------------------------------------------- prefix vs rr


def round_robin_routers(cp: Any, ns: str, name: str) -> str:
    """A second router Deployment, same image and config, `--policy round-robin`; returns
    the URL of a NodePort Service to it."""
    d = cp.kubectl_json("get", "deployment", f"{name}-router", "-n", ns)
    labels = {"app": f"{name}-router-rr"}
    template = copy.deepcopy(d["spec"]["template"])
    template["metadata"] = {"labels": labels}
    c = template["spec"]["containers"][0]
    c["args"] = [*c["args"], "--policy", "round-robin", "--store", "local"]
    rr = {"apiVersion": "apps/v1", "kind": "Deployment",
          "metadata": {"name": f"{name}-router-rr", "namespace": ns},
          "spec": {"replicas": 1, "selector": {"matchLabels": labels}, "template": template}}
    svc = {"apiVersion": "v1", "kind": "Service",
           "metadata": {"name": f"{name}-router-rr", "namespace": ns},
           "spec": {"type": "NodePort", "selector": labels,
                    "ports": [{"port": 8080, "targetPort": 8080}]}}
    cp.apply(rr)
    cp.apply(svc)
    cp.kubectl("rollout", "status", f"deployment/{name}-router-rr", "-n", ns, "--timeout=300s",
               timeout=330)
    port = cp.kubectl_json("get", "service", f"{name}-router-rr", "-n", ns)["spec"]["ports"][0]
    return f"http://{node_cluster.nodemod.NODE_IP}:{port['nodePort']}"


def reset_engines(urls: dict[str, str]) -> None:
    for url in urls.values():
        req = urllib.request.Request(f"{url}/reset", data=b"", method="POST")
        with urllib.request.urlopen(req, timeout=10) as r:
            r.read()


def compare(cp: Any, images: dict[str, str]) -> dict[str, Any]:
    cp.kubectl("create", "namespace", CMP_NS, check=False)
    cp.apply(product.model_manifest(CMP, CMP_NS, images["product"], replicas=3, routers=2,
                                    kv_capacity_tokens=6000, profile=PROFILE))
    cp.apply(product.router_nodeport(CMP, CMP_NS))
    product.wait_model_ready(cp, CMP_NS, CMP, 3, 300)
    urls = {"prefix": product.nodeport_url(cp, CMP, CMP_NS),
            "round-robin": round_robin_routers(cp, CMP_NS, CMP)}
    engines = product.engine_urls(cp, CMP_NS, CMP)
    requests = traffic.tenants_requests(range(12), per_tenant=15, prompt_tokens=1000,
                                        max_tokens=16)
    # one order for both policies, shuffled: in tenant order round-robin would pin each
    # tenant to one engine by accident (12 tenants over 3 engines)
    random.Random(11).shuffle(requests)
    out: dict[str, Any] = {"engines": len(engines), "engine_kv_tokens": 6000, "tenants": 12,
                           "prompt_tokens": 1000, "max_tokens": 16, "profile": PROFILE,
                           "requests": len(requests), "concurrency": 4}
    for policy, url in urls.items():
        reset_engines(engines)
        before = {n: traffic.engine_counters(u) for n, u in engines.items()}
        results = asyncio.run(traffic.run(url, product.SERVED_MODEL, requests, concurrency=4))
        after = {n: traffic.engine_counters(u) for n, u in engines.items()}
        delta = {n: after[n] - before[n] for n in engines}
        fleet = traffic.total(delta)
        out[policy] = {**traffic.summary(results),
                       "engine_hit_rate": round(fleet.hit_rate, 4),
                       "engine_requests": {n: d.success for n, d in delta.items()}}
    out["pod_ready"] = pod_ready_times(cp, [CMP_NS])
    product.delete_model(cp, CMP, CMP_NS, 240)
    return out


# --------------------------------------------------------------------------- HPA


def hpa_timeline(cp: Any, images: dict[str, str]) -> dict[str, Any]:
    kv, target, rate = 8000, 0.5, 4.0
    cp.kubectl("create", "namespace", HPA_NS, check=False)
    cp.apply(product.model_manifest(
        HPA, HPA_NS, images["product"], replicas=1, routers=1, kv_capacity_tokens=kv,
        min_replicas=1, max_replicas=4,
        autoscaling={"enabled": True, "targetCachePressure": target, "targetLoad": 50,
                     "scaleDownStabilizationSeconds": 10}))
    cp.apply(product.router_nodeport(HPA, HPA_NS))
    product.wait_model_ready(cp, HPA_NS, HPA, 1, 300)
    cp.wait_for(lambda: product.condition(cp.kubectl_json("get", "hpa", HPA, "-n", HPA_NS),
                                          "ScalingActive") is not None, 180, "HPA evaluated")
    url = product.nodeport_url(cp, HPA, HPA_NS)
    # 4 requests a second over a growing set of tenants (500-token system prompts): 2 at
    # first, 2 more every 20 s, up to 12. The working set (distinct blocks of the last 60 s:
    # the tenants' prompts plus each request's own question) grows, and with it the replicas.
    requests = traffic.ramp(900, start=2, step=2, every=20, most=12, prompt_tokens=500,
                            max_tokens=4)
    with product.ScaleTimeline(cp, HPA_NS, HPA) as tl:
        load = traffic.Load(url, product.SERVED_MODEL, requests, concurrency=2, rate=rate)
        load.start()
        t_start = tl.now()
        cp.wait_for(lambda: len(product.ready_pods(cp, HPA_NS, HPA, "model-server")) >= 2,
                    420, "a scale-out")
        # the ramp's last step is at 100 s: hold the load until 160 s
        cp.wait_for(lambda: tl.now() > t_start + 160, 240, "the plateau")
        results = load.stop()
        t_stop = tl.now()
        cp.wait_for(lambda: cp.kubectl_json("get", "prm", HPA, "-n", HPA_NS)["spec"]["replicas"]
                    == 1 and len(product.pods(cp, HPA_NS, HPA, "model-server")) == 1,
                    600, "scale-in to 1 pod")
        hold = tl.now() + 10  # a few samples at rest
        cp.wait_for(lambda: tl.now() > hold, 60, "samples at rest")
        t_back = tl.now()
    ready = pod_ready_times(cp, [HPA_NS])
    product.delete_model(cp, HPA, HPA_NS, 240)
    return {"kv_capacity_tokens": kv, "target_cache_pressure": target,
            "target_tokens_per_replica": kv * target, "window_seconds": 60, "rate": rate,
            "tenants": "2, +2 every 20 s, up to 12 (500 tokens each)",
            "scale_down_stabilization_seconds": 10, "load_start": t_start, "load_stop": t_stop,
            "back_to_one": t_back, "load": traffic.summary(results), "samples": tl.samples,
            "pod_ready": ready}


def plot(hpa: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = [x for x in hpa["samples"] if "error" not in x]
    t = [x["t"] for x in s]
    fig, ax = plt.subplots(figsize=(9, 5.2))
    ax.step(t, [x["desired"] or 0 for x in s], where="post", label="HPA desired replicas")
    ax.step(t, [x["spec_replicas"] for x in s], where="post", label="model spec.replicas",
            linestyle="--")
    ax.step(t, [x["ready_pods"] for x in s], where="post", label="Ready model-server pods",
            linewidth=2.5)
    ax.set_xlabel("seconds")
    ax.set_ylabel("replicas / pods")
    ax.set_ylim(0, max(x["spec_replicas"] for x in s) + 1)
    ax.axvspan(hpa["load_start"], hpa["load_stop"], color="0.92", label="load on")
    ax2 = ax.twinx()
    ax2.plot(t, [x["working_set"] for x in s], color="tab:red", alpha=0.6,
             label="working set (tokens, via the aggregated API)")
    ax2.axhline(hpa["target_tokens_per_replica"], color="tab:red", linestyle=":", alpha=0.6,
                label="target per replica")
    ax2.set_ylabel("tokens")
    lines = ax.get_legend_handles_labels()
    lines2 = ax2.get_legend_handles_labels()
    ax.legend(lines[0] + lines2[0], lines[1] + lines2[1], loc="upper center", fontsize=8,
              bbox_to_anchor=(0.5, -0.14), ncol=3, frameon=False)
    ax.set_title("HPA on cache pressure, real simulator pods on the real node")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(OUT))
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    os.chdir(REPO_ROOT)  # the commit recorded is this repository's, wherever it is run from
    provenance = stamp(" ".join(["python", "e2e/node_figures.py", *sys.argv[1:]]))
    if provenance.get("dirty"):
        sys.stderr.write("node_figures: the code differs from its commit; the result will "
                         "say so (dirty: true)\n")
    result: dict[str, Any] = {
        **provenance,
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "host": f"{platform.node()} ({os.cpu_count()} CPUs)",
        "load_average_before": os.getloadavg(),
        "builds_cached_seconds": cached_builds(),
    }
    images = {n: i.ref for n, i in node_cluster.node_images().items()}
    state = node_cluster.read_state()
    own = None
    if state and node_cluster.owner_alive(state) and state.get("ready"):
        cp = ExistingCluster(state["kubeconfig"],
                             kubectl=str(node_cluster.node_binaries() / "kubectl"))
    else:
        own = node_cluster.NodeCluster(Path("/tmp/prefix-router-figures"))
        own.start()
        cp = own.cp
        result["cluster_start_seconds"] = own.timings
    try:
        helm = product.helm_binary()
        result["helm_install_seconds"] = round(product.install_chart(cp, helm, images), 1)
        result["pod_ready"] = pod_ready_times(cp, ["kube-system", product.RELEASE_NAMESPACE])
        result["compare"] = compare(cp, images)
        result["pod_ready"] += result["compare"].pop("pod_ready")
        hpa = hpa_timeline(cp, images)
        result["pod_ready"] += hpa.pop("pod_ready")
        result["hpa"] = hpa
        product.uninstall_chart(cp, helm)
    finally:
        if own is not None:
            own.stop()
            result["teardown_leftovers"] = own.leftovers
    result["load_average_after"] = os.getloadavg()
    result["wall_clock_seconds"] = round(time.monotonic() - started, 1)
    (out / "figures.json").write_text(json.dumps(result, indent=1) + "\n")
    plot(result["hpa"], out / "hpa-timeline.png")
    print(json.dumps({k: v for k, v in result.items() if k not in ("hpa", "pod_ready")},
                     indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
