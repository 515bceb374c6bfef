"""The PrefixRoutedModel CRD on a real API server: it installs, defaults apply, and each
invalid object of the table is refused with a message that names the problem."""

from __future__ import annotations

import copy
import json
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from waiting import kubectl_timeout

pytestmark = pytest.mark.k8s

CRD_PATH = Path(__file__).resolve().parents[2] / "crds" / "prefixroutedmodel.yaml"


@pytest.fixture(scope="module")
def crd(control_plane: Any) -> dict[str, Any]:
    control_plane.kubectl("apply", "--server-side", "--force-conflicts",
                          "--field-manager=tests", "-f", str(CRD_PATH))
    control_plane.kubectl("wait", "--for=condition=Established",
                          f"--timeout={kubectl_timeout(30)}",
                          "crd/prefixroutedmodels.prefixrouter.io")
    return yaml.safe_load(CRD_PATH.read_text())


@pytest.fixture(scope="module")
def ns(control_plane: Any, crd: dict[str, Any]) -> Iterator[str]:
    name = f"crd-{uuid.uuid4().hex[:6]}"
    control_plane.kubectl("create", "namespace", name)
    yield name
    control_plane.kubectl("delete", "namespace", name, "--wait=false", check=False)


def valid(name: str = "m") -> dict[str, Any]:
    return {
        "apiVersion": "prefixrouter.io/v1alpha1",
        "kind": "PrefixRoutedModel",
        "metadata": {"name": name},
        "spec": {"model": {"name": "llama", "source": "meta-llama/Llama-3.1-8B-Instruct"}},
    }


def with_spec(**changes: Any) -> Callable[[dict[str, Any]], None]:
    def mutate(obj: dict[str, Any]) -> None:
        for path, value in changes.items():
            node = obj["spec"]
            *parents, leaf = path.split("__")
            for p in parents:
                node = node.setdefault(p, {})
            node[leaf] = value
    return mutate


def renamed(name: str) -> Callable[[dict[str, Any]], None]:
    def mutate(obj: dict[str, Any]) -> None:
        obj["metadata"]["name"] = name
    return mutate


def without_model(obj: dict[str, Any]) -> None:
    del obj["spec"]["model"]


INVALID: list[tuple[str, Callable[[dict[str, Any]], None], str]] = [
    ("replicas-not-an-integer", with_spec(replicas="three"), "must be of type integer"),
    ("negative-load-bound", with_spec(router__loadBound=-0.5),
     "should be greater than or equal to 0"),
    ("too-many-gpus", with_spec(resources__gpus=17), "should be less than or equal to 16"),
    ("min-above-max", with_spec(minReplicas=5, maxReplicas=2, replicas=2),
     "spec.minReplicas must be <= spec.maxReplicas"),
    ("replicas-above-max", with_spec(replicas=9),
     "spec.replicas must be within [spec.minReplicas, spec.maxReplicas]"),
    ("external-store-without-url", with_spec(cacheStore__type="external"),
     "spec.cacheStore.url is required when spec.cacheStore.type is external"),
    ("managed-store-with-url", with_spec(cacheStore__url="redis://x:6379"),
     "apply only when spec.cacheStore.type is external"),
    ("custom-engine-without-image", with_spec(engine__type="custom"),
     "spec.engine.image is required when spec.engine.type is custom"),
    ("unknown-engine", with_spec(engine__type="tgi"), 'Unsupported value: "tgi"'),
    ("vllm-odd-block-size", with_spec(router__blockSize=24),
     "spec.router.blockSize must be one of them"),
    ("autoscaling-without-kv-capacity", with_spec(autoscaling__enabled=True),
     "needs spec.router.kvCapacityTokens > 0"),
    ("engine-port-clashes-with-router", with_spec(engine__port=8080),
     "must not be 8080 or 6379"),
    ("bad-cpu-quantity", with_spec(resources__cpu="four cores"), "should match"),
    ("bad-pvc-source", with_spec(model__source="pvc://Bad_Claim/x"),
     "a PVC source must look like pvc://<claim-name>/<path>"),
    ("bad-store-url-scheme", with_spec(cacheStore__type="external",
                                       cacheStore__url="http://redis:6379"), "should match"),
    ("toleration-exists-with-value",
     with_spec(resources__tolerations=[{"key": "k", "operator": "Exists", "value": "v"}]),
     "a toleration with operator Exists must not have a value"),
    ("missing-model", without_model, "spec.model: Required value"),
    ("name-too-long", renamed("m" * 51), "metadata.name must be at most 50 characters"),
    ("name-not-dns-1035", renamed("1-model"), "must be a DNS-1035 label"),
]


@pytest.mark.parametrize(("case", "mutate", "expected"), INVALID, ids=[c[0] for c in INVALID])
def test_invalid_models_are_rejected_with_a_clear_message(
        control_plane: Any, ns: str, case: str, mutate: Callable[[dict[str, Any]], None],
        expected: str) -> None:
    obj = copy.deepcopy(valid(f"bad-{case}"))
    mutate(obj)
    proc = control_plane.kubectl("create", "-n", ns, "-f", "-", input=json.dumps(obj),
                                 check=False)
    assert proc.returncode != 0, f"{case} was accepted"
    assert "is invalid" in proc.stderr or "Invalid value" in proc.stderr, proc.stderr
    assert expected in proc.stderr, proc.stderr


def test_a_minimal_model_is_accepted_and_defaulted(control_plane: Any, ns: str) -> None:
    control_plane.kubectl("create", "-n", ns, "-f", "-", input=json.dumps(valid("minimal")))
    spec = control_plane.kubectl_json("get", "prm", "minimal", "-n", ns)["spec"]
    assert spec["replicas"] == 1 and spec["minReplicas"] == 1 and spec["maxReplicas"] == 4
    assert spec["engine"] == {"type": "vllm", "port": 8000, "healthPath": "/health",
                              "startupTimeoutSeconds": 1800}
    assert spec["router"]["blockSize"] == 16 and spec["router"]["replicas"] == 2
    assert spec["cacheStore"] == {"type": "managed", "maxMemoryMiB": 512}
    assert spec["autoscaling"]["enabled"] is False
    assert spec["resources"]["gpus"] == 1 and spec["resources"]["sharedMemorySize"] == "8Gi"


def test_status_is_a_subresource_and_pruned_to_its_schema(control_plane: Any, ns: str) -> None:
    control_plane.kubectl("create", "-n", ns, "-f", "-", input=json.dumps(valid("st")))
    control_plane.kubectl("patch", "prm", "st", "-n", ns, "--subresource=status",
                          "--type=merge", "-p", json.dumps({"status": {
                              "readyReplicas": 1, "kopf": {"progress": {}}}}))
    status = control_plane.kubectl_json("get", "prm", "st", "-n", ns)["status"]
    # unknown status fields are pruned: why kopf's bookkeeping lives in annotations
    assert status == {"readyReplicas": 1}


def test_scale_subresource(control_plane: Any, ns: str) -> None:
    control_plane.kubectl("create", "-n", ns, "-f", "-", input=json.dumps(valid("sc")))
    control_plane.kubectl("scale", "prm", "sc", "-n", ns, "--replicas=3")
    assert control_plane.kubectl_json("get", "prm", "sc", "-n", ns)["spec"]["replicas"] == 3
    scale = json.loads(control_plane.kubectl(
        "get", "--raw",
        f"/apis/prefixrouter.io/v1alpha1/namespaces/{ns}/prefixroutedmodels/sc/scale").stdout)
    assert scale["kind"] == "Scale" and scale["spec"]["replicas"] == 3
    # the CEL bounds hold through the scale subresource too
    proc = control_plane.kubectl("scale", "prm", "sc", "-n", ns, "--replicas=50", check=False)
    assert proc.returncode != 0
    assert "spec.replicas must be within" in proc.stderr


def test_printer_columns_and_short_name(control_plane: Any, ns: str) -> None:
    control_plane.kubectl("create", "-n", ns, "-f", "-", input=json.dumps(valid("cols")))
    out = control_plane.kubectl("get", "prm", "cols", "-n", ns).stdout
    header = out.splitlines()[0].split()
    assert header == ["NAME", "READY", "REPLICAS", "HIT", "RATE", "CACHE", "PRESSURE", "EXACT",
                      "AGE"]
    wide = control_plane.kubectl("get", "prm", "cols", "-n", ns, "-o", "wide").stdout
    assert "REASON" in wide and "ROUTER" in wide and "DEGRADED" in wide
    cats = control_plane.kubectl("get", "prefixrouter", "-n", ns, "-o", "name").stdout
    assert "prefixroutedmodel.prefixrouter.io/cols" in cats
