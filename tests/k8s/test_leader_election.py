"""Leader election against a real control plane: several `prefix-operator --leader-election`
processes compete for one coordination.k8s.io Lease; only the holder runs kopf.

Covers: one leader reconciles while the standby only answers its health probe; SIGKILL of the
leader -> the standby takes over no sooner than the lease expiry, and reconciles a model applied
after the kill; a leader that can no longer renew (the Lease taken by someone else) exits with
status 1 without writing the Lease again; SIGTERM hands the Lease over at once.

Timings are shortened (lease 6 s, renew deadline 4 s, retry 1 s) so the test takes seconds.
"When" is read from the Lease itself (its renewTime and acquireTime, written by the candidates
with microseconds), not from this test's clock, so a busy machine delays the test without
changing what it finds; every wait is a condition with a scaled timeout (tests/waiting.py).
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from waiting import scaled

pytestmark = pytest.mark.k8s

ROOT = Path(__file__).resolve().parents[2]
LEASE_DURATION, RENEW_DEADLINE, RETRY_PERIOD = 6, 4.0, 1.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Candidate:
    """One `prefix-operator --leader-election` process with its own identity."""

    def __init__(self, cp: Any, namespace: str, lease: str, identity: str, log_dir: Path) -> None:
        self.cp, self.namespace, self.lease, self.identity = cp, namespace, lease, identity
        self.port = free_port()
        self.log_path = log_dir / f"{identity}.log"
        cmd = [
            sys.executable, "-m", "prefix_operator", "--leader-election",
            f"--lease-name={lease}", f"--lease-namespace={namespace}",
            f"--lease-identity={identity}", f"--lease-duration={LEASE_DURATION}",
            f"--renew-deadline={RENEW_DEADLINE}", f"--retry-period={RETRY_PERIOD}",
            "--namespace", namespace, "--liveness", f"http://127.0.0.1:{self.port}/healthz",
            "--resync-seconds", "3", "--figures-seconds", "1", "--cleanup-attempts", "1",
            "--cleanup-backoff-seconds", "1", "--verbose",
        ]  # fmt: skip
        env = {**cp.env(), "PREFIX_OPERATOR_STORE_TIMEOUT_SECONDS": "0.5"}
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT
            )

    def health(self) -> Any:
        """The JSON at the liveness URL (standby: our status; leader: kopf's probe results)."""
        if self.proc.poll() is not None:
            raise AssertionError(f"{self.identity} exited ({self.proc.returncode}):\n{self.tail()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=1) as r:
                return json.loads(r.read()) if r.status == 200 else None
        except OSError:
            return None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log().splitlines()[-lines:])

    def signal(self, sig: signal.Signals) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)

    def wait(self, timeout: float) -> int:
        """The exit status; `timeout` is scaled."""
        return self.proc.wait(scaled(timeout))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)




@pytest.fixture
def ns(cp: Any) -> Iterator[str]:
    name = f"le-{uuid.uuid4().hex[:6]}"
    cp.kubectl("create", "namespace", name)
    yield name
    cp.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture
def candidates(cp: Any, ns: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Any]:
    started: list[Candidate] = []
    failed_before = request.session.testsfailed

    def start(identity: str, lease: str = "prefix-operator-leader") -> Candidate:
        c = Candidate(cp, ns, lease, identity, tmp_path)
        started.append(c)
        return c

    yield start
    for c in started:
        c.stop()
    if request.session.testsfailed > failed_before:
        for c in started:
            sys.stderr.write(f"\n--- {c.identity} ({c.log_path}) ---\n{c.tail()}\n")


def lease(cp: Any, ns: str, name: str = "prefix-operator-leader") -> dict[str, Any]:
    proc = cp.kubectl("get", "lease", name, "-n", ns, "-o", "json", check=False)
    return json.loads(proc.stdout).get("spec", {}) if proc.returncode == 0 else {}


def holder(cp: Any, ns: str, name: str = "prefix-operator-leader") -> str | None:
    return lease(cp, ns, name).get("holderIdentity")


def stamp(value: str) -> float:
    """A Lease time (MicroTime, UTC) as unix seconds."""
    return datetime.strptime(value.replace("Z", "+0000"), "%Y-%m-%dT%H:%M:%S.%f%z").timestamp()


def create_model(cp: Any, ns: str, name: str) -> None:
    body = {
        "apiVersion": "prefixrouter.io/v1alpha1", "kind": "PrefixRoutedModel",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"model": {"name": "llama", "source": "meta-llama/Llama-3.1-8B-Instruct"}},
    }  # fmt: skip
    cp.kubectl("create", "-f", "-", input=json.dumps(body))


def wait_ready(cp: Any, ns: str, name: str, timeout: float = 90) -> dict[str, Any]:
    def ready() -> dict[str, Any] | None:
        obj = cp.kubectl_json("get", "prm", name, "-n", ns)
        for c in (obj.get("status") or {}).get("conditions") or []:
            if c["type"] == "Ready" and c["status"] == "True":
                return obj
        return None

    return cp.wait_for(ready, timeout, f"{ns}/{name} Ready", interval=0.3)


def handled(c: Candidate) -> bool:
    """Whether kopf in this process ran any handler (kopf logs each one with --verbose)."""
    return "Handler '" in c.log()


def test_one_leader_reconciles_and_the_standby_takes_over_after_sigkill(
    cp: Any, ns: str, candidates: Any
) -> None:
    a = candidates("op-a")
    cp.wait_for(lambda: holder(cp, ns) == "op-a", 60, "op-a holding the Lease")
    b = candidates("op-b")
    # The standby is alive for its probes, knows who leads, and does not run kopf. Its
    # endpoint is up before its first read of the Lease (holder None until then): wait for it.
    status = cp.wait_for(lambda: (s := b.health()) and s["holder"] and s, 60,
                         "op-b's standby health endpoint naming the holder")
    assert status == {"leader": False, "identity": "op-b",
                      "lease": f"{ns}/prefix-operator-leader", "holder": "op-a"}  # fmt: skip
    spec = lease(cp, ns)
    assert spec["leaseDurationSeconds"] == LEASE_DURATION
    assert spec["renewTime"].endswith("Z") and spec["acquireTime"].endswith("Z")

    create_model(cp, ns, "before")
    wait_ready(cp, ns, "before")
    assert handled(a)
    # The Lease is renewed, not re-acquired: two renewals land with the same acquireTime, and
    # the standby stayed out all along (no kopf in op-b).
    renewals = {lease(cp, ns)["renewTime"]}

    def renewed_twice() -> bool:
        now = lease(cp, ns)
        assert now["holderIdentity"] == "op-a" and now["acquireTime"] == spec["acquireTime"], now
        renewals.add(now["renewTime"])
        return len(renewals) >= 3

    cp.wait_for(renewed_twice, 30, "two more renewals by op-a", interval=0.2)
    assert not handled(b), "the standby reconciled"
    assert "starting the operator" not in b.log() and "waiting for lease" in b.log()
    assert b.health()["leader"] is False

    # ------------------------------------------------------------ the leader dies
    a.signal(signal.SIGKILL)
    killed = time.monotonic()
    assert a.wait(10) == -signal.SIGKILL
    last_renewal = stamp(lease(cp, ns)["renewTime"])  # op-a's, the dead leader's last word
    # A model applied with no leader waits for the next one.
    create_model(cp, ns, "after")
    taken = cp.wait_for(lambda: (now := lease(cp, ns)).get("holderIdentity") == "op-b" and now,
                        LEASE_DURATION + 15, "op-b taking over", interval=0.1)
    took = stamp(taken["acquireTime"]) - last_renewal
    sys.stderr.write(f"\n[leader election] takeover {took:.1f} s after op-a's last renewal "
                     f"({time.monotonic() - killed:.1f} s after SIGKILL by this test's clock)\n")
    # Not before the Lease expired: op-b must have seen op-a's last renewal unchanged for a
    # whole lease duration (from when it saw it, which is after it was written; the library
    # counts in whole milliseconds).
    assert took >= LEASE_DURATION - 0.01, f"op-b took over {took:.3f} s after op-a's renewal"
    # op-a is dead and op-b the only process left: whatever made this Ready is op-b.
    obj = wait_ready(cp, ns, "after")
    assert obj["status"]["observedGeneration"] == 1
    assert handled(b)
    cp.kubectl("get", "deployment", "after-router", "-n", ns)
    # op-b now answers with kopf's liveness endpoint, not the standby's status.
    cp.wait_for(lambda: "leader" not in (b.health() or {"leader": None}), 30,
                "kopf's liveness endpoint in op-b")  # fmt: skip


def test_a_leader_that_cannot_renew_exits_and_sigterm_hands_over_at_once(
    cp: Any, ns: str, candidates: Any
) -> None:
    c = candidates("op-c")
    cp.wait_for(lambda: holder(cp, ns) == "op-c", 60, "op-c holding the Lease")
    cp.wait_for(lambda: "starting the operator" in c.log(), 30,
                "op-c starting kopf")  # fmt: skip
    # Someone else takes the Lease (what a standby that saw op-c's renewals stop would do):
    # op-c must notice that it no longer holds it and stop (its watchdog's timing, the renew
    # deadline, is tests/operator/test_leader.py's, on a clock the test drives).
    cp.kubectl("patch", "lease", "prefix-operator-leader", "-n", ns, "--type=merge",
               "-p", json.dumps({"spec": {"holderIdentity": "intruder"}}))  # fmt: skip
    assert c.wait(RENEW_DEADLINE + 2 * RETRY_PERIOD + 10) == 1
    assert "exiting so that Kubernetes restarts this process" in c.log()
    assert holder(cp, ns) == "intruder", "the old leader wrote the Lease after losing it"

    # The intruder never renews: op-d gets the Lease once it expires, op-e waits behind it.
    d = candidates("op-d")
    cp.wait_for(lambda: holder(cp, ns) == "op-d", LEASE_DURATION + 30, "op-d holding the Lease")
    e = candidates("op-e")
    cp.wait_for(lambda: (e.health() or {}).get("holder") == "op-d", 60, "op-e as standby")
    cp.wait_for(lambda: "starting the operator" in d.log(), 30,
                "op-d starting kopf")  # fmt: skip
    # A graceful stop releases the Lease: op-e takes it before op-d's last renewal could have
    # expired, which only a release allows.
    before_stop = stamp(lease(cp, ns)["renewTime"])  # op-d's last renewal is this one or later
    d.signal(signal.SIGTERM)
    assert d.wait(30) == 0
    assert "released lease" in d.log()
    taken = cp.wait_for(lambda: (now := lease(cp, ns)).get("holderIdentity") == "op-e" and now,
                        LEASE_DURATION + 10, "op-e taking over", interval=0.1)
    took = stamp(taken["acquireTime"]) - before_stop
    sys.stderr.write(f"\n[leader election] handover {took:.1f} s after op-d's renewal "
                     "before SIGTERM\n")
    assert took < LEASE_DURATION, f"op-e took over {took:.2f} s after op-d's renewal"
    # And a standby's SIGTERM just ends it: nothing to release.
    f = candidates("op-f")
    cp.wait_for(lambda: (f.health() or {}).get("holder") == "op-e", 60, "op-f as standby")
    f.signal(signal.SIGTERM)
    assert f.wait(15) == 0
    assert holder(cp, ns) == "op-e"
