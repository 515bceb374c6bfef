"""A client on this machine reaches the routers through a NodePort Service and gets cache
hits that the engine pods' own counters confirm; `kubectl get prm` reads like a dashboard."""

from __future__ import annotations

import asyncio
import json
import re
import urllib.error
import urllib.request
from typing import Any

import product
import traffic
from nodesuite import Cluster, scaled


def engine_totals(cp: Any, model: dict[str, str]) -> dict[str, traffic.Counters]:
    urls = product.engine_urls(cp, model["namespace"], model["name"])
    return {name: traffic.engine_counters(url) for name, url in urls.items()}


def router_backends(pod: dict[str, Any]) -> tuple[int, int]:
    """(backends, healthy backends) as one router pod's /readyz reports them."""
    url = f"http://{pod['status']['podIP']}:8080/readyz"
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            body = json.load(r)
    except urllib.error.HTTPError as e:  # 503 while not ready: the body still says why
        body = json.load(e)
    except OSError:
        return (0, 0)
    return (body["backends"], body["healthy_backends"])


def fresh_engines(cp: Any, model: dict[str, str]) -> None:
    """Both engine pods replaced by new ones, and every router serving both. The suite's
    earlier tests leave one engine's cache full of recently used prefixes; the eviction scorer
    then rightly places every new tenant on the other engine, which says nothing about how
    tenants spread over engines that start alike."""
    ns, name = model["namespace"], model["name"]
    old = {p["metadata"]["name"] for p in product.pods(cp, ns, name, "model-server")}
    cp.kubectl("delete", "pod", *sorted(old), "-n", ns, "--wait=false")

    def replaced() -> bool:
        names = {p["metadata"]["name"] for p in product.pods(cp, ns, name, "model-server")}
        return (len(product.ready_pods(cp, ns, name, "model-server")) == 2
                and not names & old)

    cp.wait_for(replaced, scaled(180), "both engine pods replaced by Ready ones")
    # with no engine for a moment the routers turned unready: wait for the model, then for
    # each router to serve both new engines, then for the NodePort to answer again
    product.wait_model_ready(cp, ns, name, 2, scaled(180))

    def routers_serve_both() -> bool:
        routers = product.ready_pods(cp, ns, name, "router")
        return len(routers) == 2 and all(router_backends(p) == (2, 2) for p in routers)

    cp.wait_for(routers_serve_both, scaled(120), "every router serving the two new engines")
    product.nodeport_url(cp, name, ns, scaled(60))


def test_cache_hits_through_the_router_service(node: Cluster, model: dict[str, str]) -> None:
    """Measured at the engines, not told by the router: each tenant's requests go to one
    engine pod (its request counter moves), and their prompts hit its prefix cache."""
    cp = node.cp
    fresh_engines(cp, model)
    start = engine_totals(cp, model)
    owners = []
    # 8 tenants, each a 600-token system prompt, 6 questions each, one tenant after the
    # other: the first request of a tenant is a miss, the next five can be served from the
    # KV cache of the engine the first one went to
    for tenant in range(100, 108):
        before = engine_totals(cp, model)
        requests = traffic.tenants_requests([tenant], per_tenant=6, prompt_tokens=600,
                                            max_tokens=8)
        results = asyncio.run(traffic.run(model["url"], product.SERVED_MODEL, requests,
                                          concurrency=1, timeout=scaled(60)))
        assert all(r.ok for r in results), [r for r in results if not r.ok][:3]
        after = engine_totals(cp, model)
        assert set(after) == set(before), "the engine pods changed during the test"
        served = {n: (after[n] - before[n]).success for n in after}
        owners.append(max(served, key=lambda n: served[n]))
        assert max(served.values()) >= 5, (tenant, served)
    end = engine_totals(cp, model)
    fleet = traffic.total({n: end[n] - start[n] for n in end})
    assert fleet.success == 48, fleet
    # the engines' own counters: most prompt tokens were served from their prefix caches
    assert fleet.hit_rate > 0.6, fleet
    # the tenants were spread over both engine pods (they started alike: fresh_engines)
    assert len(set(owners)) == 2, owners


def test_kubectl_get_prm_reads_like_a_dashboard(node: Cluster, model: dict[str, str]) -> None:
    """Every printer column of the CRD is filled in `kubectl get prm -o wide` (columns found
    by the status field they show, so a renamed header does not matter)."""
    cp = node.cp
    ns, name = model["namespace"], model["name"]
    requests = traffic.tenants_requests(range(200, 204), per_tenant=4, prompt_tokens=400,
                                        max_tokens=4)
    asyncio.run(traffic.run(model["url"], product.SERVED_MODEL, requests, concurrency=2))
    crd = cp.kubectl_json("get", "crd", "prefixroutedmodels.prefixrouter.io")
    printed = crd["spec"]["versions"][0]["additionalPrinterColumns"]
    by_path = {c["jsonPath"]: c["name"].upper() for c in printed}

    def columns() -> dict[str, str] | None:
        header, row = cp.kubectl("get", "prm", name, "-n", ns, "-o", "wide").stdout.splitlines()
        names = re.split(r"\s{2,}", header.strip())
        values = row.split()  # no value holds a space; an empty one leaves a column short
        if len(values) != len(names) or "<none>" in values:
            return None
        return dict(zip(names, values, strict=True))

    cols = cp.wait_for(columns, scaled(90), "kubectl get prm with every column filled")
    assert set(cols) == {c["name"].upper() for c in printed} | {"NAME"}, (cols, printed)

    def value(path_end: str) -> str:
        (path,) = [p for p in by_path if p.endswith(path_end)]
        return cols[by_path[path]]

    assert value('?(@.type=="Ready")].status') == "True", cols
    assert value(".replicasSummary") == "2/2", cols
    assert 0 < float(value(".hitRate")) <= 1, cols
    assert float(value(".cachePressure")) > 0, cols
    assert value(".routerURL").startswith(f"http://{name}-router.{ns}.svc"), cols
