"""The Helm chart (charts/prefix-router) and the Dockerfile.

Real parts: helm v3 from hack/ensure-helm.sh (built with go install and cached), the real
kube-apiserver of the `control_plane` fixture for server-side dry runs and a `helm install`,
the real `prefix-operator` and `prefix-metrics-adapter` commands run with the arguments and the
ServiceAccount tokens of the installed release (kwok makes the release's pods Running without
running containers, so the test runs what those pods would run, as processes on this machine).

Static checks: `helm lint --strict`, `helm template` with default values and with
charts/prefix-router/ci/all-options-values.yaml, the schema rejecting bad values with helm's own
error, the operator's RBAC equal to what its code needs (children.permissions(), from the one
table of what a model owns, and the router Role it hands out), pod security on every container,
the rendered arguments parsed by the real CLIs, `helm package` resolving the CRD symlink, and
the Dockerfile against pyproject.toml and the chart's default image.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import time
import tomllib
import urllib.parse
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml
from cryptography import x509
from redis_process import running_redis
from waiting import kubectl_timeout, scaled

from prefix_operator import (
    GROUP,
    KIND,
    PLURAL,
    VERSION,
    children,
    config,
    external_metrics,
    kinds,
    naming,
    render,
)
from prefix_operator import adapter as adapter_cli
from prefix_operator import cli as operator_cli
from prefix_operator.spec import Model
from prefix_router.contract import RouterFigures, StoreKeys, store_prefix

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "prefix-router"
ALL_OPTIONS = CHART / "ci" / "all-options-values.yaml"
CRD_PATH = ROOT / "crds" / "prefixroutedmodel.yaml"
ENSURE_HELM = ROOT / "hack" / "ensure-helm.sh"
SCHEMA_ERROR = "values don't meet the specifications of the schema"
# Kinds whose CRDs belong to other projects (KEDA, prometheus-operator) and are not installed in
# the test cluster: the server-side dry run cannot check them; helm template and the schema do.
FOREIGN_KINDS = {"ScaledObject", "ClusterTriggerAuthentication", "ServiceMonitor"}
WORKLOAD_KINDS = {"Deployment", "StatefulSet", "DaemonSet", "Job"}


def _truthy(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no")


# --------------------------------------------------------------------------- helm


@pytest.fixture(scope="module")
def helm() -> str:
    """The helm binary; building it the first time takes a few minutes (make helm does it)."""
    proc = subprocess.run(["bash", str(ENSURE_HELM)], capture_output=True, text=True,
                          timeout=1200, check=False)
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    if proc.returncode != 0 or not lines:
        reason = (f"bash {ENSURE_HELM.relative_to(ROOT)} failed (exit {proc.returncode}):\n"
                  f"{proc.stderr.strip() or proc.stdout.strip()}")
        if _truthy("CI"):
            pytest.fail(f"helm unavailable (CI is set, so this fails):\n{reason}", pytrace=False)
        pytest.skip(f"helm unavailable: {reason}")
    return lines[-1].strip()


def run_helm(helm: str, *args: str, env: dict[str, str] | None = None, check: bool = True,
             timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """helm, with `timeout` scaled (a --timeout among the args must be below it)."""
    proc = subprocess.run([helm, *args], capture_output=True, text=True, env=env,
                          timeout=scaled(timeout), check=False)
    if check and proc.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed (exit {proc.returncode}):\n"
                             f"{proc.stderr}\n{proc.stdout}")
    return proc


def template(helm: str, *args: str, namespace: str = "prefix-router",
             release: str = "rel") -> list[dict[str, Any]]:
    out = run_helm(helm, "template", release, str(CHART), "--namespace", namespace, *args).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def by_kind(objs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] == kind]


def one(objs: list[dict[str, Any]], kind: str, name_suffix: str = "") -> dict[str, Any]:
    found = [o for o in by_kind(objs, kind) if o["metadata"]["name"].endswith(name_suffix)]
    names = [o["metadata"]["name"] for o in found]
    assert len(found) == 1, f"expected one {kind} named *{name_suffix}, got {names}"
    return found[0]


def container(deploy: dict[str, Any]) -> dict[str, Any]:
    return deploy["spec"]["template"]["spec"]["containers"][0]


@pytest.fixture(scope="module")
def default_objs(helm: str) -> list[dict[str, Any]]:
    return template(helm)


@pytest.fixture(scope="module")
def all_objs(helm: str) -> list[dict[str, Any]]:
    return template(helm, "-f", str(ALL_OPTIONS))


@pytest.fixture(scope="module")
def apiservice_objs(helm: str) -> list[dict[str, Any]]:
    return template(helm, "--set", "adapter.apiService.enabled=true")


# One operator replica under kopf peering instead of leader election.
PEERING = ["--set", "operator.leaderElection.enabled=false,operator.peering.enabled=true,"
           "operator.replicas=1"]
STANDALONE = ["--set", "operator.leaderElection.enabled=false,operator.replicas=1"]


@pytest.fixture(scope="module")
def peering_objs(helm: str) -> list[dict[str, Any]]:
    return template(helm, *PEERING)


# --------------------------------------------------------------------------- lint / template


@pytest.mark.parametrize("values", [[], ["-f", str(ALL_OPTIONS)],
                                    ["--set", "adapter.apiService.enabled=true"],
                                    PEERING, STANDALONE],
                         ids=["default", "all-options", "apiservice", "peering", "standalone"])
def test_lint_strict(helm: str, values: list[str]) -> None:
    proc = run_helm(helm, "lint", "--strict", str(CHART), *values)
    assert "0 chart(s) failed" in proc.stdout, proc.stdout


def test_default_render(default_objs: list[dict[str, Any]]) -> None:
    kinds = {o["kind"] for o in default_objs}
    assert {"Deployment", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role",
            "RoleBinding", "Service", "Secret"} <= kinds
    # Leader election, not peering: no peering objects.
    assert not kinds & {"ClusterKopfPeering", "KopfPeering"}
    # Opt-in: one owner of external.metrics.k8s.io per cluster.
    assert "APIService" not in kinds
    assert not kinds & FOREIGN_KINDS
    op = container(one(default_objs, "Deployment", "-operator"))
    # The operator's default image for routers is the chart's own image, and both are the
    # image the operator itself defaults to.
    args = operator_cli.parse_args(op["args"])
    assert op["image"] == config.ROUTER_IMAGE
    assert args.router_image == config.ROUTER_IMAGE
    assert args.all_namespaces and not args.standalone and args.peering is None
    # Two replicas, one Lease in the release namespace, the operator's default timings.
    op_deploy = one(default_objs, "Deployment", "-operator")
    assert op_deploy["spec"]["replicas"] == 2
    assert op_deploy["spec"]["strategy"]["type"] == "RollingUpdate"
    assert args.leader_election and args.lease_namespace == "prefix-router"
    assert args.lease_name == f"{op_deploy['metadata']['name']}-leader"
    lease = operator_cli.lease_settings(args)
    assert (lease.lease_duration, lease.renew_deadline, lease.retry_period) == (15, 10, 2)
    assert lease.problems() == []
    # The pod's name is its identity in the Lease.
    pod_id = {"name": "POD_ID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}
    assert pod_id in op["env"]
    # Standbys are spread over nodes when nothing else is asked for.
    anti = op_deploy["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    term = anti["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"]
    assert term["labelSelector"]["matchLabels"].items() <= \
        op_deploy["spec"]["template"]["metadata"]["labels"].items()


def test_peering_render(peering_objs: list[dict[str, Any]], helm: str) -> None:
    op_deploy = one(peering_objs, "Deployment", "-operator")
    args = operator_cli.parse_args(container(op_deploy)["args"])
    assert not args.leader_election and not args.standalone
    assert args.peering == one(peering_objs, "ClusterKopfPeering")["metadata"]["name"]
    assert op_deploy["spec"]["replicas"] == 1
    assert "affinity" not in op_deploy["spec"]["template"]["spec"]
    assert not [o for o in by_kind(peering_objs, "Role") if "leader" in o["metadata"]["name"]]
    cluster = one(peering_objs, "ClusterRole", "-operator")["rules"]
    assert allows(cluster, "kopf.dev", "clusterkopfpeerings", "patch")
    assert not allows(cluster, "coordination.k8s.io", "leases", "create")
    # Namespaced: a KopfPeering and its RBAC in each watched namespace.
    objs = template(helm, *PEERING, "--set", "operator.watchNamespaces={ml,ml-staging}")
    assert {o["metadata"]["namespace"] for o in by_kind(objs, "KopfPeering")} == {"ml",
                                                                                 "ml-staging"}
    for role in by_kind(objs, "Role"):
        assert allows(role["rules"], "kopf.dev", "kopfpeerings", "patch")
    standalone = template(helm, *STANDALONE)
    sa_deploy = one(standalone, "Deployment", "-operator")
    assert operator_cli.parse_args(container(sa_deploy)["args"]).standalone
    assert sa_deploy["spec"]["strategy"]["type"] == "Recreate"


@pytest.mark.parametrize(("settings", "message"), [
    (["--set", "operator.peering.enabled=true"],
     "operator.leaderElection.enabled and operator.peering.enabled exclude each other"),
    (["--set", "operator.leaderElection.renewDeadlineSeconds=15"],
     "leaseDurationSeconds must exceed renewDeadlineSeconds"),
    (["--set-json", "operator.leaderElection.retryPeriodSeconds=9"],
     "which must exceed 1.2 x retryPeriodSeconds"),
], ids=["peering", "renew-deadline", "retry-period"])
def test_leader_election_refuses_unsafe_values(helm: str, settings: list[str],
                                               message: str) -> None:
    proc = run_helm(helm, "template", "rel", str(CHART), *settings, check=False)
    assert proc.returncode != 0 and message in proc.stderr, proc.stderr


def test_all_options_render(all_objs: list[dict[str, Any]]) -> None:
    values = yaml.safe_load(ALL_OPTIONS.read_text())
    namespaces = values["operator"]["watchNamespaces"]
    op_deploy = one(all_objs, "Deployment", "-operator")
    op = container(op_deploy)
    args = operator_cli.parse_args(op["args"])
    le = values["operator"]["leaderElection"]
    assert args.namespace == namespaces and args.leader_election and args.peering is None
    assert (args.lease_duration, args.renew_deadline, args.retry_period) == (
        le["leaseDurationSeconds"], le["renewDeadlineSeconds"], le["retryPeriodSeconds"])
    assert op_deploy["spec"]["replicas"] == values["operator"]["replicas"]
    # The affinity given replaces the default spreading.
    assert op_deploy["spec"]["template"]["spec"]["affinity"] == values["operator"]["affinity"]
    assert args.resync_seconds == 30 and args.figures_seconds == 10 and args.verbose
    assert op["image"] == "registry.example.com/ml/prefix-router:0.1.0-test"
    # Namespaced operator: a Role and a RoleBinding in each watched namespace, and the
    # leader-election Role in the release namespace.
    roles = {o["metadata"]["namespace"] for o in by_kind(all_objs, "Role")
             if not o["metadata"]["name"].endswith("-leader-election")}
    assert roles == set(namespaces)
    assert not by_kind(all_objs, "KopfPeering")
    bindings = [o for o in by_kind(all_objs, "RoleBinding") if o["roleRef"]["kind"] == "Role"
                and o["metadata"]["namespace"] in namespaces]
    assert len(bindings) == len(namespaces)
    # KEDA: triggers read our adapter's metrics, as the adapter names them.
    scaled = one(all_objs, "ScaledObject")
    assert scaled["spec"]["scaleTargetRef"] == {"apiVersion": f"{GROUP}/{VERSION}",
                                                "kind": KIND, "name": "llama"}
    urls = [t["metadata"]["url"] for t in scaled["spec"]["triggers"]]
    for url, metric in zip(urls, external_metrics.SCALING, strict=True):
        parsed = urllib.parse.urlsplit(url)
        assert parsed.path.endswith(f"/namespaces/ml/{metric}")
        assert urllib.parse.parse_qs(parsed.query)["labelSelector"] == [
            f"{naming.MODEL_LABEL}=llama"]
    ad = container(one(all_objs, "Deployment", "-adapter"))
    adapter_args = adapter_cli.parse_args(ad["args"])
    # KEDA's client CA on a port of its own; the front proxy's CA stays kube-system's.
    assert adapter_args.client_ca_file == "/var/run/keda-client-ca/ca.crt"
    assert adapter_args.client_allowed_names == "keda-operator"
    assert adapter_args.requestheader_client_ca_file is None
    assert adapter_args.client_ca_port != adapter_args.secure_port
    adapter_svc_ports = {p["name"]: p["port"]
                         for p in one(all_objs, "Service", "-adapter")["spec"]["ports"]}
    assert {urllib.parse.urlsplit(u).port for u in urls} == {adapter_svc_ports["client-ca"]}
    # ServiceMonitor: selects the router Services the operator renders, on their port.
    sm = one(all_objs, "ServiceMonitor")
    router_svc = rendered(sample_model(), kinds.SERVICE, "llama-router")
    svc_labels = router_svc["metadata"]["labels"]
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc_labels.items()
    assert sm["spec"]["targetLabels"] == [naming.MODEL_LABEL]
    # ... on the port /metrics is served on (not the API's)
    svc_ports = {p["name"]: p["port"] for p in router_svc["spec"]["ports"]}
    assert sm["spec"]["endpoints"][0]["port"] == "metrics"
    assert svc_ports["metrics"] == render.router_settings(sample_model()).metrics_port
    assert sm["spec"]["namespaceSelector"] == {"matchNames": namespaces}
    rules = yaml.safe_load(one(all_objs, "ConfigMap", "-prometheus-adapter-rules")["data"]
                           ["config.yaml"])
    # prometheus-adapter serves both of our adapter's metrics, from series the routers export.
    by_name = {r["name"]["as"]: r for r in rules["externalRules"]}
    assert set(by_name) == set(external_metrics.METRICS)
    exported = router_metric_names()
    for metric, series, agg in ((external_metrics.IN_FLIGHT_METRIC,
                                 "prefix_router_backend_in_flight", "sum("),
                                (external_metrics.WORKING_SET_METRIC,
                                 "prefix_router_working_set_tokens", "max(")):
        rule = by_name[metric]
        assert rule["seriesQuery"].startswith(series + "{") and series in exported
        assert rule["metricsQuery"].startswith(agg)
    dashboard = json.loads(one(all_objs, "ConfigMap", "-dashboard")["data"]["prefix-router.json"])
    exprs = " ".join(t["expr"] for p in dashboard["panels"] for t in p["targets"])
    router_metrics = router_metric_names()
    used = set(re.findall(r"prefix_router_[a-z_]+", exprs))
    unknown = {m for m in used if not any(m == n or m.startswith(n + "_") for n in router_metrics)}
    assert not unknown, f"dashboard queries metrics the routers do not export: {unknown}"


def test_apiservice_render(apiservice_objs: list[dict[str, Any]]) -> None:
    api = one(apiservice_objs, "APIService")
    secret = one(apiservice_objs, "Secret", "-serving-cert")
    svc = one(apiservice_objs, "Service", "-adapter")
    assert api["metadata"]["name"] == f"{external_metrics.VERSION}.{external_metrics.GROUP}"
    # The CA made once and shared: the APIService trusts the Secret's CA.
    assert api["spec"]["caBundle"] == secret["data"]["ca.crt"]
    assert api["spec"]["service"] == {"name": svc["metadata"]["name"],
                                      "namespace": "prefix-router",
                                      "port": svc["spec"]["ports"][0]["port"]}
    crt = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
    names = crt.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert f"{svc['metadata']['name']}.prefix-router.svc" in names.get_values_for_type(
        x509.DNSName)


def test_keda_and_apiservice_exclude_each_other(helm: str) -> None:
    proc = run_helm(helm, "template", "rel", str(CHART), "--set", "keda.enabled=true",
                    "--set", "adapter.apiService.enabled=true", check=False)
    assert proc.returncode != 0
    assert "keda.enabled and adapter.apiService.enabled exclude each other" in proc.stderr


BAD_VALUES = [
    ("operator.replicas=-1", "at '/operator/replicas': minimum: got -1, want 0"),
    # Without leader election a second replica would pause (peering) or race (standalone).
    ("operator.leaderElection.enabled=false,operator.replicas=2",
     "at '/operator/replicas': maximum: got 2, want 1"),
    ("operator.leaderElection.leaseDurationSeconds=1",
     "at '/operator/leaderElection/leaseDurationSeconds': minimum"),
    ("adapter.replicas=-3", "at '/adapter/replicas': minimum"),
    ("adapter.securePort=443", "at '/adapter/securePort': minimum"),
    ("image.pullPolicy=Sometimes", "at '/image/pullPolicy'"),
    ("operator.watchNamespaces[0]=Not_A_Namespace", "at '/operator/watchNamespaces/0'"),
    ("adapter.staleAfterSeconds=0", "at '/adapter/staleAfterSeconds'"),
    ("operator.resyncSeconds=-5", "at '/operator/resyncSeconds'"),
    ("adapter.tls.generate=false", "at '/adapter/tls/existingSecret'"),
    ("oprator.replicas=1", "additional properties 'oprator' not allowed"),
]


@pytest.mark.parametrize(("setting", "message"), BAD_VALUES, ids=[b[0] for b in BAD_VALUES])
def test_schema_rejects_bad_values(helm: str, setting: str, message: str) -> None:
    proc = run_helm(helm, "template", "rel", str(CHART), "--set", setting, check=False)
    assert proc.returncode != 0, f"--set {setting} was accepted"
    assert SCHEMA_ERROR in proc.stderr, proc.stderr
    assert message in proc.stderr, proc.stderr


def test_schema_rejects_bad_keda_model(helm: str) -> None:
    proc = run_helm(helm, "template", "rel", str(CHART), "--set", "keda.enabled=true",
                    "--set", "keda.models[0].name=llama", check=False)
    assert SCHEMA_ERROR in proc.stderr, proc.stderr
    assert "at '/keda/models/0': missing properties 'namespace'" in proc.stderr, proc.stderr


# --------------------------------------------------------------------------- RBAC from code


def sample_model(namespace: str = "ml", name: str = "llama", **spec: Any) -> Model:
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND,
            "metadata": {"name": name, "namespace": namespace, "uid": "u-1", "generation": 1},
            "spec": {"model": {"name": "llama-3-8b", "source": "meta-llama/Llama-3.1-8B"},
                     **spec}}
    return Model.from_body(body)


def allows_named(rules: list[dict[str, Any]], group: str, resource: str, verb: str,
                 name: str) -> bool:
    """Whether some rule grants the verb on the object of that name (and only on named ones:
    rules without resourceNames are what allows() checks)."""
    return any(group in r.get("apiGroups", []) and resource in r.get("resources", [])
               and verb in r.get("verbs", []) and name in r.get("resourceNames", [])
               for r in rules)


def allows(rules: list[dict[str, Any]], group: str, resource: str, verb: str) -> bool:
    for r in rules:
        if r.get("resourceNames"):
            continue
        if (group in r.get("apiGroups", []) or "*" in r.get("apiGroups", [])) \
                and (resource in r.get("resources", []) or "*" in r.get("resources", [])) \
                and (verb in r.get("verbs", []) or "*" in r.get("verbs", [])):
            return True
    return False


def rendered(model: Model, kind: kinds.Kind, name: str) -> dict[str, Any]:
    return next(c.render(model, config.OperatorConfig()) for c in children.CHILDREN
                if c.kind == kind and c.name(model) == name)


def granted(rules: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    """(group, resource, verb) the rules grant on every object (rules naming objects aside)."""
    return {(g, res, v) for r in rules if not r.get("resourceNames")
            for g in r["apiGroups"] for res in r["resources"] for v in r["verbs"]}


def operator_permissions_needed() -> set[tuple[str, str, str]]:
    """(group, resource, verb) the operator uses, from its code, not from a hand list."""
    # Its children: every kind in the table, with delete where the spec can turn one off.
    needed = children.permissions()
    # The models: kopf watches them and patches its finalizer and annotations; the reconciler
    # reads them; status is patched.
    needed |= {(GROUP, PLURAL, v) for v in ("get", "list", "watch", "patch")}
    needed.add((GROUP, f"{PLURAL}/status", "patch"))
    # What the operator grants the routers it must hold itself (RBAC escalation check).
    role = next(c for c in children.CHILDREN if c.kind == kinds.ROLE)
    for rule in role.render(sample_model(), config.OperatorConfig())["rules"]:
        needed |= {(g, res, v) for g in rule["apiGroups"] for res in rule["resources"]
                   for v in rule["verbs"]}
    # The external store's password Secret (read), and the Events it posts on the models.
    needed |= {("", "secrets", "get"), ("", "events", "create")}
    return needed


# What kopf itself needs cluster-wide: it notices CRDs appearing and changing at run time.
KOPF_CLUSTER = {("apiextensions.k8s.io", "customresourcedefinitions", v)
                for v in ("list", "watch")}


def test_operator_rbac_is_what_the_operator_does(default_objs: list[dict[str, Any]],
                                                 all_objs: list[dict[str, Any]]) -> None:
    """Exactly: a permission the code needs and the chart lacks fails the operator at run
    time; one the chart grants and no code needs is privilege for nothing."""
    needed = operator_permissions_needed()
    # Cluster-wide: one ClusterRole.
    cluster = granted(one(default_objs, "ClusterRole", "-operator")["rules"])
    assert not needed - cluster, f"the operator's ClusterRole lacks {sorted(needed - cluster)}"
    assert cluster - KOPF_CLUSTER == needed, \
        f"the operator's ClusterRole grants more: {sorted(cluster - KOPF_CLUSTER - needed)}"
    # Leader election: what kubernetes_asyncio's LeaseLock and our release do (read, create,
    # replace), on the release's Lease in the release namespace.
    op = container(one(default_objs, "Deployment", "-operator"))
    args = operator_cli.parse_args(op["args"])
    for objs in (default_objs, all_objs):
        role = one([o for o in by_kind(objs, "Role")
                    if o["metadata"]["namespace"] == "prefix-router"], "Role", "-leader-election")
        assert allows(role["rules"], "coordination.k8s.io", "leases", "create")
        for verb in ("get", "update"):
            assert allows_named(role["rules"], "coordination.k8s.io", "leases", verb,
                                args.lease_name)
        binding = one(by_kind(objs, "RoleBinding"), "RoleBinding", "-leader-election")
        assert binding["roleRef"]["name"] == role["metadata"]["name"]
        assert binding["metadata"]["namespace"] == args.lease_namespace
    # Namespaced: the same in each watched namespace's Role; the ClusterRole keeps only kopf's
    # cluster-scoped observation.
    for role in by_kind(all_objs, "Role"):
        if role["metadata"]["name"].endswith("-leader-election"):
            continue
        have = granted(role["rules"])
        assert have == needed, f"Role in {role['metadata']['namespace']}: lacks " \
            f"{sorted(needed - have)}, grants more {sorted(have - needed)}"
    scoped = one(all_objs, "ClusterRole", "-operator")["rules"]
    assert granted(scoped) == KOPF_CLUSTER | {("", "namespaces", v) for v in ("list", "watch")}


def test_operator_rbac_is_least_privilege(default_objs: list[dict[str, Any]]) -> None:
    rules = one(default_objs, "ClusterRole", "-operator")["rules"]
    for r in rules:
        assert "*" not in r["verbs"] and "*" not in r["resources"] and "*" not in r["apiGroups"]
        risky = {"escalate", "bind", "impersonate", "deletecollection", "update"}
        assert not risky & set(r["verbs"])
    # Secrets and the things routers may read: never written.
    for verb in ("create", "patch", "delete", "list", "watch"):
        assert not allows(rules, "", "secrets", verb)
    assert not allows(rules, "discovery.k8s.io", "endpointslices", "create")
    assert not allows(rules, "", "pods", "get")
    # Leases: only in the release namespace's Role, and there only create, get and update
    # (get and update on the one Lease).
    assert not any("coordination.k8s.io" in r["apiGroups"] for r in rules)
    role = one(by_kind(default_objs, "Role"), "Role", "-leader-election")
    assert {v for r in role["rules"] for v in r["verbs"]} == {"create", "get", "update"}
    assert all(r.get("resourceNames") for r in role["rules"] if set(r["verbs"]) - {"create"})
    assert {(g, res) for r in role["rules"] for g in r["apiGroups"] for res in r["resources"]} \
        == {("coordination.k8s.io", "leases")}


def test_adapter_rbac(apiservice_objs: list[dict[str, Any]]) -> None:
    rules = one(apiservice_objs, "ClusterRole", "-adapter")["rules"]
    assert allows(rules, GROUP, PLURAL, "list") and allows(rules, "", "secrets", "get")
    assert not any(v in r["verbs"] for r in rules for v in ("create", "patch", "delete"))
    bindings = by_kind(apiservice_objs, "ClusterRoleBinding") + by_kind(apiservice_objs,
                                                                        "RoleBinding")
    refs = {(b["roleRef"]["kind"], b["roleRef"]["name"], b["metadata"].get("namespace"))
            for b in bindings}
    assert ("ClusterRole", "system:auth-delegator", None) in refs
    assert ("Role", "extension-apiserver-authentication-reader", "kube-system") in refs


# --------------------------------------------------------------------------- pod security


@pytest.mark.parametrize("which", ["default_objs", "all_objs", "apiservice_objs"])
def test_pod_security_on_every_container(which: str, request: pytest.FixtureRequest) -> None:
    objs = request.getfixturevalue(which)
    workloads = [o for o in objs if o["kind"] in WORKLOAD_KINDS]
    assert workloads
    for w in workloads:
        pod = w["spec"]["template"]["spec"]
        psc = pod.get("securityContext", {})
        assert psc.get("runAsNonRoot") is True and psc.get("runAsUser", 0) > 0
        assert psc.get("seccompProfile", {}).get("type") == "RuntimeDefault"
        for c in pod.get("initContainers", []) + pod["containers"]:
            where = f"{w['metadata']['name']}/{c['name']}"
            sc = c.get("securityContext", {})
            assert sc.get("runAsNonRoot") is True, where
            assert sc.get("readOnlyRootFilesystem") is True, where
            assert sc.get("allowPrivilegeEscalation") is False, where
            assert "ALL" in sc.get("capabilities", {}).get("drop", []), where
            assert not sc.get("privileged"), where
            assert (sc.get("seccompProfile") or psc["seccompProfile"])["type"] == "RuntimeDefault"
            res = c.get("resources", {})
            assert {"cpu", "memory"} <= set(res.get("requests", {})), where
            assert "memory" in res.get("limits", {}), where
            # A read-only root: whatever the process writes goes to a mounted emptyDir.
            assert any(m["mountPath"] == "/tmp" for m in c.get("volumeMounts", [])), where


# --------------------------------------------------------------------------- packaging


def test_package_resolves_the_crd_symlink(helm: str, tmp_path: Path) -> None:
    link = CHART / "crds" / "prefixroutedmodel.yaml"
    assert link.is_symlink() and link.resolve() == CRD_PATH.resolve()
    run_helm(helm, "package", str(CHART), "--destination", str(tmp_path))
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    tgz = tmp_path / f"{chart['name']}-{chart['version']}.tgz"
    with tarfile.open(tgz) as tar:
        names = tar.getnames()
        member = tar.extractfile(f"{chart['name']}/crds/prefixroutedmodel.yaml")
        assert member is not None and member.read() == CRD_PATH.read_bytes()
    assert not any("/ci/" in n for n in names), "ci/ values are test fixtures, not packaged"


def router_metric_names() -> set[str]:
    from prefix_router.metrics import RouterMetrics

    return {m.name for m in RouterMetrics().registry.collect()}


def test_dockerfile_matches_pyproject_and_chart(default_objs: list[dict[str, Any]]) -> None:
    """The image is not built here (no container engine); this keeps it consistent."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    dockerfile = (ROOT / "Dockerfile").read_text()
    instructions = [ln.strip() for ln in re.sub(r"\\\n", " ", dockerfile).splitlines()
                    if ln.strip() and not ln.lstrip().startswith("#")]
    froms = [ln.split()[1] for ln in instructions if ln.startswith("FROM ")]
    assert froms and all(f.startswith("python:3.11-slim") for f in froms)
    # Every entry point is installed and run once (--help) at build time.
    for script in pyproject["project"]["scripts"]:
        assert f"{script} --help" in dockerfile, f"the image does not check {script}"
    # The package is built from every source directory setuptools maps.
    copied = {ln.split()[1] for ln in instructions if ln.startswith("COPY ") and "--from" not in ln}
    for src in pyproject["tool"]["setuptools"]["package-dir"].values():
        assert src.split("/")[0] in copied, f"Dockerfile does not COPY {src}"
    # Non-root, with the uid/gid the chart runs it as.
    user = [ln.split()[1] for ln in instructions if ln.startswith("USER ")][-1]
    psc = yaml.safe_load((CHART / "values.yaml").read_text())["podSecurityContext"]
    assert user == f"{psc['runAsUser']}:{psc['runAsGroup']}"
    assert f"--uid {psc['runAsUser']}" in dockerfile and f"--gid {psc['runAsGroup']}" in dockerfile
    # The chart's default image is the one the operator defaults to, at the package's version.
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["appVersion"] == pyproject["project"]["version"]
    assert config.ROUTER_IMAGE.endswith(":" + pyproject["project"]["version"])
    for deploy in by_kind(default_objs, "Deployment"):
        c = container(deploy)
        assert c["image"] == config.ROUTER_IMAGE
        assert c["command"][0] in pyproject["project"]["scripts"]


# --------------------------------------------------------------------------- real API server


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.k8s
def test_server_side_dry_run(helm: str, control_plane: Any) -> None:
    """kube-apiserver validates the rendered objects (schemas, CRD schemas, RBAC refs)."""
    cp = control_plane
    # helm installs crds/ before the templates; do the same (these CRDs are what the chart ships).
    cp.kubectl("apply", "--server-side", "--force-conflicts", "--field-manager=tests",
               "-f", str(CHART / "crds"))
    for crd in ("prefixroutedmodels.prefixrouter.io", "clusterkopfpeerings.kopf.dev",
                "kopfpeerings.kopf.dev"):
        cp.kubectl("wait", "--for=condition=Established", f"--timeout={kubectl_timeout(30)}",
                   f"crd/{crd}")
    values = yaml.safe_load(ALL_OPTIONS.read_text())
    namespaces = {*values["operator"]["watchNamespaces"], values["keda"]["namespace"],
                  values["serviceMonitor"]["namespace"], "prefix-router"}
    existing = {n["metadata"]["name"] for n in cp.kubectl_json("get", "namespaces")["items"]}
    created = sorted(namespaces - existing)
    for n in created:
        cp.kubectl("create", "namespace", n)
    try:
        for args in ([], ["--set", "adapter.apiService.enabled=true"], ["-f", str(ALL_OPTIONS)],
                     PEERING):
            objs = [o for o in template(helm, *args) if o["kind"] not in FOREIGN_KINDS]
            out = cp.kubectl("apply", "--server-side", "--dry-run=server", "--force-conflicts",
                             "--field-manager=helm-dry-run", "-f", "-",
                             input=json.dumps({"apiVersion": "v1", "kind": "List",
                                               "items": objs})).stdout
            assert out.count("(server dry run)") == len(objs), out
    finally:
        for n in created:
            cp.kubectl("delete", "namespace", n, "--wait=false", check=False)


class Process:
    """A command of the image, run here the way the release's pod would run it."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log: Path) -> None:
        self.name, self.log = name, log
        with open(log, "wb") as fh:
            self.proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, env=env,
                                         cwd=ROOT)

    def alive(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"{self.name} exited ({self.proc.returncode}):\n{self.tail()}")
        return True

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

    def tail(self, lines: int = 60) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


def _kubeconfig(cp: Any, token: str, path: Path) -> Path:
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "c", "cluster": {
            "server": cp.server,
            "certificate-authority-data": base64.b64encode(cp.ca_file.read_bytes()).decode()}}],
        "users": [{"name": "sa", "user": {"token": token}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "sa"}}],
        "current-context": "c",
    }))
    path.chmod(0o600)
    return path


def _swap(args: list[str], **flags: str) -> list[str]:
    """Replace --flag=value arguments (and only those: each must be there)."""
    out, seen = [], set()
    for a in args:
        key = a.split("=", 1)[0].lstrip("-").replace("-", "_")
        if key in flags:
            out.append(f"{a.split('=', 1)[0]}={flags[key]}")
            seen.add(key)
        else:
            out.append(a)
    assert seen == set(flags), f"rendered args {args} lack {set(flags) - seen}"
    return out


@pytest.fixture
def redis_store() -> Iterator[tuple[int, redis.Redis]]:
    binary = os.environ.get("REDIS_SERVER") or shutil.which("redis-server")
    if not binary:
        pytest.fail("redis-server is not installed (make test installs it)", pytrace=False)
    with running_redis(binary) as port:
        client = redis.Redis(port=port, decode_responses=True)
        try:
            yield port, client
        finally:
            client.close()


def _condition(obj: dict[str, Any] | None, type_: str) -> dict[str, Any]:
    for c in ((obj or {}).get("status") or {}).get("conditions") or []:
        if c["type"] == type_:
            return c
    return {}


@pytest.mark.k8s
@pytest.mark.slow
def test_helm_install_runs_and_uninstall_cleans_up(
        helm: str, control_plane: Any, redis_store: tuple[int, redis.Redis],
        tmp_path: Path) -> None:
    cp = control_plane
    if not hasattr(cp, "expose_local_service"):
        pytest.skip("needs the local control plane (the adapter runs as a local process)")
    redis_port, store = redis_store
    suffix = uuid.uuid4().hex[:6]
    ns, release = f"chart-{suffix}", f"pr-{suffix}"
    adapter_port = free_port()
    env = cp.env()
    cp.kubectl("create", "namespace", ns)
    procs: list[Process] = []
    installed = False
    crd_existed = cp.kubectl("get", "crd", f"{PLURAL}.{GROUP}", check=False).returncode == 0
    try:
        # ------------------------------------------------------------ install
        # --take-ownership: another test may have left its own APIService of this group behind.
        run_helm(helm, "install", release, str(CHART), "--namespace", ns, "--wait",
                 "--timeout", kubectl_timeout(90), "--take-ownership",
                 "--set", f"operator.watchNamespaces={{{ns}}}",
                 "--set", "adapter.apiService.enabled=true",
                 "--set", f"adapter.service.port={adapter_port}", env=env)
        installed = True
        for crd in (f"{PLURAL}.{GROUP}", "clusterkopfpeerings.kopf.dev", "kopfpeerings.kopf.dev"):
            cp.kubectl("wait", "--for=condition=Established", f"--timeout={kubectl_timeout(30)}",
                   f"crd/{crd}")
        if not crd_existed:
            assert cp.kubectl("get", "crd", f"{PLURAL}.{GROUP}").returncode == 0
        manifest = [d for d in yaml.safe_load_all(run_helm(
            helm, "get", "manifest", release, "--namespace", ns, env=env).stdout) if d]
        op_name = one(manifest, "Deployment", "-operator")["metadata"]["name"]
        ad_name = one(manifest, "Deployment", "-adapter")["metadata"]["name"]
        for d in (op_name, ad_name):
            cp.kubectl("wait", "--for=condition=Available", f"--timeout={kubectl_timeout(60)}",
                       f"deployment/{d}", "-n", ns, timeout=90)
        # Leader election, not peering: no peering object.
        assert not cp.kubectl_json("get", "kopfpeerings.kopf.dev", "-n", ns)["items"]
        lease_name = f"{op_name}-leader"

        # An upgrade keeps the adapter's certificates (read back with lookup): no rotation, no
        # restart of the adapter pods.
        def certs() -> tuple[str, str]:
            sec = cp.kubectl_json("get", "secret", f"{ad_name}-serving-cert", "-n", ns)
            dep = cp.kubectl_json("get", "deployment", ad_name, "-n", ns)
            return (sec["data"]["tls.crt"],
                    dep["spec"]["template"]["metadata"]["annotations"]
                    ["prefixrouter.io/certificates-hash"])

        before = certs()
        run_helm(helm, "upgrade", release, str(CHART), "--namespace", ns, "--reuse-values",
                 "--wait", "--timeout", kubectl_timeout(60), env=env)
        assert certs() == before

        # ------------------------------------------------------------ run what the pods run
        op_dep = cp.kubectl_json("get", "deployment", op_name, "-n", ns)
        ad_dep = cp.kubectl_json("get", "deployment", ad_name, "-n", ns)
        op_c, ad_c = container(op_dep), container(ad_dep)
        bin_dir = Path(sys.executable).parent

        def token(deploy: dict[str, Any]) -> str:
            sa = deploy["spec"]["template"]["spec"]["serviceAccountName"]
            return cp.kubectl("create", "token", sa, "-n", ns, "--duration=1h").stdout.strip()

        secret = cp.kubectl_json("get", "secret", f"{ad_name}-serving-cert", "-n", ns)
        crt, key = tmp_path / "tls.crt", tmp_path / "tls.key"
        crt.write_bytes(base64.b64decode(secret["data"]["tls.crt"]))
        key.write_bytes(base64.b64decode(secret["data"]["tls.key"]))
        key.chmod(0o600)
        # No pod network here: the Service becomes an ExternalName to this machine (with the
        # port the chart gave it), which kube-apiserver's aggregator dials instead.
        svc = cp.kubectl_json("get", "service", ad_name, "-n", ns)
        assert svc["spec"]["ports"][0]["port"] == adapter_port
        cp.kubectl("delete", "service", ad_name, "-n", ns)
        cp.expose_local_service(ad_name, ns, adapter_port)
        ad_args = _swap(ad_c["args"], secure_port=str(adapter_port), bind_address="127.0.0.1",
                        tls_cert_file=str(crt), tls_private_key_file=str(key))
        ad_kc = _kubeconfig(cp, token(ad_dep), tmp_path / "adapter.kubeconfig")
        procs.append(Process("adapter", [str(bin_dir / ad_c["command"][0]), *ad_args,
                                         f"--kubeconfig={ad_kc}", "--verbose"],
                             {**os.environ, "KUBECONFIG": str(ad_kc)}, tmp_path / "adapter.log"))
        health = free_port()
        op_args = _swap(op_c["args"], liveness=f"http://127.0.0.1:{health}/healthz")
        op_env = {**os.environ, "KUBECONFIG": str(_kubeconfig(cp, token(op_dep),
                                                                tmp_path / "operator.kubeconfig")),
                  "POD_ID": "chart-test-operator",
                  **{e["name"]: e["value"] for e in op_c["env"] if "value" in e}}
        procs.append(Process("operator", [str(bin_dir / op_c["command"][0]), *op_args], op_env,
                             tmp_path / "operator.log"))

        apiservice = f"{external_metrics.VERSION}.{external_metrics.GROUP}"
        cp.wait_for(lambda: procs[0].alive() and _condition(
            cp.kubectl_json("get", "apiservice", apiservice), "Available").get("status") == "True",
            45, f"APIService {apiservice} Available")

        # ------------------------------------------------------------ a model, served
        name = "llama"
        cp.apply({"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND,
                  "metadata": {"name": name, "namespace": ns},
                  "spec": {"model": {"name": "llama-3-8b", "source": "meta-llama/Llama-3.1-8B"},
                           "router": {"replicas": 1, "kvCapacityTokens": 100000},
                           "cacheStore": {"type": "external",
                                          "url": f"redis://127.0.0.1:{redis_port}/0"}}})
        model_key = sample_model(ns, name).key
        prefix = store_prefix(model_key)
        # Stamped an hour ahead: fresh for the whole test, however slow the machine.
        store.hset(StoreKeys(model_key).figures("router-0"), mapping=RouterFigures(
            prompt_tokens=1000, cached_tokens=600, working_set_tokens=4096, in_flight=3,
            updated_at=time.time() + 3600).as_hash())

        def metric(m: str) -> list[dict[str, Any]]:
            sel = urllib.parse.quote(f"{naming.MODEL_LABEL}={name}")
            path = f"/apis/{external_metrics.GROUP_VERSION}/namespaces/{ns}/{m}?labelSelector={sel}"
            return json.loads(cp.kubectl("get", "--raw", path).stdout)["items"]

        items = cp.wait_for(lambda: metric(external_metrics.IN_FLIGHT_METRIC), 30,
                            "our in-flight figure through the chart's APIService")
        assert [i["value"] for i in items] == ["3"]
        assert [i["value"] for i in metric(external_metrics.WORKING_SET_METRIC)] == ["4096"]

        def denied() -> list[str]:
            return [ln for p in procs for ln in p.log.read_text(errors="replace").splitlines()
                    if "Forbidden" in ln or " 403" in ln]

        def ready() -> dict[str, Any] | None:
            procs[1].alive()
            assert not denied(), "the release's RBAC denied something:\n" + "\n".join(denied())
            body = cp.kubectl_json("get", "prm", name, "-n", ns)
            return body if _condition(body, "Ready").get("status") == "True" else None

        body = cp.wait_for(ready, 90, f"PrefixRoutedModel {ns}/{name} Ready")
        assert body["status"]["observedGeneration"] == 1
        for kind, obj_name in [("deployment", f"{name}-model-server"),
                               ("deployment", f"{name}-router"), ("role", f"{name}-router"),
                               ("rolebinding", f"{name}-router"), ("configmap", f"{name}-router")]:
            cp.kubectl("get", kind, obj_name, "-n", ns)
        # The operator holds the release's Lease under its pod name (the leader-election Role
        # works: create, get and update).
        lease = cp.kubectl_json("get", "lease", lease_name, "-n", ns)
        assert lease["spec"]["holderIdentity"] == "chart-test-operator"

        # The finalizer runs while the operator does: it removes the model's keys.
        cp.kubectl("delete", "prm", name, "-n", ns, "--wait=true",
                   f"--timeout={kubectl_timeout(60)}", timeout=90)
        assert not list(store.scan_iter(match=prefix + "*"))
        for p in procs:
            p.alive()
        assert not denied(), "the release's RBAC denied something:\n" + "\n".join(denied())
    except BaseException:
        for p in procs:
            if p.log.exists():
                sys.stderr.write(f"\n--- {p.name} log ---\n{p.tail()}\n")
        raise
    finally:
        for p in reversed(procs):
            p.stop()
        if installed:
            run_helm(helm, "uninstall", release, "--namespace", ns, "--wait", "--timeout",
                     kubectl_timeout(60), env=env, check=False)

    # ---------------------------------------------------------------- uninstall cleaned up
    try:
        for kind, obj_name, where in [
                ("deployment", op_name, ns), ("deployment", ad_name, ns),
                ("serviceaccount", op_name, ns), ("secret", f"{ad_name}-serving-cert", ns),
                ("role", op_name, ns),
                ("role", f"{op_name}-leader-election", ns),
                ("rolebinding", f"{op_name}-leader-election", ns),
                ("rolebinding", f"{ad_name}:extension-apiserver-authentication-reader",
                 "kube-system"),
                ("clusterrole", op_name, None), ("clusterrole", ad_name, None),
                ("clusterrolebinding", f"{ad_name}:system:auth-delegator", None),
                ("apiservice", apiservice, None)]:
            scope = ["-n", where] if where else []
            proc = cp.kubectl("get", kind, obj_name, *scope, check=False)
            assert proc.returncode != 0 and "NotFound" in proc.stderr, \
                f"{kind} {obj_name} survived helm uninstall"
        # CRDs from crds/ stay (Helm never deletes them: that would delete every model).
        assert cp.kubectl("get", "crd", f"{PLURAL}.{GROUP}", check=False).returncode == 0
    finally:
        cp.kubectl("delete", "namespace", ns, "--wait=false", check=False)
