"""The `control_plane` fixture: a real local Kubernetes control plane for the whole session.

- PREFIXROUTER_USE_EXISTING_CLUSTER=1: use the cluster of $KUBECONFIG (kind, ...) instead.
- Otherwise the binaries come from hack/cluster/ensure-binaries.sh --check (PREFIXROUTER_K8S_BIN,
  KUBEBUILDER_ASSETS or the build cache; `make k8s-binaries` builds them once). Set
  PREFIXROUTER_K8S_BUILD=1 to let the fixture run the (long, one-time) build itself.
- Binaries unavailable: the tests FAIL with the script's error when $CI is set, else skip.
- PREFIXROUTER_KEEP_CLUSTER_DIR=/path keeps certificates, kubeconfig and logs there.

Every wait is scaled (tests/waiting.py): the control plane these fixtures hand out multiplies
the timeout of each wait_for and kubectl call by waiting.scale(), and so does pytest-timeout's
per-test limit for the tests here and in tests/operator.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from waiting import kubectl_timeout, scaled

_CLUSTER_DIR = Path(__file__).resolve().parents[2] / "e2e" / "cluster"
if str(_CLUSTER_DIR) not in sys.path:
    sys.path.insert(0, str(_CLUSTER_DIR))

import controlplane  # noqa: E402
from controlplane import BinariesUnavailable, ControlPlane, ExistingCluster  # noqa: E402


class _Patient:
    """wait_for and kubectl with their timeouts scaled: the same waits, on a busy machine too."""

    def wait_for(self, predicate: Any, timeout: float = 60.0, what: str = "condition",
                 interval: float = 0.25) -> Any:
        return super().wait_for(predicate, scaled(timeout), what, interval)  # type: ignore[misc]

    def kubectl(self, *args: str, input: str | None = None, check: bool = True,
                timeout: float = 60) -> Any:
        return super().kubectl(*args, input=input, check=check,  # type: ignore[misc]
                               timeout=scaled(timeout))


class PatientControlPlane(_Patient, ControlPlane):
    pass


class PatientExistingCluster(_Patient, ExistingCluster):
    pass


def _truthy(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no")


def _unavailable(reason: str) -> None:
    if _truthy("CI"):
        pytest.fail(f"Kubernetes control plane unavailable (CI is set, so this fails):\n{reason}",
                    pytrace=False)
    pytest.skip(f"Kubernetes control plane unavailable: {reason}")


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """A started ControlPlane (or ExistingCluster): .kubeconfig, .server, .bin_dir,
    .kubectl(*args), .kubectl_json(*args), .apply(manifest), .request(...), .wait_for(...),
    .env(), .node_names, .startup_seconds, .log_dir."""
    if _truthy("PREFIXROUTER_USE_EXISTING_CLUSTER"):
        try:
            yield PatientExistingCluster()
        except controlplane.ControlPlaneError as e:
            pytest.fail(f"PREFIXROUTER_USE_EXISTING_CLUSTER=1 but the cluster is unusable: {e}",
                        pytrace=False)
        return
    try:
        bin_dir = controlplane.ensure_binaries(build=_truthy("PREFIXROUTER_K8S_BUILD"))
        problem = ""
    except BinariesUnavailable as e:
        problem = str(e)
    if problem:
        _unavailable(problem)
    keep = os.environ.get("PREFIXROUTER_KEEP_CLUSTER_DIR")
    if keep:
        work = Path(keep)
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
    else:
        work = tmp_path_factory.mktemp("controlplane")
    cp = PatientControlPlane(bin_dir, work, timeout=scaled(90))
    try:
        cp.start()
    except controlplane.ControlPlaneError as e:
        pytest.fail(f"the local control plane did not start: {e}", pytrace=False)
    sys.stderr.write(
        f"\n[control_plane] up in {cp.startup_seconds:.1f}s at {cp.server} "
        f"(kubeconfig {cp.kubeconfig}, logs {cp.log_dir})\n"
    )
    try:
        yield cp
    finally:
        cp.stop()


_CRD_PATH = Path(__file__).resolve().parents[2] / "crds" / "prefixroutedmodel.yaml"


@pytest.fixture(scope="module")
def cp(control_plane: ControlPlane) -> ControlPlane:
    """The control plane with the PrefixRoutedModel CRD applied and Established (a test module
    that needs more, such as a skip on an existing cluster, defines its own `cp`)."""
    control_plane.kubectl(
        "apply", "--server-side", "--force-conflicts", "--field-manager=tests",
        "-f", str(_CRD_PATH),
    )  # fmt: skip
    control_plane.kubectl(
        "wait", "--for=condition=Established", f"--timeout={kubectl_timeout(30)}",
        "crd/prefixroutedmodels.prefixrouter.io",
    )  # fmt: skip
    return control_plane
