"""The external-metrics adapter against a real control plane, and the HPA end to end.

Real parts only: kube-apiserver's aggregation layer proxies external.metrics.k8s.io to the
`prefix-metrics-adapter` command running as a process on this machine (an ExternalName
Service -> localhost, see docs/controlplane.md), with kube-apiserver's own front-proxy client
certificate; the adapter reads the requestheader CA from kube-system/
extension-apiserver-authentication, lists PrefixRoutedModels through the API and reads the
routers' published figures from a real redis-server (the models' external cache store, behind
a password Secret). The HPA is the real controller in kube-controller-manager; the operator is
the `prefix-operator` process; kwok makes the model-server pods Ready.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import ssl
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import redis
from processes import MetricsAdapter, Operator
from redis_process import running_redis
from waiting import scaled

from prefix_router.contract import RouterFigures, StoreKeys

pytestmark = pytest.mark.k8s

GV = "external.metrics.k8s.io/v1beta1"
SERVICE = "prefix-metrics-adapter"
# Short, so that the test of the HPA holding on stale data is quick; the stale-data test
# below writes timestamps far older than this.
STALE_AFTER = 8.0
PASSWORD = "adapter-s3cret"


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def cp(cp: Any) -> Any:
    """conftest's (the CRD applied), on the local control plane only."""
    if not hasattr(cp, "expose_local_service"):
        pytest.skip("the adapter runs as a local process: needs the local control plane")
    return cp


def make_namespace(cp: Any, prefix: str) -> str:
    name = f"{prefix}-{uuid.uuid4().hex[:6]}"
    cp.kubectl("create", "namespace", name)
    cp.wait_for(lambda: cp.kubectl("get", "serviceaccount", "default", "-n", name,
                                   check=False).returncode == 0, 30, "default ServiceAccount")
    cp.apply({"apiVersion": "v1", "kind": "Secret",
              "metadata": {"name": "store-auth", "namespace": name},
              "data": {"password": base64.b64encode(PASSWORD.encode()).decode()}})
    return name


@pytest.fixture(scope="module")
def ns(cp: Any) -> Iterator[str]:
    """Models for the adapter alone (no operator watches them)."""
    name = make_namespace(cp, "ma")
    yield name
    cp.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture(scope="module")
def hpa_ns(cp: Any) -> Iterator[str]:
    """The autoscaled model's own namespace, which the operator watches."""
    name = make_namespace(cp, "hpa")
    yield name
    cp.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture(scope="module")
def store() -> Iterator[redis.Redis]:
    """A real redis-server with a password: the models' external cache store."""

    binary = os.environ.get("REDIS_SERVER") or shutil.which("redis-server")
    if not binary:
        pytest.fail("redis-server is not installed (make test installs it)", pytrace=False)
    with running_redis(binary, PASSWORD) as port:
        client = redis.Redis(port=port, password=PASSWORD, decode_responses=True)
        yield client
        client.close()


@pytest.fixture(scope="module")
def adapter(cp: Any, tmp_path_factory: pytest.TempPathFactory,
            request: pytest.FixtureRequest) -> Iterator[MetricsAdapter]:
    a = MetricsAdapter(cp, tmp_path_factory.mktemp("adapter"), stale_after=STALE_AFTER,
                       service=SERVICE)
    a.start()
    try:
        a.register()
        yield a
    finally:
        a.unregister()
        a.stop()
        if request.session.testsfailed:
            sys.stderr.write(f"\n--- adapter log ({a.log_path}) ---\n{a.tail()}\n")


# --------------------------------------------------------------------------- helpers


def call(url: str, cp: Any, cert: tuple[Path, Path] | None = None,
         headers: dict[str, str] | None = None) -> tuple[int, Any]:
    """One HTTPS GET straight to the adapter (not through the apiserver)."""
    ctx = ssl.create_default_context(cafile=str(cp.ca_file))
    if cert is not None:
        ctx.load_cert_chain(str(cert[0]), str(cert[1]))
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, context=ctx, timeout=5) as r:
            raw = r.read()
            status = r.status
    except urllib.error.HTTPError as e:
        raw, status = e.read(), e.code
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode(errors="replace")


def prm(cp: Any, ns: str, name: str, store: redis.Redis, **spec: Any) -> None:
    port = store.connection_pool.connection_kwargs["port"]
    spec.setdefault("model", {"name": "llama", "source": "meta-llama/Llama-3.1-8B-Instruct"})
    spec.setdefault("cacheStore", {"type": "external", "url": f"redis://127.0.0.1:{port}/0",
                                   "passwordSecretRef": {"name": "store-auth"}})
    cp.apply({"apiVersion": "prefixrouter.io/v1alpha1", "kind": "PrefixRoutedModel",
              "metadata": {"name": name, "namespace": ns}, "spec": spec})


def publish(store: redis.Redis, ns: str, name: str,
            routers: dict[str, tuple[int, ...]], age: float = 0.0) -> None:
    """What router replicas publish (contract.RouterFigures): per router id,
    (working_set_tokens, in_flight[, queued]), stamped `age` seconds ago (a negative age:
    ahead, so that they stay fresh through several queries on a slow machine; STALE_AFTER is
    short)."""
    at = time.time() - age
    for rid, (working_set, in_flight, *queued) in routers.items():
        store.hset(StoreKeys(f"{ns}/{name}").figures(rid), mapping=RouterFigures(
            prompt_tokens=1000, cached_tokens=500, working_set_tokens=working_set,
            in_flight=in_flight, queued=sum(queued), updated_at=at).as_hash())


def raw(cp: Any, path: str) -> Any:
    return json.loads(cp.kubectl("get", "--raw", path).stdout)


def metric(cp: Any, ns: str, name: str, selector: str | None = None) -> list[dict[str, Any]]:
    path = f"/apis/{GV}/namespaces/{ns}/{name}"
    if selector is not None:
        path += "?labelSelector=" + urllib.parse.quote(selector)
    out = raw(cp, path)
    assert out["kind"] == "ExternalMetricValueList"
    return out["items"]


def by_model(items: list[dict[str, Any]]) -> dict[str, str]:
    return {i["metricLabels"]["prefixrouter.io/model"]: i["value"] for i in items}


# --------------------------------------------------------------------------- the adapter


def test_discovery_through_the_aggregator(cp: Any, adapter: MetricsAdapter) -> None:
    resources = raw(cp, f"/apis/{GV}")
    assert resources["kind"] == "APIResourceList"
    assert sorted(r["name"] for r in resources["resources"]) == [
        "prefix_router_demand", "prefix_router_in_flight",
        "prefix_router_queue_oldest_wait_seconds", "prefix_router_queued",
        "prefix_router_working_set_tokens"]
    groups = {g["name"] for g in raw(cp, "/apis")["groups"]}
    assert "external.metrics.k8s.io" in groups
    out = cp.kubectl("api-resources", "--api-group=external.metrics.k8s.io", "-o", "name")
    assert "prefix_router_in_flight" in out.stdout


def test_values_per_model_by_label_selector(cp: Any, ns: str, store: redis.Redis,
                                            adapter: MetricsAdapter) -> None:
    prm(cp, ns, "alpha", store)
    prm(cp, ns, "beta", store)
    publish(store, ns, "alpha", {"r1": (30000, 3), "r2": (45000, 4)}, age=-scaled(120))
    publish(store, ns, "beta", {"r1": (1000, 1)}, age=-scaled(120))

    items = metric(cp, ns, "prefix_router_in_flight", f"prefixrouter.io/model=alpha,"
                   f"prefixrouter.io/namespace={ns}")
    assert len(items) == 1
    item = items[0]
    assert item["metricName"] == "prefix_router_in_flight"
    assert item["value"] == "7"  # in flight adds up over the routers
    assert item["metricLabels"] == {"prefixrouter.io/model": "alpha",
                                    "prefixrouter.io/namespace": ns}
    assert item["timestamp"].endswith("Z")
    # the routers share one table: the widest view is the model's working set
    assert by_model(metric(cp, ns, "prefix_router_working_set_tokens",
                           "prefixrouter.io/model=alpha")) == {"alpha": "45000"}
    assert by_model(metric(cp, ns, "prefix_router_in_flight")) == {"alpha": "7", "beta": "1"}
    assert by_model(metric(cp, ns, "prefix_router_in_flight",
                           "prefixrouter.io/model in (beta,gamma)")) == {"beta": "1"}
    # the path's namespace bounds the answer
    assert metric(cp, "default", "prefix_router_in_flight", "prefixrouter.io/model=alpha") == []
    # an unknown metric and a malformed selector are API errors, not empty answers
    unknown = cp.kubectl("get", "--raw", f"/apis/{GV}/namespaces/{ns}/nope", check=False)
    assert unknown.returncode != 0 and "NotFound" in unknown.stderr
    bad = cp.kubectl("get", "--raw",
                     f"/apis/{GV}/namespaces/{ns}/prefix_router_in_flight?labelSelector=a%20in%20(b",
                     check=False)
    assert bad.returncode != 0 and "BadRequest" in bad.stderr


def test_stale_missing_or_unreachable_figures_give_no_items(cp: Any, ns: str,
                                                            store: redis.Redis,
                                                            adapter: MetricsAdapter) -> None:
    prm(cp, ns, "stale", store)
    prm(cp, ns, "silent", store)  # no router ever published
    # A store that is not there: a closed port, the real failure (no mock).
    from controlplane import free_port
    prm(cp, ns, "away", store, cacheStore={"type": "external",
                                           "url": f"redis://127.0.0.1:{free_port()}/0"})
    publish(store, ns, "stale", {"r1": (5000, 9)}, age=600)
    for name in ("stale", "silent", "away"):
        for m in ("prefix_router_in_flight", "prefix_router_working_set_tokens"):
            assert metric(cp, ns, m, f"prefixrouter.io/model={name}") == [], (name, m)
    # one fresh router is enough; the stale one is left out of the total
    publish(store, ns, "stale", {"r2": (100, 2)}, age=-scaled(120))
    assert by_model(metric(cp, ns, "prefix_router_in_flight",
                           "prefixrouter.io/model=stale")) == {"stale": "2"}


def test_only_the_front_proxy_gets_in(cp: Any, adapter: MetricsAdapter) -> None:
    base = f"https://127.0.0.1:{adapter.port}"
    url = f"{base}/apis/{GV}/namespaces/default/prefix_router_in_flight"
    # no client certificate
    status, body = call(url, cp, headers={"X-Remote-User": "admin"})
    assert status == 401
    assert (body["kind"], body["reason"], body["code"]) == ("Status", "Unauthorized", 401)
    status, _ = call(f"{base}/apis/{GV}", cp)
    assert status == 401  # discovery too
    # a certificate of the right CA with a name that is not allowed
    intruder = cp.issue_client_cert("intruder", "intruder", front_proxy=True)
    status, body = call(url, cp, cert=intruder, headers={"X-Remote-User": "admin"})
    assert status == 401 and "intruder" in body["message"]
    # a certificate of another CA (the cluster's own admin): no TLS session at all
    admin = cp.issue_client_cert("not-front-proxy", "front-proxy-client")
    with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionError)):
        call(url, cp, cert=admin, headers={"X-Remote-User": "admin"})
    # kube-apiserver's own front-proxy certificate, but nobody named
    status, _ = call(url, cp, cert=cp.front_proxy_client)
    assert status == 401
    status, body = call(url, cp, cert=cp.front_proxy_client,
                        headers={"X-Remote-User": "admin", "X-Remote-Group": "system:masters"})
    assert status == 200 and body["kind"] == "ExternalMetricValueList"
    # probes need no certificate
    assert call(f"{base}/healthz", cp)[0] == 200
    assert call(f"{base}/readyz", cp)[0] == 200


# --------------------------------------------------------------------------- the HPA


def test_hpa_scales_the_model_on_our_metrics(cp: Any, hpa_ns: str, store: redis.Redis,
                                             adapter: MetricsAdapter,
                                             tmp_path_factory: pytest.TempPathFactory,
                                             request: pytest.FixtureRequest) -> None:
    op = Operator(cp, hpa_ns, tmp_path_factory.mktemp("operator"))
    op.start()
    try:
        _hpa_end_to_end(cp, hpa_ns, store, adapter)
    finally:
        op.stop()
        if request.session.testsfailed:
            sys.stderr.write(f"\n--- operator log ({op.log_path}) ---\n{op.tail()}\n")


def adapter_answers(adapter: MetricsAdapter, ns: str) -> int:
    """How many metric requests for namespace `ns` the adapter has answered (it logs each one
    with -v: "<namespace> <metric> <selector>: <n> of <m> models")."""
    return sum(1 for line in adapter.log_path.read_text(errors="replace").splitlines()
               if f" {ns} prefix_router_" in line and line.endswith(" models"))


def stamp(value: str) -> float:
    """A Kubernetes Time (RFC 3339, whole seconds, UTC) as unix seconds."""
    return datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()


def _hpa_end_to_end(cp: Any, ns: str, store: redis.Redis, adapter: MetricsAdapter) -> None:
    name = "auto"
    # Per replica: 100k KV tokens x 0.8 = 80k tokens of working set, 4 requests in flight.
    prm(cp, ns, name, store, minReplicas=1, maxReplicas=5,
        router={"kvCapacityTokens": 100000},
        autoscaling={"enabled": True, "targetCachePressure": 0.8, "targetLoad": 4,
                     "scaleDownStabilizationSeconds": 5})
    hpa = cp.wait_for(lambda: get(cp, ns, "hpa", name), 30, "the operator's HPA")
    targets = {m["external"]["metric"]["name"]: m["external"]["target"]
               for m in hpa["spec"]["metrics"]}
    assert targets["prefix_router_working_set_tokens"] == {"type": "AverageValue",
                                                          "averageValue": "80k"}
    assert targets["prefix_router_in_flight"]["type"] == "AverageValue"

    def scaled_to(n: int, figures: dict[str, tuple[int, int]] | None) -> dict[str, Any] | None:
        if figures is not None:  # the routers keep publishing while the HPA works
            publish(store, ns, name, figures)
        obj = get(cp, ns, "prm", name)
        if not obj or obj["spec"]["replicas"] != n:
            return None
        ms = get(cp, ns, "deployment", f"{name}-model-server")
        ok = ms and ms["spec"]["replicas"] == n and obj["status"].get("readyReplicas") == n
        return obj if ok else None

    # 10 in flight over two routers, at 4 per replica: ceil(10 / 4) = 3 model servers.
    # (The working set, 30k tokens, alone would ask for 1.) The HPA's first sync may wait
    # for kube-controller-manager's REST mapper to learn the CRD (it resets every 30 s).
    obj = cp.wait_for(lambda: scaled_to(3, {"r1": (30000, 6), "r2": (20000, 4)}), 90,
                      "the HPA to scale the model to 3 on in-flight requests", interval=0.5)
    assert cond(obj, "AutoscalingReady")["status"] in ("True", "False")
    cp.wait_for(lambda: publish(store, ns, name, {"r1": (30000, 6), "r2": (20000, 4)}) or
                cond(get(cp, ns, "prm", name), "AutoscalingReady").get("reason")
                == "AutoscalerActive", 30, "AutoscalingReady=True from the HPA", interval=0.5)

    # Cache pressure: a 300k-token working set needs ceil(300k / 80k) = 4 replicas, though
    # the load alone (2 in flight) would ask for 1.
    cp.wait_for(lambda: scaled_to(4, {"r1": (300000, 1), "r2": (250000, 1)}), 60,
                "the HPA to scale the model to 4 on cache pressure", interval=0.5)

    # Waiting demand (issue 39): 2 in flight and 18 in the routers' queues at 4 a replica ask
    # for ceil(20 / 4) = 5, though in flight alone would ask for 1, the working set for 4.
    cp.wait_for(lambda: scaled_to(5, {"r1": (300000, 1, 9), "r2": (250000, 1, 9)}), 60,
                "the HPA to scale the model to 5 on the demand waiting in the queues",
                interval=0.5)

    # The routers fall silent: no values, so the HPA holds (it would scale down on zeros).
    keys = StoreKeys(f"{ns}/{name}")
    last_published = max(RouterFigures.from_hash(store.hgetall(k)).updated_at
                         for k in store.scan_iter(match=keys.figures_prefix + "*"))
    hpa = cp.wait_for(
        lambda: (h := get(cp, ns, "hpa", name)) and cond(h, "ScalingActive").get("reason")
        == "FailedGetExternalMetric" and h, 60, "the HPA to report the missing metrics",
        interval=0.5)
    # Not before the data went stale (the HPA's own record; whole seconds, hence the 1).
    failed_at = stamp(cond(hpa, "ScalingActive")["lastTransitionTime"])
    assert failed_at >= last_published + STALE_AFTER - 1, (failed_at, last_published)
    assert get(cp, ns, "prm", name)["spec"]["replicas"] == 5
    # The HPA keeps asking and getting nothing, and holds: two more of its syncs (each one
    # asks our adapter for each of its three metrics; 5 s apart, so past the 5 s scale-down
    # window too).
    asked = adapter_answers(adapter, ns)
    cp.wait_for(lambda: adapter_answers(adapter, ns) >= asked + 6, 60,
                "two more HPA syncs without data", interval=0.5)
    assert get(cp, ns, "prm", name)["spec"]["replicas"] == 5

    # Load gone, routers back: down to minReplicas after the stabilisation window.
    cp.wait_for(lambda: scaled_to(1, {"r1": (1000, 0), "r2": (800, 0)}), 60,
                "the HPA to scale the model back to 1", interval=0.5)


def get(cp: Any, ns: str, kind: str, name: str) -> dict[str, Any] | None:
    proc = cp.kubectl("get", kind, name, "-n", ns, "-o", "json", check=False)
    return json.loads(proc.stdout) if proc.returncode == 0 else None


def cond(obj: dict[str, Any] | None, type_: str) -> dict[str, Any]:
    for c in ((obj or {}).get("status") or {}).get("conditions") or []:
        if c["type"] == type_:
            return c
    return {}
