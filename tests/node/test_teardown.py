"""`make cluster` then `make cluster-down` leave this machine as they found it.

The whole hoststate.fingerprint() must read the same before and after: the iptables and
ip6tables rule sets (every table, chain and rule, without counters), the nft ruleset, every
mount, the links, addresses and routes, every sysctl that is a setting, the top-level cgroups
and the directories containerd, libcni and the kubelet write to. The node's guard rule must be
there while the cluster is up (so its absence after is the teardown's doing) and no rule may
name the node after.

conftest.py runs this test first, before the session's cluster: one node cluster per machine.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

_CLUSTER_DIR = Path(__file__).resolve().parents[2] / "e2e" / "cluster"
if str(_CLUSTER_DIR) not in sys.path:
    sys.path.insert(0, str(_CLUSTER_DIR))

import cluster as node_cluster  # noqa: E402
import hoststate  # noqa: E402
from nodesuite import scaled, unavailable  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def make(target: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["make", "-s", "-C", str(REPO), target], capture_output=True,
                          text=True, check=False, timeout=scaled(900))


def iptables_lines() -> list[str]:
    return [ln for tool in hoststate.IPTABLES for ln in hoststate.iptables_save(tool)]


def test_make_cluster_then_cluster_down_leave_the_machine_as_found(node_machine: None) -> None:
    state = node_cluster.read_state()
    if state is not None and node_cluster.owner_alive(state):
        unavailable(f"a node cluster is up (PID {state.get('owner')}, `make cluster`): this "
                    "test would take it down")
    # The packages the node runs on stay installed by design (docs/controlplane.md); and a
    # first `make cluster-down` removes what an earlier version's teardown left behind.
    node_cluster.ensure_packages()
    assert make("cluster-down").returncode == 0
    before = hoststate.fingerprint()
    up = make("cluster")
    try:
        assert up.returncode == 0, f"make cluster failed:\n{up.stdout}\n{up.stderr}"
        up_rules = iptables_lines()
    finally:
        down = make("cluster-down")
    after = hoststate.fingerprint()
    assert any(node_cluster.nodemod.GUARD_COMMENT in ln for ln in up_rules)
    assert hoststate.difference(before, after) == []
    assert [ln for ln in iptables_lines() if "prefix-router" in ln] == []
    assert down.returncode == 0, f"make cluster-down failed:\n{down.stdout}\n{down.stderr}"
