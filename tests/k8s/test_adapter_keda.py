"""The KEDA path of the chart, without KEDA: what KEDA's metrics-api trigger would do, done here
with the chart's own objects against the real adapter.

`helm template` with keda.enabled renders the client CA, KEDA's client certificate Secret, the
ClusterTriggerAuthentication and a ScaledObject; the `prefix-metrics-adapter` process runs with
the adapter Deployment's own arguments (ports and file paths swapped for this machine), lists
PrefixRoutedModels from the real kube-apiserver and reads the figures from a real
redis-server. The test then calls each trigger's `url` the way KEDA's `authMode: tls` does
(client certificate `cert`/`key`, the adapter verified with `ca` against the URL's host name),
reads `valueLocation` from the answer with GJSON's dot-path rule and parses it as KEDA does
since 2.2 (a JSON number, or a string holding a Kubernetes quantity).

No KEDA runs here (it needs its own operator and APIService); what KEDA does with the number
afterwards is its documented arithmetic, not ours.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import re
import shutil
import socket
import ssl
import subprocess
import sys
import time
import urllib.parse
import uuid
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml
from processes import stop_process
from redis_process import running_redis

# `helm` is test_chart's fixture (helm from hack/ensure-helm.sh).
from test_chart import CHART, container, helm, one, run_helm  # noqa: F401

from prefix_operator import adapter as adapter_cli
from prefix_router.contract import RouterFigures, StoreKeys

pytestmark = pytest.mark.k8s

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --------------------------------------------------------------------------- KEDA's reading


def gjson_get(doc: Any, path: str) -> Any:
    """GJSON's plain dot path (`items.0.value`): keys, and array indexes as numbers. None
    where the path leads nowhere (GJSON's "does not exist"), which KEDA reports as an error."""
    for part in path.split("."):
        if isinstance(doc, list) and part.isdigit():
            doc = doc[int(part)] if int(part) < len(doc) else None
        elif isinstance(doc, dict):
            doc = doc.get(part)
        else:
            return None
        if doc is None:
            return None
    return doc


_SUFFIX = {"": 1, "m": Decimal("0.001"), "k": 10**3, "M": 10**6, "G": 10**9, "Ki": 2**10,
           "Mi": 2**20, "Gi": 2**30}  # fmt: skip


def keda_value(raw: Any) -> Decimal:
    """KEDA's metrics-api rule for the value found: a JSON number, or a string that parses as
    a Kubernetes quantity (KEDA 2.2 and later; before, numbers only). Anything else raises."""
    if isinstance(raw, bool):
        raise ValueError(f"not a number or quantity: {raw!r}")
    if isinstance(raw, int | float):
        return Decimal(str(raw))
    if isinstance(raw, str):
        m = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)(m|k|M|G|Ki|Mi|Gi|)", raw)
        if m:
            return Decimal(m.group(1)) * _SUFFIX[m.group(2)]
    raise ValueError(f"not a number or quantity: {raw!r}")


def test_keda_value_rule() -> None:
    assert keda_value("4096") == 4096 and keda_value("2500m") == Decimal("2.5")
    assert keda_value(7) == 7
    for bad in (None, "", "seven", True, {"v": 1}):
        with pytest.raises(ValueError):
            keda_value(bad)
    doc = {"items": [{"value": "3"}]}
    assert gjson_get(doc, "items.0.value") == "3"
    assert gjson_get({"items": []}, "items.0.value") is None


# --------------------------------------------------------------------------- fixtures




@pytest.fixture(scope="module")
def store() -> Iterator[redis.Redis]:
    binary = os.environ.get("REDIS_SERVER") or shutil.which("redis-server")
    if not binary:
        pytest.fail("redis-server is not installed (make test installs it)", pytrace=False)
    with running_redis(binary) as port:
        client = redis.Redis(port=port, decode_responses=True)
        yield client
        client.close()


@pytest.fixture(scope="module")
def ns(cp: Any) -> Iterator[str]:
    name = f"keda-{uuid.uuid4().hex[:6]}"
    cp.kubectl("create", "namespace", name)
    yield name
    cp.kubectl("delete", "namespace", name, "--wait=false", check=False)


class Release:
    """The chart's KEDA objects, rendered for one model in `ns` (release in `ns` too)."""

    def __init__(self, helm_path: str, ns: str, work: Path) -> None:
        models = [{"name": "llama", "namespace": ns, "maxReplicas": 8,
                   "targetWorkingSetTokens": 80000, "targetInFlight": 4}]  # fmt: skip
        out = run_helm(
            helm_path, "template", "rel", str(CHART), "--namespace", ns,
            "--set", "keda.enabled=true", "--set", "keda.namespace=keda",
            "--set-json", f"keda.models={json.dumps(models)}",
        ).stdout  # fmt: skip
        self.objs = [d for d in yaml.safe_load_all(out) if d]
        self.scaled = one(self.objs, "ScaledObject")
        self.keda_secret = one(self.objs, "Secret", "-keda-client")
        self.client_ca = one(self.objs, "Secret", "-keda-client-ca")
        self.serving = one(self.objs, "Secret", "-serving-cert")
        self.trigger_auth = one(self.objs, "ClusterTriggerAuthentication")
        self.adapter = one(self.objs, "Deployment", "-adapter")
        # KEDA's client certificate as files, for ssl.
        self.cert, self.key = work / "keda.crt", work / "keda.key"
        self.cert.write_bytes(self.secret_param("cert"))
        self.key.write_bytes(self.secret_param("key"))
        self.key.chmod(0o600)

    def secret_param(self, parameter: str) -> bytes:
        """What KEDA resolves a trigger parameter to (ClusterTriggerAuthentication ->
        secretTargetRef -> the Secret in keda.namespace)."""
        refs = {r["parameter"]: r for r in self.trigger_auth["spec"]["secretTargetRef"]}
        ref = refs[parameter]
        assert ref["name"] == self.keda_secret["metadata"]["name"]
        assert self.keda_secret["metadata"]["namespace"] == "keda"
        return base64.b64decode(self.keda_secret["data"][ref["key"]])


@pytest.fixture(scope="module")
def release(helm: str, ns: str, tmp_path_factory: pytest.TempPathFactory) -> Release:  # noqa: F811
    return Release(helm, ns, tmp_path_factory.mktemp("keda-client"))


class AdapterProcess:
    def __init__(self, cp: Any, rel: Release, work: Path) -> None:
        self.front_port, self.client_port = free_port(), free_port()
        files = {}
        for name, data in (("tls.crt", rel.serving["data"]["tls.crt"]),
                           ("tls.key", rel.serving["data"]["tls.key"]),
                           ("client-ca.crt", rel.client_ca["data"]["ca.crt"])):  # fmt: skip
            files[name] = work / name
            files[name].write_bytes(base64.b64decode(data))
            files[name].chmod(0o600)
        c = container(rel.adapter)
        args = swap(c["args"], secure_port=str(self.front_port),
                    client_ca_port=str(self.client_port), bind_address="127.0.0.1",
                    tls_cert_file=str(files["tls.crt"]),
                    tls_private_key_file=str(files["tls.key"]),
                    client_ca_file=str(files["client-ca.crt"]))  # fmt: skip
        self.args = adapter_cli.parse_args(args)
        self.log_path = work / "adapter.log"
        exe = Path(sys.executable).parent / c["command"][0]
        cmd = [str(exe), *args, f"--kubeconfig={cp.kubeconfig}", "--verbose"]
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        stop_process(self.proc, 10)


def swap(args: list[str], **flags: str) -> list[str]:
    """Replace --flag=value arguments; each must be there, and only once."""
    out, seen = [], []
    for a in args:
        key = a.split("=", 1)[0].lstrip("-").replace("-", "_")
        if key in flags:
            out.append(f"{a.split('=', 1)[0]}={flags[key]}")
            seen.append(key)
        else:
            out.append(a)
    assert sorted(seen) == sorted(flags), f"rendered args {args} do not hold {flags} once each"
    return out


@pytest.fixture(scope="module")
def adapter(
    cp: Any, release: Release, tmp_path_factory: pytest.TempPathFactory,
    request: pytest.FixtureRequest,
) -> Iterator[AdapterProcess]:  # fmt: skip
    a = AdapterProcess(cp, release, tmp_path_factory.mktemp("keda-adapter"))

    def up() -> bool:
        if a.proc.poll() is not None:
            raise AssertionError(f"the adapter exited ({a.proc.returncode}):\n{a.log()}")
        return a.log().count("serving external.metrics.k8s.io/v1beta1") == 2

    try:
        cp.wait_for(up, 30, "the adapter's two listeners")
        yield a
    finally:
        a.stop()
        if request.session.testsfailed:
            sys.stderr.write(f"\n--- adapter log ({a.log_path}) ---\n{a.log()[-4000:]}\n")


class _Dialled(http.client.HTTPSConnection):
    """HTTPS for a URL's host and port, the connection made to 127.0.0.1:`dial` (no cluster
    DNS here); TLS still checks the certificate against the URL's host (SNI too)."""

    def __init__(self, host: str, port: int | None, dial: int, ctx: ssl.SSLContext) -> None:
        super().__init__(host, port, timeout=5)
        self.dial, self.ctx = dial, ctx

    def connect(self) -> None:
        raw = socket.create_connection(("127.0.0.1", self.dial), self.timeout)
        self.sock = self.ctx.wrap_socket(raw, server_hostname=self.host)


def keda_get(rel: Release, url: str, port: int) -> tuple[int, Any]:
    """GET `url` as KEDA's metrics-api trigger with authMode tls would: its client
    certificate, the adapter verified with `ca` for the URL's host, but the connection made to
    this machine's port (no cluster DNS here)."""
    parts = urllib.parse.urlsplit(url)
    ctx = ssl.create_default_context(cadata=rel.secret_param("ca").decode())
    ctx.load_cert_chain(str(rel.cert), str(rel.key))
    conn = _Dialled(parts.hostname or "", parts.port, port, ctx)
    try:
        conn.request("GET", f"{parts.path}?{parts.query}")
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


def publish(store: redis.Redis, ns: str, name: str, working_set: int, in_flight: int,
            age: float = 0.0) -> None:  # fmt: skip
    store.hset(StoreKeys(f"{ns}/{name}").figures("r1"), mapping=RouterFigures(
        prompt_tokens=1000, cached_tokens=500, working_set_tokens=working_set,
        in_flight=in_flight, updated_at=time.time() - age).as_hash())


# --------------------------------------------------------------------------- tests


def test_the_chart_wires_keda_to_the_client_ca_port(release: Release) -> None:
    args = adapter_cli.parse_args(container(release.adapter)["args"])
    assert args.client_ca_file == "/var/run/keda-client-ca/ca.crt"
    assert args.client_allowed_names == "keda-operator"
    assert args.requestheader_client_ca_file is None  # the front proxy's CA from kube-system
    svc = one(release.objs, "Service", "-adapter")
    ports = {p["name"]: p for p in svc["spec"]["ports"]}
    for t in release.scaled["spec"]["triggers"]:
        meta = t["metadata"]
        assert t["type"] == "metrics-api" and meta["authMode"] == "tls"
        assert meta["format"] == "json" and meta["valueLocation"] == "items.0.value"
        assert urllib.parse.urlsplit(meta["url"]).port == ports["client-ca"]["port"]
        assert t["authenticationRef"] == {
            "kind": "ClusterTriggerAuthentication",
            "name": release.trigger_auth["metadata"]["name"],
        }
    assert ports["client-ca"]["targetPort"] == "client-ca"
    cports = {p["name"]: p["containerPort"] for p in container(release.adapter)["ports"]}
    assert cports["client-ca"] == args.client_ca_port != args.secure_port


def test_keda_reads_our_values_at_value_location(
    cp: Any, ns: str, store: redis.Redis, release: Release, adapter: AdapterProcess
) -> None:
    port = store.connection_pool.connection_kwargs["port"]
    cp.apply({
        "apiVersion": "prefixrouter.io/v1alpha1", "kind": "PrefixRoutedModel",
        "metadata": {"name": "llama", "namespace": ns},
        "spec": {"model": {"name": "llama", "source": "meta-llama/Llama-3.1-8B-Instruct"},
                 "cacheStore": {"type": "external", "url": f"redis://127.0.0.1:{port}/0"}},
    })  # fmt: skip
    publish(store, ns, "llama", working_set=123456, in_flight=7)
    expected = {"prefix_router_working_set_tokens": 123456, "prefix_router_in_flight": 7,
                "prefix_router_demand": 7}  # nothing queued
    for t in release.scaled["spec"]["triggers"]:
        url, location = t["metadata"]["url"], t["metadata"]["valueLocation"]
        metric = urllib.parse.urlsplit(url).path.rsplit("/", 1)[-1]
        status, body = keda_get(release, url, adapter.client_port)
        assert status == 200, body
        assert body["kind"] == "ExternalMetricValueList"
        assert keda_value(gjson_get(body, location)) == expected[metric]
    # The user the adapter saw is the chart's KEDA certificate's CN.
    assert "as 'keda-operator', groups [] (client-ca)" in adapter.log()


def test_stale_figures_leave_keda_nothing_to_read(
    cp: Any, ns: str, store: redis.Redis, release: Release, adapter: AdapterProcess
) -> None:
    # No made-up zero: with the routers silent, valueLocation finds nothing, which KEDA reports
    # as an error for that trigger (the HPA then holds), as our own APIService's empty list does.
    publish(store, ns, "llama", working_set=123456, in_flight=7, age=3600)
    t = release.scaled["spec"]["triggers"][0]
    status, body = keda_get(release, t["metadata"]["url"], adapter.client_port)
    assert status == 200 and body["items"] == []
    assert gjson_get(body, t["metadata"]["valueLocation"]) is None
    with pytest.raises(ValueError):
        keda_value(gjson_get(body, t["metadata"]["valueLocation"]))


def test_keda_certificate_is_not_a_front_proxy_certificate(
    release: Release, adapter: AdapterProcess
) -> None:
    # The same client on the aggregated-API port gets no TLS session: that port trusts only
    # kube-apiserver's front-proxy CA.
    url = release.scaled["spec"]["triggers"][0]["metadata"]["url"]
    with pytest.raises((ssl.SSLError, ConnectionError)):
        keda_get(release, url, adapter.front_port)
