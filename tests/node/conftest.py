"""Fixtures of the real-node suite (marker `node`): our chart and a PrefixRoutedModel on a
real single-node cluster (kubelet + containerd + runc, e2e/cluster/cluster.py), pods of our
own image (`make image`).

- The cluster: one for the session, brought up here and taken down at the end; the teardown
  fails the session if the machine differs from before (hoststate.fingerprint: iptables rule
  sets, mounts, links, addresses, routes, sysctls, cgroups, shared directories). When `make
  cluster` already runs one, the suite uses it and leaves it up. test_teardown.py runs first,
  before that cluster (one node cluster per machine): its own `make cluster` and
  `make cluster-down`.
- Where this machine cannot run a node at all (not Linux, not root, no cgroup cpu/memory/pids
  controller, no overlayfs), skipped with the check that failed; under CI (the `CI`
  environment variable set), failed with it instead: CI runs on machines that can, so there a
  skip would hide a broken suite. Missing binaries or images are errors that name the make
  target to run (`make test` builds them first).
- Timeouts scale with PREFIXROUTER_TIMEOUT_SCALE (default 1; a busy machine may want 2).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

_CLUSTER_DIR = Path(__file__).resolve().parents[2] / "e2e" / "cluster"
if str(_CLUSTER_DIR) not in sys.path:
    sys.path.insert(0, str(_CLUSTER_DIR))

import cluster as node_cluster  # noqa: E402
import product  # noqa: E402
from controlplane import ExistingCluster  # noqa: E402
from nodesuite import MODEL, MODEL_NAMESPACE, STEP_SCALE, Cluster, scaled, unavailable  # noqa: E402


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "node: needs the real single-node cluster (root)")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    ours = [item for item in items if here in Path(str(item.fspath)).parents]
    for item in ours:
        item.add_marker(pytest.mark.node)
        # the first test also brings the cluster up and installs the chart
        item.add_marker(pytest.mark.timeout(scaled(900)))
    # the teardown test brings up a cluster of its own: before the session's, which stays up
    # from the first test that needs it to the end
    first = [item for item in ours if Path(str(item.fspath)).name == "test_teardown.py"]
    items[:] = first + [item for item in items if item not in first]


@pytest.fixture(scope="session")
def node_machine() -> None:
    """This machine can run a node at all (else skipped, or failed under CI)."""
    problems = node_cluster.machine_problems()
    if problems:
        unavailable("this machine cannot run the real node: " + "; ".join(problems))


@pytest.fixture(scope="session")
def node(node_machine: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    try:
        images = {n: i.ref for n, i in node_cluster.node_images().items()}
        state = node_cluster.read_state()
        if state and node_cluster.owner_alive(state) and state.get("ready"):
            # `make cluster` runs one: use it as it is, leave it up
            kubectl = str(node_cluster.node_binaries() / "kubectl")
            yield Cluster(ExistingCluster(state["kubeconfig"], kubectl=kubectl), images)
            return
        cluster = node_cluster.NodeCluster(tmp_path_factory.mktemp("node"),
                                           timeout=scaled(240))
        cluster.start()
    except node_cluster.NodeUnavailable as e:
        pytest.fail(f"the real node cannot start:\n{e}", pytrace=False)
    sys.stderr.write(f"\n[node] up: {cluster.timings}\n")
    try:
        assert cluster.cp is not None
        yield Cluster(cluster.cp, images)
    finally:
        cluster.stop()
    if cluster.leftovers:
        pytest.fail("the node's teardown left this machine different from before:\n  "
                    + "\n  ".join(cluster.leftovers), pytrace=False)


@pytest.fixture(scope="session")
def helm() -> str:
    try:
        return product.helm_binary()
    except RuntimeError as e:
        pytest.fail(str(e), pytrace=False)


@pytest.fixture(scope="session")
def release(node: Cluster, helm: str) -> Iterator[dict[str, float]]:
    """The chart installed with our image: operator, metrics adapter, APIService Available.
    Yields {"install_seconds": ...}."""
    seconds = product.install_chart(node.cp, helm, node.images,
                                    timeout=f"{int(scaled(600))}s")
    try:
        yield {"install_seconds": seconds}
    finally:
        product.uninstall_chart(node.cp, helm)


@pytest.fixture(scope="session")
def model(node: Cluster, release: dict[str, float]) -> Iterator[dict[str, str]]:
    """PrefixRoutedModel `sim` in `node-e2e`: 2 simulator pods, 2 routers, the managed Redis,
    and a NodePort Service to its routers. Yields name, namespace and the client URL."""
    cp = node.cp
    cp.kubectl("create", "namespace", MODEL_NAMESPACE, check=False)
    # engine steps of 10 ms: a 2,000-token stream lasts 20 s, far longer than the routers'
    # preStop pause, at 100 chunks a second (the rolling-update test's long streams)
    cp.apply(product.model_manifest(MODEL, MODEL_NAMESPACE, node.images["product"],
                                    time_scale=STEP_SCALE))
    cp.apply(product.router_nodeport(MODEL, MODEL_NAMESPACE))
    product.wait_model_ready(cp, MODEL_NAMESPACE, MODEL, 2, scaled(300))
    try:
        yield {"name": MODEL, "namespace": MODEL_NAMESPACE,
               "url": product.nodeport_url(cp, MODEL, MODEL_NAMESPACE)}
    finally:
        product.delete_model(cp, MODEL, MODEL_NAMESPACE, scaled(180))
