"""A real, local Kubernetes control plane for tests: etcd, kube-apiserver,
kube-controller-manager, kube-scheduler and kwok (fake nodes whose pods go Running and Ready).
With nodes=0 and an `address` of its own it is the control plane of the real node instead
(e2e/cluster/node.py): no kwok, kube-apiserver on that address, reachable from pods.

No mocks: the binaries are the official ones (see hack/cluster/ensure-binaries.sh, which
builds and caches them or finds them through KUBEBUILDER_ASSETS / PREFIXROUTER_K8S_BIN).

    from controlplane import ControlPlane, ensure_binaries
    with ControlPlane(ensure_binaries(), "/tmp/cp") as cp:
        cp.kubectl("get", "nodes")

Everything binds to 127.0.0.1 (kube-apiserver: `address`) on free ports; certificates are made
with the openssl CLI;
each component logs to <work_dir>/logs/<name>.log; stop() kills every process group.
This file is a plain module (no package): put e2e/cluster on sys.path to import it.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
ENSURE_SCRIPT = REPO_ROOT / "hack" / "cluster" / "ensure-binaries.sh"
KWOK_STAGES = REPO_ROOT / "hack" / "cluster" / "kwok-stages.yaml"
REQUIRED_BINARIES = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kwok",
)
FAKE_NODE_ANNOTATION = "kwok.x-k8s.io/node"


class ControlPlaneError(RuntimeError):
    """A component could not be started or did not become ready."""


class BinariesUnavailable(ControlPlaneError):
    """The binaries are neither given, nor cached (and building was not requested)."""


# --------------------------------------------------------------------------- binaries


def ensure_binaries(*, build: bool = True, timeout: float | None = None) -> Path:
    """Run hack/cluster/ensure-binaries.sh and return the directory holding the binaries.

    build=False passes --check: only look (env vars, cache), never start a Go build.
    Raises BinariesUnavailable with the script's own error message.
    """
    cmd = ["bash", str(ENSURE_SCRIPT)] + ([] if build else ["--check"])
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired as e:
        raise BinariesUnavailable(f"{' '.join(cmd)} timed out after {timeout}s") from e
    if proc.returncode != 0:
        err = proc.stderr.strip() or proc.stdout.strip()
        raise BinariesUnavailable(f"{' '.join(cmd)} failed (exit {proc.returncode}):\n{err}")
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    if not lines:
        raise BinariesUnavailable(f"{' '.join(cmd)} printed no directory")
    bin_dir = Path(lines[-1].strip())
    missing = [b for b in REQUIRED_BINARIES if not (bin_dir / b).exists()]
    if missing:
        raise BinariesUnavailable(f"{bin_dir} lacks {', '.join(missing)}")
    return bin_dir


# --------------------------------------------------------------------------- helpers


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tail(path: Path, lines: int = 40) -> str:
    try:
        data = path.read_text(errors="replace").splitlines()
    except OSError as e:
        return f"<cannot read {path}: {e}>"
    return "\n".join(data[-lines:])


def _set_pdeathsig() -> None:  # runs in the child between fork and exec
    os.setsid()
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except Exception:  # pragma: no cover - best effort only
            pass


class _Certs:
    """A CA, serving and client certificates made with the openssl CLI (ECDSA P-256: fast)."""

    def __init__(self, directory: Path, openssl: str = "openssl"):
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self.openssl = shutil.which(openssl) or openssl

    def _run(self, *args: str) -> None:
        proc = subprocess.run(
            [self.openssl, *args], cwd=self.dir, capture_output=True, text=True, check=False
        )
        if proc.returncode != 0:
            raise ControlPlaneError(f"openssl {' '.join(args)} failed:\n{proc.stderr}")

    def key(self, name: str) -> Path:
        path = self.dir / f"{name}.key"
        self._run("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256",
                  "-out", str(path))
        return path

    def ca(self, name: str, cn: str) -> tuple[Path, Path]:
        key = self.key(name)
        crt = self.dir / f"{name}.crt"
        self._run("req", "-x509", "-new", "-key", str(key), "-out", str(crt), "-days", "3650",
                  "-subj", f"/CN={cn}",
                  "-addext", "basicConstraints=critical,CA:TRUE",
                  "-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature")
        return crt, key

    def cert(self, name: str, ca: tuple[Path, Path], cn: str, *, orgs: Sequence[str] = (),
             server_sans: Sequence[str] = (), client: bool = True) -> tuple[Path, Path]:
        key = self.key(name)
        csr = self.dir / f"{name}.csr"
        crt = self.dir / f"{name}.crt"
        subj = "".join(f"/O={o}" for o in orgs) + f"/CN={cn}"
        self._run("req", "-new", "-key", str(key), "-out", str(csr), "-subj", subj)
        usages = (["serverAuth"] if server_sans else []) + (["clientAuth"] if client else [])
        ext = ["basicConstraints=critical,CA:FALSE",
               "keyUsage=critical,digitalSignature,keyEncipherment",
               f"extendedKeyUsage={','.join(usages)}"]
        if server_sans:
            ext.append("subjectAltName=" + ",".join(server_sans))
        extfile = self.dir / f"{name}.ext"
        extfile.write_text("\n".join(ext) + "\n")
        self._run("x509", "-req", "-in", str(csr), "-CA", str(ca[0]), "-CAkey", str(ca[1]),
                  "-set_serial", str(int.from_bytes(os.urandom(8), "big")), "-days", "3650",
                  "-extfile", str(extfile), "-out", str(crt))
        csr.unlink()
        extfile.unlink()
        return crt, key

    def sa_keypair(self) -> tuple[Path, Path]:
        key = self.key("service-account")
        pub = self.dir / "service-account.pub"
        self._run("pkey", "-in", str(key), "-pubout", "-out", str(pub))
        return key, pub


class _Proc:
    def __init__(self, name: str, popen: subprocess.Popen, log: Path):
        self.name, self.popen, self.log = name, popen, log

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stop(self, grace: float = 10.0) -> None:
        if self.popen.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGTERM)
        try:
            self.popen.wait(grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait(5)
        # children of the group that outlived the leader
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, signal.SIGKILL)


# --------------------------------------------------------------------------- control plane


class ControlPlane:
    """etcd + kube-apiserver + kube-controller-manager + kube-scheduler + kwok, on loopback.

    Attributes after start(): server (https URL), kubeconfig (Path of an admin kubeconfig,
    user in system:masters), bin_dir, work_dir, log_dir, ca_file, node_names,
    startup_seconds (wall clock of start()).
    """

    def __init__(
        self,
        bin_dir: str | os.PathLike[str],
        work_dir: str | os.PathLike[str],
        *,
        nodes: int = 2,
        node_prefix: str = "kwok-gpu",
        node_capacity: dict[str, str] | None = None,
        service_cidr: str = "198.19.0.0/16",
        pod_cidr: str = "198.18.0.0/16",
        hpa_sync_period: str = "5s",
        kwok_stages: str | os.PathLike[str] | None = None,
        timeout: float = 90.0,
        extra_apiserver_args: Iterable[str] = (),
        kubectl: str | None = None,
        address: str = "127.0.0.1",
    ):
        self.bin_dir = Path(bin_dir).resolve()
        self.work_dir = Path(work_dir).resolve()
        self.log_dir = self.work_dir / "logs"
        self.nodes = nodes
        self.node_prefix = node_prefix
        self.node_capacity = node_capacity or {
            "cpu": "64",
            "memory": "512Gi",
            "pods": "250",
            "ephemeral-storage": "1Ti",
            "nvidia.com/gpu": "8",
        }
        self.service_cidr = service_cidr
        self.pod_cidr = pod_cidr
        self.hpa_sync_period = hpa_sync_period
        self.kwok_stages = Path(kwok_stages) if kwok_stages else KWOK_STAGES
        self.timeout = timeout
        self.extra_apiserver_args = list(extra_apiserver_args)
        self.address = address
        self._kubectl = kubectl
        self._procs: list[_Proc] = []
        self.server = ""
        self.kubeconfig = self.work_dir / "admin.kubeconfig"
        self.ca_file = self.work_dir / "pki" / "ca.crt"
        self.node_names = [f"{node_prefix}-{i}" for i in range(nodes)]
        self.startup_seconds = 0.0
        self.timings: dict[str, float] = {}
        self._ssl: ssl.SSLContext | None = None

    # -- lifecycle -------------------------------------------------------------------------

    def __enter__(self) -> ControlPlane:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> ControlPlane:
        t0 = time.monotonic()
        needed = REQUIRED_BINARIES if self.nodes else REQUIRED_BINARIES[:-1]  # kwok last
        missing = [b for b in needed if not (self.bin_dir / b).exists()]
        if missing:
            raise BinariesUnavailable(f"{self.bin_dir} lacks {', '.join(missing)}")
        if self.nodes and not self.kwok_stages.exists():
            raise ControlPlaneError(f"kwok stage config not found: {self.kwok_stages}")
        self.log_dir.mkdir(parents=True, exist_ok=True)
        atexit.register(self.stop)
        try:
            self._make_pki()
            self._mark("pki", t0)
            self._start_etcd()
            self._mark("etcd", t0)
            self._start_apiserver()
            self._mark("kube-apiserver", t0)
            self._start_controller_manager()
            self._start_scheduler()
            if self.nodes:
                self._start_kwok()
            self._wait_components()
            self._mark("controllers", t0)
            if self.nodes:
                self._create_nodes()
                self._mark("nodes", t0)
            self._wait_default_service_account()
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - t0
        return self

    def _mark(self, what: str, t0: float) -> None:
        self.timings[what] = round(time.monotonic() - t0, 2)

    def stop(self) -> None:
        for proc in reversed(self._procs):
            proc.stop()
        self._procs.clear()
        with contextlib.suppress(Exception):
            atexit.unregister(self.stop)

    # -- public helpers --------------------------------------------------------------------

    @property
    def kubectl_path(self) -> str:
        if self._kubectl:
            return self._kubectl
        own = self.bin_dir / "kubectl"
        if own.exists():
            return str(own)
        found = shutil.which("kubectl")
        if not found:
            raise ControlPlaneError("no kubectl in the binaries directory nor on PATH")
        return found

    def env(self) -> dict[str, str]:
        """os.environ plus KUBECONFIG pointing at this cluster."""
        return {**os.environ, "KUBECONFIG": str(self.kubeconfig)}

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        """Run kubectl against this cluster; raises ControlPlaneError (with stderr) on failure."""
        cmd = [self.kubectl_path, "--kubeconfig", str(self.kubeconfig), *args]
        proc = subprocess.run(
            cmd, input=input, capture_output=True, text=True, timeout=timeout, check=False
        )
        if check and proc.returncode != 0:
            raise ControlPlaneError(
                f"kubectl {' '.join(args)} failed (exit {proc.returncode}):\n"
                f"{proc.stderr.strip()}\n{proc.stdout.strip()}"
            )
        return proc

    def kubectl_json(self, *args: str) -> Any:
        return json.loads(self.kubectl(*args, "-o", "json").stdout)

    def apply(self, manifest: str | dict[str, Any], *extra: str) -> str:
        """kubectl apply --server-side of a YAML/JSON string or an object."""
        text = manifest if isinstance(manifest, str) else json.dumps(manifest)
        return self.kubectl(
            "apply", "--server-side", "--field-manager=tests", *extra, "-f", "-", input=text
        ).stdout

    def request(
        self, method: str, path: str, body: Any = None, *,
        content_type: str = "application/json", timeout: float = 10.0,
    ) -> Any:
        """One authenticated (admin) HTTPS call to the apiserver; returns the decoded JSON."""
        data = None if body is None else (body if isinstance(body, bytes) else
                                          json.dumps(body).encode())
        req = urllib.request.Request(self.server + path, data=data, method=method)
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(req, context=self._admin_ssl(), timeout=timeout) as r:
                raw = r.read()
        except urllib.error.HTTPError as e:
            raise ControlPlaneError(
                f"{method} {path}: HTTP {e.code}: {e.read().decode(errors='replace')}"
            ) from e
        return json.loads(raw) if raw else None

    def wait_for(
        self, predicate: Callable[[], Any], timeout: float = 60.0, what: str = "condition",
        interval: float = 0.25,
    ) -> Any:
        """Poll predicate until it returns a truthy value; ControlPlaneError on timeout."""
        deadline = time.monotonic() + timeout
        last_exc: BaseException | None = None
        while True:
            try:
                value = predicate()
                if value:
                    return value
            except Exception as e:  # keep polling, report the last error
                last_exc = e
            if time.monotonic() > deadline:
                raise ControlPlaneError(
                    f"timed out after {timeout}s waiting for {what}"
                    + (f" (last error: {last_exc})" if last_exc else "")
                )
            self._check_alive()
            time.sleep(interval)

    # -- aggregated APIs and webhooks served by local processes ----------------------------

    def issue_serving_cert(self, name: str, hosts: Sequence[str]) -> tuple[Path, Path]:
        """A serving certificate (crt, key) signed by the cluster CA (self.ca_file) for the
        given IPs / DNS names: what a local aggregated API server or webhook presents."""
        import ipaddress

        sans = []
        for h in hosts:
            try:
                ipaddress.ip_address(h)
                sans.append(f"IP:{h}")
            except ValueError:
                sans.append(f"DNS:{h}")
        return self._pki.cert(name, self.ca, name, server_sans=sans, client=False)

    def issue_client_cert(self, name: str, cn: str, *, front_proxy: bool = False,
                          orgs: Sequence[str] = ()) -> tuple[Path, Path]:
        """A client certificate (crt, key) for CN `cn`, signed by the cluster CA or (with
        front_proxy) by the front-proxy CA: what a test needs to knock on an aggregated API
        server's door with the wrong name or the wrong CA."""
        ca = self.front_proxy_ca if front_proxy else self.ca
        return self._pki.cert(name, ca, cn, orgs=orgs)

    def expose_local_service(self, name: str, namespace: str, port: int,
                             host: str = "localhost") -> str:
        """Create a Service `name` of type ExternalName -> `host` (default localhost) with `port`.

        The apiserver runs with --enable-aggregator-routing=false, so for an APIService or an
        admission webhook that references this Service it dials <host>:<port>, i.e. a server
        on this machine (bind it to 127.0.0.1:<port>); the aggregator skips the endpoint check
        for ExternalName Services. TLS is verified against the name <name>.<namespace>.svc:
        issue the server's certificate with issue_serving_cert(name, [that name]) and put
        ca_file in the caBundle. Returns that DNS name.
        """
        svc = {"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": name, "namespace": namespace},
               "spec": {"type": "ExternalName", "externalName": host,
                        "ports": [{"name": "https", "port": port, "targetPort": port}]}}
        self.apply(svc)
        return f"{name}.{namespace}.svc"

    def log_path(self, component: str) -> Path:
        return self.log_dir / f"{component}.log"

    def write_kubeconfig(self, path: Path, cred: tuple[Path, Path], user: str) -> None:
        """A kubeconfig for this cluster with a client certificate (issue_client_cert)."""
        self._write_kubeconfig(path, cred, user)

    @property
    def pids(self) -> list[int]:
        return [p.popen.pid for p in self._procs]

    # -- internals -------------------------------------------------------------------------

    def _make_pki(self) -> None:
        pki = self._pki = _Certs(self.work_dir / "pki")
        self.ca = pki.ca("ca", "prefixrouter-test-ca")
        first_service_ip = _first_ip(self.service_cidr)
        own = [] if self.address == "127.0.0.1" else [f"IP:{self.address}"]
        sans = [*own, "IP:127.0.0.1", f"IP:{first_service_ip}", "DNS:localhost", "DNS:kubernetes",
                "DNS:kubernetes.default", "DNS:kubernetes.default.svc",
                "DNS:kubernetes.default.svc.cluster.local"]
        self.serving = pki.cert("apiserver", self.ca, "kube-apiserver", server_sans=sans,
                                client=False)
        self.admin = pki.cert("admin", self.ca, "admin", orgs=["system:masters"])
        self.kcm_client = pki.cert("controller-manager", self.ca,
                                   "system:kube-controller-manager")
        self.scheduler_client = pki.cert("scheduler", self.ca, "system:kube-scheduler")
        self.front_proxy_ca = pki.ca("front-proxy-ca", "front-proxy-ca")
        self.front_proxy_client = pki.cert("front-proxy-client", self.front_proxy_ca,
                                           "front-proxy-client")
        # What kube-apiserver shows a kubelet (logs, exec, port-forward): full rights there.
        self.kubelet_client = pki.cert("apiserver-kubelet-client", self.ca,
                                       "kube-apiserver-kubelet-client", orgs=["system:masters"])
        self.sa_key, self.sa_pub = pki.sa_keypair()
        self.front_proxy_ca_file = self.front_proxy_ca[0]

    def _spawn(self, name: str, args: list[str]) -> _Proc:
        log = self.log_path(name)
        fh = open(log, "ab")
        try:
            fh.write(f"# {' '.join(args)}\n".encode())
            fh.flush()
            popen = subprocess.Popen(
                args, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                cwd=self.work_dir, preexec_fn=_set_pdeathsig, close_fds=True,
            )
        finally:
            fh.close()
        proc = _Proc(name, popen, log)
        self._procs.append(proc)
        return proc

    def _check_alive(self) -> None:
        for p in self._procs:
            if not p.alive():
                raise ControlPlaneError(
                    f"{p.name} exited with code {p.popen.returncode}; last lines of {p.log}:\n"
                    f"{_tail(p.log)}"
                )

    def _wait_http(self, proc: _Proc, url: str, ctx: ssl.SSLContext | None,
                   expect: Callable[[bytes], bool] = lambda b: True) -> None:
        deadline = time.monotonic() + self.timeout
        last = ""
        while time.monotonic() < deadline:
            if not proc.alive():
                raise ControlPlaneError(
                    f"{proc.name} exited with code {proc.popen.returncode} before becoming "
                    f"ready; last lines of {proc.log}:\n{_tail(proc.log)}"
                )
            try:
                with urllib.request.urlopen(url, context=ctx, timeout=2) as r:
                    body = r.read()
                    if r.status == 200 and expect(body):
                        return
                    last = f"HTTP {r.status}: {body[:300]!r}"
            except urllib.error.HTTPError as e:
                last = f"HTTP {e.code}: {e.read()[:500].decode(errors='replace')}"
            except (OSError, ssl.SSLError) as e:
                last = str(e)
            time.sleep(0.2)
        raise ControlPlaneError(
            f"{proc.name} not ready at {url} after {self.timeout}s (last: {last}); "
            f"last lines of {proc.log}:\n{_tail(proc.log)}"
        )

    def _admin_ssl(self) -> ssl.SSLContext:
        if self._ssl is None:
            ctx = ssl.create_default_context(cafile=str(self.ca[0]))
            ctx.load_cert_chain(str(self.admin[0]), str(self.admin[1]))
            self._ssl = ctx
        return self._ssl

    @staticmethod
    def _insecure_ssl() -> ssl.SSLContext:  # self-signed serving certs of kcm/scheduler
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        return ctx

    def _start_etcd(self) -> None:
        client, peer = free_port(), free_port()
        self.etcd_url = f"http://127.0.0.1:{client}"
        proc = self._spawn("etcd", [
            str(self.bin_dir / "etcd"),
            "--name=default",
            f"--data-dir={self.work_dir / 'etcd'}",
            f"--listen-client-urls={self.etcd_url}",
            f"--advertise-client-urls={self.etcd_url}",
            f"--listen-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-cluster=default=http://127.0.0.1:{peer}",
            "--unsafe-no-fsync=true",
            "--log-level=warn",
        ])
        self._wait_http(proc, f"{self.etcd_url}/health", None,
                        lambda b: json.loads(b).get("health") == "true")

    def _start_apiserver(self) -> None:
        port = free_port()
        self.server = f"https://{self.address}:{port}"
        loopback = self.address == "127.0.0.1"
        proc = self._spawn("kube-apiserver", [
            str(self.bin_dir / "kube-apiserver"),
            f"--etcd-servers={self.etcd_url}",
            f"--bind-address={self.address}",
            f"--advertise-address={self.address}",
            # a loopback advertise address cannot go into the 'kubernetes' Endpoints (and
            # recent apiservers refuse to start with it unless the reconciler is off); a real
            # node's pods reach kube-apiserver through that Service, so there it stays on
            *(["--endpoint-reconciler-type=none"] if loopback else []),
            f"--kubelet-client-certificate={self.kubelet_client[0]}",
            f"--kubelet-client-key={self.kubelet_client[1]}",
            # the real node has one address, its InternalIP, and no resolvable hostname
            *([] if loopback else ["--kubelet-preferred-address-types=InternalIP"]),
            f"--secure-port={port}",
            f"--cert-dir={self.work_dir / 'apiserver-certs'}",
            f"--tls-cert-file={self.serving[0]}",
            f"--tls-private-key-file={self.serving[1]}",
            f"--client-ca-file={self.ca[0]}",
            f"--service-cluster-ip-range={self.service_cidr}",
            "--authorization-mode=Node,RBAC",
            "--enable-aggregator-routing=false",
            "--allow-privileged=true",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={self.sa_pub}",
            f"--service-account-signing-key-file={self.sa_key}",
            "--api-audiences=https://kubernetes.default.svc.cluster.local",
            # aggregated APIs (e.g. external.metrics.k8s.io): front-proxy client + request headers
            f"--requestheader-client-ca-file={self.front_proxy_ca[0]}",
            "--requestheader-allowed-names=front-proxy-client",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={self.front_proxy_client[0]}",
            f"--proxy-client-key-file={self.front_proxy_client[1]}",
            "--profiling=false",
            *self.extra_apiserver_args,
        ])
        self._wait_http(proc, f"{self.server}/readyz", self._admin_ssl())
        self._write_kubeconfig(self.kubeconfig, self.admin, "admin")
        self.kcm_kubeconfig = self.work_dir / "controller-manager.kubeconfig"
        self._write_kubeconfig(self.kcm_kubeconfig, self.kcm_client, "controller-manager")
        self.scheduler_kubeconfig = self.work_dir / "scheduler.kubeconfig"
        self._write_kubeconfig(self.scheduler_kubeconfig, self.scheduler_client, "scheduler")

    def _write_kubeconfig(self, path: Path, cred: tuple[Path, Path], user: str) -> None:
        def b64(p: Path) -> str:
            return base64.b64encode(p.read_bytes()).decode()

        cfg = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "local", "cluster": {
                "server": self.server, "certificate-authority-data": b64(self.ca[0])}}],
            "users": [{"name": user, "user": {
                "client-certificate-data": b64(cred[0]), "client-key-data": b64(cred[1])}}],
            "contexts": [{"name": "local", "context": {"cluster": "local", "user": user}}],
            "current-context": "local",
            "preferences": {},
        }
        path.write_text(json.dumps(cfg, indent=2) + "\n")
        path.chmod(0o600)

    def _start_controller_manager(self) -> None:
        port = free_port()
        self.kcm_healthz = f"https://127.0.0.1:{port}/healthz"
        kc = str(self.kcm_kubeconfig)
        self._kcm = self._spawn("kube-controller-manager", [
            str(self.bin_dir / "kube-controller-manager"),
            f"--kubeconfig={kc}",
            f"--authentication-kubeconfig={kc}",
            f"--authorization-kubeconfig={kc}",
            "--bind-address=127.0.0.1",
            f"--secure-port={port}",
            f"--cert-dir={self.work_dir / 'controller-manager-certs'}",
            "--controllers=*",
            "--use-service-account-credentials=true",
            f"--root-ca-file={self.ca[0]}",
            f"--service-account-private-key-file={self.sa_key}",
            f"--cluster-signing-cert-file={self.ca[0]}",
            f"--cluster-signing-key-file={self.ca[1]}",
            f"--service-cluster-ip-range={self.service_cidr}",
            f"--horizontal-pod-autoscaler-sync-period={self.hpa_sync_period}",
            "--leader-elect=false",
            "--profiling=false",
        ])

    def _start_scheduler(self) -> None:
        port = free_port()
        self.scheduler_readyz = f"https://127.0.0.1:{port}/readyz"
        kc = str(self.scheduler_kubeconfig)
        self._scheduler = self._spawn("kube-scheduler", [
            str(self.bin_dir / "kube-scheduler"),
            f"--kubeconfig={kc}",
            f"--authentication-kubeconfig={kc}",
            f"--authorization-kubeconfig={kc}",
            "--bind-address=127.0.0.1",
            f"--secure-port={port}",
            f"--cert-dir={self.work_dir / 'scheduler-certs'}",
            "--leader-elect=false",
            "--profiling=false",
        ])

    def _start_kwok(self) -> None:
        port = free_port()
        self.kwok_healthz = f"http://127.0.0.1:{port}/healthz"
        self._kwok = self._spawn("kwok", [
            str(self.bin_dir / "kwok"),
            f"--config={self.kwok_stages}",
            f"--kubeconfig={self.kubeconfig}",
            "--manage-all-nodes=false",
            f"--manage-nodes-with-annotation-selector={FAKE_NODE_ANNOTATION}=fake",
            "--node-lease-duration-seconds=40",
            f"--cidr={self.pod_cidr}",
            "--node-ip=127.0.0.1",
            f"--server-address=127.0.0.1:{port}",
        ])

    def _wait_components(self) -> None:
        insecure = self._insecure_ssl()
        self._wait_http(self._kcm, self.kcm_healthz, insecure)
        self._wait_http(self._scheduler, self.scheduler_readyz, insecure)
        if self.nodes:
            self._wait_http(self._kwok, self.kwok_healthz, None)

    def node_manifest(self, name: str) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "annotations": {FAKE_NODE_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
                "labels": {
                    "type": "kwok",
                    "kubernetes.io/hostname": name,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                    "nvidia.com/gpu.present": "true",
                },
            },
            "status": {
                "capacity": dict(self.node_capacity),
                "allocatable": dict(self.node_capacity),
            },
        }

    def _create_nodes(self) -> None:
        for name in self.node_names:
            self.request("POST", "/api/v1/nodes", self.node_manifest(name))

        def all_ready() -> bool:
            items = self.request("GET", "/api/v1/nodes?labelSelector=type%3Dkwok")["items"]
            ready = {
                n["metadata"]["name"]
                for n in items
                if any(c["type"] == "Ready" and c["status"] == "True"
                       for c in n.get("status", {}).get("conditions", []))
                and not any(t.get("key") == "node.kubernetes.io/not-ready"
                            for t in n.get("spec", {}).get("taints", []) or [])
            }
            return set(self.node_names) <= ready

        try:
            self.wait_for(all_ready, self.timeout, "the fake nodes to become Ready")
        except ControlPlaneError as e:
            raise ControlPlaneError(f"{e}; last lines of kwok log:\n"
                                    f"{_tail(self.log_path('kwok'))}") from e

    def _wait_default_service_account(self) -> None:
        # the default ServiceAccount must exist before pods can be admitted in 'default'
        self.wait_for(
            lambda: self.request("GET", "/api/v1/namespaces/default/serviceaccounts/default"),
            self.timeout, "the default ServiceAccount (controller-manager)",
        )


def _first_ip(cidr: str) -> str:
    import ipaddress

    return str(next(ipaddress.ip_network(cidr, strict=False).hosts()))


# --------------------------------------------------------------------------- existing clusters


class ExistingCluster:
    """The same surface as ControlPlane, for a cluster reached through a kubeconfig
    (kind, or anything else): used when PREFIXROUTER_USE_EXISTING_CLUSTER=1."""

    bin_dir: Path | None = None

    def __init__(self, kubeconfig: str | os.PathLike[str] | None = None,
                 kubectl: str | None = None):
        path = kubeconfig or os.environ.get("KUBECONFIG") or str(Path.home() / ".kube/config")
        self.kubeconfig = Path(path.split(os.pathsep)[0]).expanduser().resolve()
        self.kubectl_path = kubectl or shutil.which("kubectl") or "kubectl"
        self.work_dir = None
        self.startup_seconds = 0.0
        self.server = self.kubectl(
            "config", "view", "--minify", "-o", "jsonpath={.clusters[0].cluster.server}"
        ).stdout.strip()
        self.node_names = [
            n["metadata"]["name"] for n in self.kubectl_json("get", "nodes")["items"]
        ]

    def env(self) -> dict[str, str]:
        return {**os.environ, "KUBECONFIG": str(self.kubeconfig)}

    def stop(self) -> None:  # not ours to stop
        pass

    kubectl = ControlPlane.kubectl
    kubectl_json = ControlPlane.kubectl_json
    apply = ControlPlane.apply

    def wait_for(self, predicate: Callable[[], Any], timeout: float = 60.0,
                 what: str = "condition", interval: float = 0.25) -> Any:
        deadline = time.monotonic() + timeout
        last_exc: BaseException | None = None
        while time.monotonic() <= deadline:
            try:
                value = predicate()
                if value:
                    return value
            except Exception as e:
                last_exc = e
            time.sleep(interval)
        raise ControlPlaneError(f"timed out after {timeout}s waiting for {what}"
                                + (f" (last error: {last_exc})" if last_exc else ""))


def _print_fake_nodes(count: int) -> None:
    """A v1 List of fake GPU Nodes (for kind: kubectl apply -f - with kwok running)."""
    cp = ControlPlane(".", ".", nodes=count)
    items = [cp.node_manifest(n) for n in cp.node_names]
    print(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}, indent=2))


if __name__ == "__main__":
    # python e2e/cluster/controlplane.py [workdir]     start one, print KUBECONFIG, wait
    # python e2e/cluster/controlplane.py fake-nodes [N] print N fake GPU Node manifests
    if sys.argv[1:2] == ["fake-nodes"]:
        _print_fake_nodes(int(sys.argv[2]) if len(sys.argv) > 2 else 2)
        sys.exit(0)
    work = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/prefixrouter-controlplane")
    shutil.rmtree(work, ignore_errors=True)
    cp = ControlPlane(ensure_binaries(build=False), work).start()
    print(f"control plane up in {cp.startup_seconds:.1f}s {cp.timings}")
    print(f"export KUBECONFIG={cp.kubeconfig}")
    print("Ctrl-C (or SIGTERM) to stop", flush=True)

    def _quit(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, _quit)  # also when started with '&' (SIGINT ignored there)
    signal.signal(signal.SIGTERM, _quit)
    try:
        signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        cp.stop()
