"""Our own control-plane processes, run on this machine against a cluster: the operator
(`python -m prefix_operator`) and the external-metrics adapter (`prefix-metrics-adapter`).

Shared by the tests (tests/k8s/test_operator.py, test_metrics_adapter.py) and the autoscaling
benchmark (bench/autoscale.py), so that both launch them with the same flags. A plain module
like controlplane.py: put e2e/cluster on sys.path to import it.

    op = Operator(cp, "my-ns", log_dir); op.start()
    adapter = MetricsAdapter(cp, work_dir); adapter.start(); adapter.register()
"""

from __future__ import annotations

import base64
import signal
import ssl
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

from controlplane import free_port

REPO_ROOT = Path(__file__).resolve().parents[2]
APISERVICE = "v1beta1.external.metrics.k8s.io"
ADAPTER_SERVICE = "prefix-metrics-adapter"


def _tail(path: Path, lines: int) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "<no log>"


def stop_process(proc: subprocess.Popen[bytes] | None, grace: float) -> None:
    """SIGTERM, `grace` seconds to exit, then SIGKILL."""
    if proc is not None and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


class Operator:
    """`prefix-operator` as a process: start, kill (as a crash would), start again.

    Standalone (no peering, no leader election), watching one namespace, with second-scale
    timers so that tests and benchmarks do not wait for the production defaults (60 s resync,
    15 s figures). `cp` is anything with .env() and .wait_for() (ControlPlane,
    ExistingCluster)."""

    def __init__(self, cp: Any, namespace: str, log_dir: Path) -> None:
        self.cp = cp
        self.namespace = namespace
        self.log_dir = log_dir
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def log_path(self) -> Path:
        return self.log_dir / f"operator-{self.starts}.log"

    def start(self) -> None:
        self.starts += 1
        cmd = [sys.executable, "-m", "prefix_operator", "--standalone",
               "--namespace", self.namespace,
               "--liveness", f"http://127.0.0.1:{self.port}/healthz",
               "--resync-seconds", "3", "--figures-seconds", "1",
               "--cleanup-attempts", "2", "--cleanup-backoff-seconds", "1"]
        env = {**self.cp.env(), "PREFIX_OPERATOR_STORE_TIMEOUT_SECONDS": "0.5",
               "PREFIX_OPERATOR_RETRY_BACKOFF_SECONDS": "1"}
        self.log_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                         cwd=REPO_ROOT)
        self.cp.wait_for(self.alive, 30, "the operator's liveness endpoint")

    def alive(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"the operator exited ({self.proc.returncode}):\n{self.tail()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz",
                                        timeout=1) as r:
                return r.status == 200
        except OSError:
            return False

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()

    def tail(self, lines: int = 60) -> str:
        return _tail(self.log_path, lines)


class MetricsAdapter:
    """`prefix-metrics-adapter` as a process behind kube-apiserver's aggregation layer.

    Needs the local ControlPlane: kube-apiserver reaches the process through an ExternalName
    Service -> localhost (cp.expose_local_service) and trusts its serving certificate from
    the cluster CA (cp.issue_serving_cert); a cluster whose apiserver runs elsewhere (kind)
    cannot dial this machine's loopback."""

    def __init__(self, cp: Any, work: Path, *, stale_after: float = 60.0,
                 service: str = ADAPTER_SERVICE, namespace: str = "default") -> None:
        self.cp = cp
        self.stale_after = stale_after
        self.service, self.service_namespace = service, namespace
        self.port = free_port()
        self.dns_name = cp.expose_local_service(service, namespace, self.port)
        self.cert = cp.issue_serving_cert(service, [self.dns_name, "localhost", "127.0.0.1"])
        work.mkdir(parents=True, exist_ok=True)
        self.log_path = work / "adapter.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        exe = Path(sys.executable).parent / "prefix-metrics-adapter"
        if not exe.exists():
            raise FileNotFoundError(f"{exe} missing: pip install -e . installs the command")
        # No --requestheader-client-ca-file: the adapter reads the CA and the allowed names
        # from the ConfigMap kube-apiserver publishes, as it does in a cluster.
        cmd = [str(exe), "--secure-port", str(self.port), "--bind-address", "127.0.0.1",
               "--tls-cert-file", str(self.cert[0]), "--tls-private-key-file", str(self.cert[1]),
               "--kubeconfig", str(self.cp.kubeconfig),
               "--stale-after-seconds", str(self.stale_after), "-v"]
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                         cwd=REPO_ROOT)
        self.cp.wait_for(self.healthy, 30, "the adapter's /healthz")

    def healthy(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"the adapter exited ({self.proc.returncode}):\n{self.tail()}")
        # /healthz needs no client certificate; the serving one is checked against the CA.
        ctx = ssl.create_default_context(cafile=str(self.cp.ca_file))
        try:
            with urllib.request.urlopen(f"https://127.0.0.1:{self.port}/healthz",
                                        context=ctx, timeout=5) as r:
                return r.status == 200
        except OSError:  # not listening yet, or an HTTP error status
            return False

    def apiservice(self) -> dict[str, Any]:
        return {
            "apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
            "metadata": {"name": APISERVICE},
            "spec": {"group": "external.metrics.k8s.io", "version": "v1beta1",
                     "service": {"namespace": self.service_namespace, "name": self.service,
                                 "port": self.port},
                     "caBundle": base64.b64encode(self.cp.ca_file.read_bytes()).decode(),
                     "groupPriorityMinimum": 100, "versionPriority": 100},
        }

    def register(self, timeout: str = "30s") -> None:
        """Make this process the cluster's v1beta1.external.metrics.k8s.io and wait until the
        aggregator reports it Available."""
        self.cp.apply(self.apiservice())
        self.cp.kubectl("wait", "--for=condition=Available", f"--timeout={timeout}",
                        f"apiservice/{APISERVICE}")

    def unregister(self) -> None:
        self.cp.kubectl("delete", "apiservice", APISERVICE, "--ignore-not-found", check=False)
        self.cp.kubectl("delete", "service", self.service, "-n", self.service_namespace,
                        "--ignore-not-found", check=False)

    def stop(self) -> None:
        stop_process(self.proc, 10)

    def tail(self, lines: int = 60) -> str:
        return _tail(self.log_path, lines)
