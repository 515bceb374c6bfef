"""The events users live through, each under load from this machine through the routers'
NodePort Service, on real pods:

- an engine pod deleted: replaced, the routers follow, no request lost that had not started;
- the Redis pod killed: no failed request;
- `kubectl scale prm`: the new pod serves, the routers spread new prefixes over it;
- a router rolling update: no request lost, long streams included (readiness off and a
  preStop pause before the listener closes, a grace period that covers long streams).

Each test leaves the model as it found it (2 Ready model servers)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any

import product
import traffic
from nodesuite import Cluster, scaled


def steady_requests(first_tenant: int, max_tokens: int = 16) -> Iterator[traffic.Request]:
    return traffic.cycle(traffic.tenants_requests(range(first_tenant, first_tenant + 6),
                                                  per_tenant=40, prompt_tokens=300,
                                                  max_tokens=max_tokens))


def wait_count(cp: Any, load: traffic.Load, n: int, what: str) -> None:
    cp.wait_for(lambda: load.count() >= n, scaled(120), f"{n} requests {what}")


def fresh_prefixes(cp: Any, model: dict[str, str], first_tenant: int, n: int) -> dict[str, float]:
    """One request each for n tenants never seen: how many each Ready engine pod served, by
    its own request counter (where the routers place new prefixes)."""
    urls = product.engine_urls(cp, model["namespace"], model["name"])
    before = {name: traffic.engine_counters(url) for name, url in urls.items()}
    requests = traffic.tenants_requests(range(first_tenant, first_tenant + n), per_tenant=1,
                                        prompt_tokens=300, max_tokens=4)
    results = asyncio.run(traffic.run(model["url"], product.SERVED_MODEL, requests,
                                      concurrency=4, timeout=scaled(60)))
    assert all(r.ok for r in results), [r for r in results if not r.ok][:3]
    return {name: (traffic.engine_counters(url) - before[name]).success
            for name, url in urls.items()}


def test_engine_pod_deleted(node: Cluster, model: dict[str, str]) -> None:
    cp, ns, name = node.cp, model["namespace"], model["name"]
    before = {p["metadata"]["name"]: p["status"]["podIP"]
              for p in product.ready_pods(cp, ns, name, "model-server")}
    t0 = time.monotonic()
    load = traffic.Load(model["url"], product.SERVED_MODEL, steady_requests(300),
                        concurrency=4, timeout=scaled(60)).start()
    try:
        wait_count(cp, load, 20, "before the deletion")
        victim = sorted(before)[0]
        t_delete = time.monotonic()
        cp.kubectl("delete", "pod", victim, "-n", ns, "--wait=false")

        def replaced() -> dict[str, str] | None:
            ready = {p["metadata"]["name"]: p["status"]["podIP"]
                     for p in product.ready_pods(cp, ns, name, "model-server")}
            gone = victim not in {p["metadata"]["name"] for p in
                                  product.pods(cp, ns, name, "model-server")}
            return ready if gone and len(ready) == 2 else None

        ready = cp.wait_for(replaced, scaled(180), f"{victim} replaced by a Ready pod")
        t_replaced = time.monotonic()
        mark = load.count()
        wait_count(cp, load, mark + 20, "after the replacement")
    finally:
        results = load.stop()
    new = next(n for n in ready if n not in before)
    s = traffic.summary(results)
    # Requests that had not started never fail: the router retries them on another engine.
    # Streams the dying engine was producing may be cut (counted, allowed).
    assert s["failed_before_first_token"] == 0, (
        f"{s}; deleted at t={t_delete - t0:+.2f}s, replaced at t={t_replaced - t0:+.2f}s:\n"
        + "\n".join(traffic.failures(results, t0)) + "\n" + product.describe(cp, ns))
    # The routers follow: requests sent after the replacement all succeed (none goes to the
    # deleted pod), and new prefixes are placed on the new pod too.
    late = [r for r in results if r.sent_at > t_replaced]
    assert late and all(r.ok for r in late), "\n".join(traffic.failures(late, t0))
    served = fresh_prefixes(cp, model, 400, 16)
    assert served.get(new, 0) > 0, (new, served)


def test_redis_pod_killed(node: Cluster, model: dict[str, str]) -> None:
    cp, ns, name = node.cp, model["namespace"], model["name"]
    (redis,) = product.ready_pods(cp, ns, name, "cache-store")
    t0 = time.monotonic()
    load = traffic.Load(model["url"], product.SERVED_MODEL, steady_requests(500),
                        concurrency=4, timeout=scaled(60)).start()
    try:
        wait_count(cp, load, 20, "before the kill")
        cp.kubectl("delete", "pod", redis["metadata"]["name"], "-n", ns, "--grace-period=0",
                   "--force")
        (new,) = cp.wait_for(
            lambda: [p for p in product.ready_pods(cp, ns, name, "cache-store")
                     if p["metadata"]["name"] != redis["metadata"]["name"]] or None,
            scaled(120), "a new Redis pod Ready")
        mark = load.count()
        wait_count(cp, load, mark + 30, "after Redis came back")

        # the routers write their shared table into the new Redis (kubectl exec: the
        # kubelet's streaming server, containerd's exec)
        def keys() -> int:
            out = cp.kubectl("exec", "-n", ns, new["metadata"]["name"], "--",
                             "redis-cli", "dbsize").stdout
            return int(out.strip() or 0)

        cp.wait_for(keys, scaled(60), "the routers' keys in the new Redis")
    finally:
        results = load.stop()
    s = traffic.summary(results)
    assert s["ok"] == s["requests"], (f"{s}:\n" + "\n".join(traffic.failures(results, t0))
                                      + "\n" + product.describe(cp, ns))


def test_kubectl_scale_prm(node: Cluster, model: dict[str, str]) -> None:
    cp, ns, name = node.cp, model["namespace"], model["name"]
    cp.kubectl("scale", "prm", name, "-n", ns, "--replicas=3")
    try:
        product.wait_model_ready(cp, ns, name, 3, scaled(240))
        prm = cp.kubectl_json("get", "prm", name, "-n", ns)
        assert prm["status"]["readyReplicas"] == 3 and prm["status"]["replicasSummary"] == "3/3"
        served = fresh_prefixes(cp, model, 600, 24)
        assert len(served) == 3 and all(v > 0 for v in served.values()), served
    finally:
        cp.kubectl("scale", "prm", name, "-n", ns, "--replicas=2")
        product.wait_model_ready(cp, ns, name, 2, scaled(240))


def rollout_done(cp: Any, ns: str, deployment: str, old_pods: set[str]) -> bool:
    d = cp.kubectl_json("get", "deployment", deployment, "-n", ns)
    st, want = d.get("status", {}), d["spec"]["replicas"]
    names = {p["metadata"]["name"] for p in cp.kubectl_json(
        "get", "pods", "-n", ns, "-l", ",".join(f"{k}={v}" for k, v in
                                              d["spec"]["selector"]["matchLabels"].items()))["items"]}
    return (st.get("observedGeneration", 0) >= d["metadata"]["generation"]
            and st.get("updatedReplicas") == want and st.get("readyReplicas") == want
            and st.get("replicas") == want and not names & old_pods)


def test_router_rolling_update_under_load(node: Cluster, model: dict[str, str]) -> None:
    cp, ns, name = node.cp, model["namespace"], model["name"]
    deployment = f"{name}-router"
    old = {p["metadata"]["name"] for p in product.pods(cp, ns, name, "router")}
    # Long streams (2,000 tokens: 20 s at the model's 10 ms a step, four times the preStop
    # pause) among short requests: streams are in flight on the old routers when they get
    # SIGTERM, and must end well after it.
    long = traffic.tenants_requests(range(700, 702), per_tenant=20, prompt_tokens=300,
                                    max_tokens=2000)
    short = traffic.tenants_requests(range(710, 716), per_tenant=20, prompt_tokens=300,
                                     max_tokens=16)
    mixed = [r for pair in zip(long, short[: len(long)], strict=True) for r in pair]
    t0 = time.monotonic()
    load = traffic.Load(model["url"], product.SERVED_MODEL, traffic.cycle(mixed),
                        concurrency=4, timeout=scaled(120)).start()
    slack = cp.kubectl_json("get", "prm", name, "-n", ns)["spec"]["router"]["loadSlack"]
    try:
        wait_count(cp, load, 4, "before the rollout")
        # a router setting changes: the operator renders a new config and rolls the routers
        t_patch = time.monotonic()
        cp.kubectl("patch", "prm", name, "-n", ns, "--type", "merge", "-p",
                   json.dumps({"spec": {"router": {"loadSlack": slack + 1}}}))
        cp.wait_for(lambda: rollout_done(cp, ns, deployment, old), scaled(300),
                    "the routers' rolling update (old pods gone)")
        mark = load.count()
        wait_count(cp, load, mark + 8, "after the rollout")
    finally:
        results = load.stop()
    s = traffic.summary(results)
    assert s["ok"] == s["requests"], (f"{s}; rollout from t={t_patch - t0:+.2f}s:\n"
                                      + "\n".join(traffic.failures(results, t0))
                                      + "\n" + product.describe(cp, ns))
    assert sum(r.ok and r.seconds > 15 for r in results) > 0, "no long stream ran"
