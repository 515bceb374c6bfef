"""A real Kubernetes node on this machine: containerd + runc, the CNI bridge, kubelet, kube-proxy
and CoreDNS, joined to a ControlPlane (controlplane.py) started with address=NODE_IP, nodes=0.

Addresses stay on this machine, in ranges reserved for documentation and testing: the node is
192.0.2.10 on a port-less bridge `prnode0` (the kernel has no dummy driver; a bridge without
ports holds an address the same way), pods get 198.18.0.0/24 on the CNI bridge `prbr0`,
Services 198.19.0.0/16 (routed to `prbr0`, so no ClusterIP ever leaves by the default route),
and a FORWARD rule drops anything a pod sends off the bridge. CoreDNS serves cluster.local
only (no upstream).

What this machine needs, and why (probed; see docs/controlplane.md, "The real node"):
- cgroups v1/v2 hybrid, every controller on v1: kubelet `failCgroupV1: false`,
  `cgroupDriver: cgroupfs`; runc (crun refuses hybrid mode) with `SystemdCgroup = false`.
- root without CAP_SYS_RESOURCE: oom_score_adj cannot go down, so containerd runs with
  `restrict_oom_score_adj = true` and the kubelet and kube-proxy keep the host's score.
- no registry: images come from hack/image/build.sh (pause, CoreDNS, our product, Redis),
  imported with `ctr -n k8s.io images import`; the sandbox image is the local pause image.

Every path the components write is under the work directory, except what containerd, libcni
and the kubelet hard-code (hoststate.SHARED_DIRS); host_network_down and hostrestore.restore
take all of it back.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hoststate
from controlplane import ControlPlane, ControlPlaneError, _Proc, _set_pdeathsig, _tail, free_port

NODE_NAME = "prefix-router-node"
NODE_IP = "192.0.2.10"
NODE_LINK = "prnode0"
BRIDGE = "prbr0"
POD_SUBNET = "198.18.0.0/24"
POD_GATEWAY = "198.18.0.1"
CLUSTER_CIDR = "198.18.0.0/16"
SERVICE_CIDR = "198.19.0.0/16"
DNS_IP = "198.19.0.10"
CLUSTER_DOMAIN = "cluster.local"
CNI_BIN_DIR = "/usr/lib/cni"
RUNC = "/usr/sbin/runc"
# The packages the node runs on (Debian names); cluster.py installs the missing ones.
DEBS = ("containerd", "runc", "containernetworking-plugins", "iptables", "nftables",
        "conntrack", "iproute2", "mount")
GUARD_COMMENT = "prefix-router-node: pods reach nothing off the bridge"
# FORWARD: whatever a pod sends off the bridge is dropped (ipMasq is off too)
GUARD_RULE = ("FORWARD", "-i", BRIDGE, "!", "-o", BRIDGE, "-m", "comment",
              "--comment", GUARD_COMMENT, "-j", "DROP")


@dataclass(frozen=True)
class Image:
    name: str
    ref: str
    hash: str
    archive: str


def read_images(tsv: Path) -> dict[str, Image]:
    """hack/image/build.sh's list: name, ref, content hash, docker-archive path."""
    images = {}
    for line in tsv.read_text().splitlines():
        if line.strip():
            name, ref, h, archive = line.split("\t")
            images[name] = Image(name, ref, h, archive)
    return images


def sh(*cmd: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    if check and proc.returncode != 0:
        raise ControlPlaneError(f"{' '.join(cmd)} failed ({proc.returncode}): "
                                f"{proc.stderr.strip() or proc.stdout.strip()}")
    return proc


def import_images(socket: Path, images: dict[str, Image]) -> int:
    """Import into the containerd at `socket` (namespace k8s.io) every image whose content
    hash it does not have yet; returns how many were imported."""
    ctr = ("ctr", "--address", str(socket), "--namespace", "k8s.io")
    n = 0
    for image in images.values():
        have = sh(*ctr, "images", "ls", f"name=={image.ref}", check=False).stdout
        if f"io.prefixrouter.content-hash={image.hash}" in have:
            continue
        if not Path(image.archive).exists():
            raise ControlPlaneError(f"{image.archive} is gone: run `make image`")
        sh(*ctr, "images", "import", image.archive, timeout=600)
        sh(*ctr, "images", "label", image.ref, f"io.prefixrouter.content-hash={image.hash}")
        n += 1
    return n


# --------------------------------------------------------------------------- host network


def host_network_up() -> None:
    """The node's address and the pods' bridge, forwarding on, and the guard rule."""
    if not Path("/sys/class/net", NODE_LINK).exists():
        sh("ip", "link", "add", NODE_LINK, "type", "bridge")
    sh("ip", "addr", "replace", f"{NODE_IP}/24", "dev", NODE_LINK)
    sh("ip", "link", "set", NODE_LINK, "up")
    # The CNI plugin would make the bridge at the first pod; the Service route needs it now.
    if not Path("/sys/class/net", BRIDGE).exists():
        sh("ip", "link", "add", BRIDGE, "type", "bridge")
    sh("ip", "addr", "replace", f"{POD_GATEWAY}/24", "dev", BRIDGE)
    sh("ip", "link", "set", BRIDGE, "up")
    sh("ip", "route", "replace", SERVICE_CIDR, "dev", BRIDGE, "src", POD_GATEWAY)
    hoststate.write_sysctl("net.ipv4.ip_forward", "1")
    if sh("iptables", "-w", "-C", *GUARD_RULE, check=False).returncode != 0:
        sh("iptables", "-w", "-I", *GUARD_RULE)


def host_network_down() -> int:
    """Delete the guard rule (every copy: an earlier version's teardown missed it); returns
    how many went. The links, the route on them and the sysctl go with hostrestore.restore."""
    if shutil.which("iptables") is None:
        return 0
    n = 0
    while n < 100 and sh("iptables", "-w", "-C", *GUARD_RULE, check=False).returncode == 0:
        sh("iptables", "-w", "-D", *GUARD_RULE)
        n += 1
    return n


# --------------------------------------------------------------------------- configuration


def containerd_config(work: Path, root: Path, pause_ref: str) -> str:
    c = work / "containerd"
    return f"""version = 2
root = "{root}"
state = "{c / 'state'}"
plugin_dir = ""
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs",
  "io.containerd.tracing.processor.v1.otlp"]

[grpc]
  address = "{c / 'containerd.sock'}"
[ttrpc]
  address = "{c / 'containerd.sock.ttrpc'}"
[debug]
  address = ""
[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = "{c / 'opt'}"
[plugins."io.containerd.runtime.v1.linux"]
  runtime_root = "{c / 'runc-v1'}"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{pause_ref}"
  # root here cannot lower oom_score_adj: never ask runc to go below containerd's own
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  disable_apparmor = true
  enable_selinux = false
  # the pods' network namespaces under the work directory, not in /var/run/netns
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "{RUNC}"
        Root = "{c / 'runc'}"
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_BIN_DIR}"
    conf_dir = "{work / 'cni' / 'net.d'}"
    max_conf_num = 1
"""


def cni_config(work: Path) -> dict[str, Any]:
    return {
        "cniVersion": "1.0.0",
        "name": "prefix-router-node",
        "plugins": [{
            "type": "bridge",
            "bridge": BRIDGE,
            "isGateway": True,
            # no NAT to the outside: pods talk to the node, Services and each other only
            "ipMasq": False,
            # a pod reaching itself through its own Service
            "hairpinMode": True,
            "ipam": {
                "type": "host-local",
                "ranges": [[{"subnet": POD_SUBNET, "gateway": POD_GATEWAY}]],
                "routes": [{"dst": "0.0.0.0/0"}],
                "dataDir": str(work / "cni" / "ipam"),
            },
        }],
    }


def kubelet_config(work: Path, cp: ControlPlane, serving: tuple[Path, Path], port: int,
                   healthz_port: int) -> dict[str, Any]:
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": NODE_IP,
        "port": port,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": healthz_port,
        "tlsCertFile": str(serving[0]),
        "tlsPrivateKeyFile": str(serving[1]),
        "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                           "x509": {"clientCAFile": str(cp.ca_file)}},
        "authorization": {"mode": "Webhook"},
        "containerRuntimeEndpoint": f"unix://{work / 'containerd' / 'containerd.sock'}",
        # every controller is on cgroup v1 here (a v1/v2 hybrid)
        "cgroupDriver": "cgroupfs",
        "failCgroupV1": False,
        "failSwapOn": False,
        # root here lacks CAP_SYS_RESOURCE: keep the score it was started with
        "oomScoreAdj": int(Path("/proc/self/oom_score_adj").read_text()),
        "clusterDNS": [DNS_IP],
        "clusterDomain": CLUSTER_DOMAIN,
        # pods with dnsPolicy Default (CoreDNS) get no resolver of this machine's
        "resolvConf": str(work / "resolv.conf"),
        "podLogsDir": str(work / "pod-logs"),
        "volumePluginDir": str(work / "kubelet" / "volume-plugins"),
        "staticPodPath": "",
        "serializeImagePulls": True,
        # the images were imported, not pulled: nothing may garbage-collect them, and a
        # shared disk filling up must not evict the suite's pods
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%",
                         "imagefs.available": "1%", "nodefs.inodesFree": "1%"},
        "nodeStatusUpdateFrequency": "4s",
        "syncFrequency": "10s",
        "fileCheckFrequency": "20s",
        "maxPods": 110,
    }


def kube_proxy_config(kubeconfig: Path, healthz: int, metrics: int) -> dict[str, Any]:
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "mode": "iptables",
        "hostnameOverride": NODE_NAME,
        "bindAddress": NODE_IP,
        "clusterCIDR": CLUSTER_CIDR,
        "healthzBindAddress": f"127.0.0.1:{healthz}",
        "metricsBindAddress": f"127.0.0.1:{metrics}",
        # NodePorts on the node's address only (not on loopback: no route_localnet)
        "nodePortAddresses": [f"{NODE_IP}/32"],
        # leave the host's conntrack settings alone
        "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s",
                      "tcpCloseWaitTimeout": "0s"},
        "oomScoreAdj": int(Path("/proc/self/oom_score_adj").read_text()),
        "iptables": {"syncPeriod": "30s", "minSyncPeriod": "0s"},
    }


COREFILE = f""".:1053 {{
    errors
    health :8080
    ready :8181
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }}
    cache 30
}}
"""


def coredns_manifests(image: str) -> list[dict[str, Any]]:
    """CoreDNS as kube-dns in kube-system, non-root on 1053 behind the Service's port 53."""
    meta = {"namespace": "kube-system", "labels": {"k8s-app": "kube-dns"}}
    ports = [{"name": "dns", "port": 53, "targetPort": 1053, "protocol": "UDP"},
             {"name": "dns-tcp", "port": 53, "targetPort": 1053, "protocol": "TCP"}]
    container = {
        "name": "coredns",
        "image": image,
        "imagePullPolicy": "Never",
        "args": ["-conf", "/etc/coredns/Corefile"],
        "ports": [{"name": "dns", "containerPort": 1053, "protocol": "UDP"},
                  {"name": "dns-tcp", "containerPort": 1053, "protocol": "TCP"}],
        "readinessProbe": {"httpGet": {"path": "/ready", "port": 8181}, "periodSeconds": 2},
        "livenessProbe": {"httpGet": {"path": "/health", "port": 8080},
                          "periodSeconds": 10, "failureThreshold": 5},
        "resources": {"requests": {"cpu": "50m", "memory": "64Mi"},
                      "limits": {"memory": "128Mi"}},
        "securityContext": {"runAsNonRoot": True, "runAsUser": 65532,
                            "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                            "capabilities": {"drop": ["ALL"]},
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "volumeMounts": [{"name": "config", "mountPath": "/etc/coredns", "readOnly": True}],
    }
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": "coredns", **meta}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": "system:coredns"},
         "rules": [{"apiGroups": [""], "resources": ["services", "pods", "namespaces"],
                    "verbs": ["list", "watch"]},
                   {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
                    "verbs": ["list", "watch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": "system:coredns"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                     "name": "system:coredns"},
         "subjects": [{"kind": "ServiceAccount", "name": "coredns",
                       "namespace": "kube-system"}]},
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "coredns", **meta},
         "data": {"Corefile": COREFILE}},
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "coredns", **meta},
         "spec": {"replicas": 1, "selector": {"matchLabels": {"k8s-app": "kube-dns"}},
                  "template": {"metadata": {"labels": {"k8s-app": "kube-dns"}}, "spec": {
                      "serviceAccountName": "coredns",
                      "priorityClassName": "system-cluster-critical",
                      "dnsPolicy": "Default",
                      "containers": [container],
                      "volumes": [{"name": "config", "configMap": {"name": "coredns"}}]}}}},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "kube-dns", **meta},
         "spec": {"clusterIP": DNS_IP, "selector": {"k8s-app": "kube-dns"}, "ports": ports}},
    ]


# --------------------------------------------------------------------------- the node


class Node:
    """containerd, kubelet, kube-proxy and CoreDNS for a started ControlPlane.

    `on_spawn(pid)` is told every process started, so that a teardown from another process
    (cluster.py) can stop them by PID. Attributes after start(): timings (seconds since
    start() at each step), socket (containerd's), images (name -> Image)."""

    def __init__(self, cp: ControlPlane, bin_dir: Path, work_dir: Path,
                 images: dict[str, Image], *, containerd_root: Path | None = None,
                 timeout: float = 180.0,
                 on_spawn: Callable[[int], None] = lambda pid: None) -> None:
        self.cp = cp
        self.bin_dir = bin_dir
        self.work = work_dir
        # containerd's root (content store, unpacked images): kept across clusters when given,
        # so that images are imported once; the containers themselves never outlive a stop
        self.containerd_root = containerd_root or work_dir / "containerd" / "root"
        self.images = images
        self.timeout = timeout
        self.on_spawn = on_spawn
        self.socket = work_dir / "containerd" / "containerd.sock"
        self.log_dir = work_dir / "logs"
        self.timings: dict[str, float] = {}
        self._procs: list[_Proc] = []

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> Node:
        t0 = time.monotonic()
        missing = [n for n in ("pause", "coredns") if n not in self.images]
        if missing:
            raise ControlPlaneError(f"no {', '.join(missing)} image: run `make image`")
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._start_containerd()
        self._mark("containerd", t0)
        self.import_images()
        self._mark("images imported", t0)
        self._start_kubelet()
        self._mark("node Ready", t0)
        self._start_kube_proxy()
        self._mark("kube-proxy", t0)
        self._start_coredns()
        self._mark("CoreDNS Ready", t0)
        return self

    def stop(self) -> None:
        """Stop the kubelet and kube-proxy, then every container, then containerd."""
        for name in ("kubelet", "kube-proxy"):
            for p in self._procs:
                if p.name == name:
                    p.stop(grace=10)
        if any(p.name == "containerd" and p.alive() for p in self._procs):
            with contextlib.suppress(Exception):
                self.remove_containers()
        for p in reversed(self._procs):
            p.stop(grace=10)
        self._procs.clear()
        # the CRI plugin's per-pod directories (hostname, resolv.conf) of the pods just removed
        shutil.rmtree(self.containerd_root / "io.containerd.grpc.v1.cri", ignore_errors=True)

    def _mark(self, what: str, t0: float) -> None:
        self.timings[what] = round(time.monotonic() - t0, 2)

    # -- processes ---------------------------------------------------------------------

    def _spawn(self, name: str, args: list[str]) -> _Proc:
        log = self.log_dir / f"{name}.log"
        with open(log, "ab") as fh:
            fh.write(f"# {' '.join(args)}\n".encode())
            fh.flush()
            popen = subprocess.Popen(args, stdout=fh, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, cwd=self.work,
                                     preexec_fn=_set_pdeathsig, close_fds=True)
        proc = _Proc(name, popen, log)
        self._procs.append(proc)
        self.on_spawn(popen.pid)
        return proc

    def _check_alive(self) -> None:
        for p in self._procs:
            if not p.alive():
                raise ControlPlaneError(f"{p.name} exited with code {p.popen.returncode}; "
                                        f"last lines of {p.log}:\n{_tail(p.log)}")

    def wait_for(self, predicate: Callable[[], Any], what: str,
                 timeout: float | None = None) -> Any:
        deadline = time.monotonic() + (timeout or self.timeout)
        last: BaseException | None = None
        while True:
            self._check_alive()
            try:
                value = predicate()
                if value:
                    return value
            except Exception as e:  # keep polling, report the last error
                last = e
            if time.monotonic() > deadline:
                raise ControlPlaneError(f"timed out waiting for {what}"
                                        + (f" (last error: {last})" if last else ""))
            time.sleep(0.25)

    def ctr(self, *args: str, check: bool = True,
            timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return sh("ctr", "--address", str(self.socket), "--namespace", "k8s.io", *args,
                  check=check, timeout=timeout)

    # -- containerd --------------------------------------------------------------------

    def _start_containerd(self) -> None:
        c = self.work / "containerd"
        c.mkdir(parents=True, exist_ok=True)
        (self.work / "cni" / "net.d").mkdir(parents=True, exist_ok=True)
        (self.work / "cni" / "net.d" / "10-prefix-router.conflist").write_text(
            json.dumps(cni_config(self.work), indent=2))
        config = c / "config.toml"
        config.write_text(containerd_config(self.work, self.containerd_root,
                                            self.images["pause"].ref))
        proc = self._spawn("containerd", ["containerd", "--config", str(config)])
        self._wait_containerd()
        if self.ctr("containers", "ls", "-q", check=False).stdout.strip():
            # containers of a cluster that did not stop cleanly: start from an empty root
            # (the images are imported again)
            proc.stop(grace=10)
            self._procs.remove(proc)
            shutil.rmtree(self.containerd_root, ignore_errors=True)
            self._spawn("containerd", ["containerd", "--config", str(config)])
            self._wait_containerd()

    def _wait_containerd(self) -> None:
        self.wait_for(lambda: self.socket.is_socket() and
                      self.ctr("version", check=False).returncode == 0, "containerd's socket")

    def import_images(self) -> None:
        import_images(self.socket, self.images)

    def remove_containers(self) -> None:
        """Kill and delete every task and container (their snapshots and mounts go too)."""

        def tasks() -> dict[str, str]:
            rows = self.ctr("tasks", "ls", check=False).stdout.splitlines()[1:]
            return {r.split()[0]: r.split()[-1] for r in rows if r.strip()}

        for task in tasks():
            self.ctr("tasks", "kill", "--all", "--signal", "SIGKILL", task, check=False)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            live = tasks()
            if all(status == "STOPPED" for status in live.values()):
                break
            time.sleep(0.2)
        for task in tasks():
            self.ctr("tasks", "delete", task, check=False)
        containers = [ln.strip() for ln in self.ctr("containers", "ls", "-q", check=False)
                      .stdout.splitlines() if ln.strip()]
        if containers:
            self.ctr("containers", "delete", *containers, check=False)

    # -- kubelet -----------------------------------------------------------------------

    def _start_kubelet(self) -> None:
        cp = self.cp
        (self.work / "resolv.conf").write_text("")
        for d in ("kubelet", "pod-logs"):
            (self.work / d).mkdir(parents=True, exist_ok=True)
        creds = cp.issue_client_cert("kubelet", f"system:node:{NODE_NAME}",
                                     orgs=["system:nodes"])
        kubeconfig = self.work / "kubelet.kubeconfig"
        cp.write_kubeconfig(kubeconfig, creds, f"system:node:{NODE_NAME}")
        serving = cp.issue_serving_cert("kubelet-serving", [NODE_IP, NODE_NAME])
        self.kubelet_port, self.kubelet_healthz = free_port(), free_port()
        config = self.work / "kubelet.yaml"
        config.write_text(json.dumps(kubelet_config(self.work, cp, serving, self.kubelet_port,
                                                    self.kubelet_healthz), indent=2))
        self._spawn("kubelet", [
            str(self.bin_dir / "kubelet"),
            f"--config={config}",
            f"--kubeconfig={kubeconfig}",
            f"--root-dir={self.work / 'kubelet'}",
            f"--cert-dir={self.work / 'kubelet' / 'pki'}",
            f"--hostname-override={NODE_NAME}",
            f"--node-ip={NODE_IP}",
        ])
        self.wait_for(self.node_ready, f"node {NODE_NAME} Ready")

    def node_ready(self) -> bool:
        node = self.cp.request("GET", f"/api/v1/nodes/{NODE_NAME}")
        return any(c["type"] == "Ready" and c["status"] == "True"
                   for c in node.get("status", {}).get("conditions", []))

    # -- kube-proxy and CoreDNS --------------------------------------------------------

    def _start_kube_proxy(self) -> None:
        cp = self.cp
        creds = cp.issue_client_cert("kube-proxy", "system:kube-proxy")
        kubeconfig = self.work / "kube-proxy.kubeconfig"
        cp.write_kubeconfig(kubeconfig, creds, "system:kube-proxy")
        self.proxy_healthz = free_port()
        config = self.work / "kube-proxy.yaml"
        config.write_text(json.dumps(kube_proxy_config(kubeconfig, self.proxy_healthz,
                                                       free_port()), indent=2))
        self._spawn("kube-proxy", [str(self.bin_dir / "kube-proxy"), f"--config={config}"])

        def synced() -> bool:
            import urllib.request

            with urllib.request.urlopen(f"http://127.0.0.1:{self.proxy_healthz}/healthz",
                                        timeout=2) as r:
                return r.status == 200

        self.wait_for(synced, "kube-proxy's first sync (/healthz)")

    def _start_coredns(self) -> None:
        for obj in coredns_manifests(self.images["coredns"].ref):
            self.cp.apply(obj)

        def available() -> bool:
            d = self.cp.kubectl_json("get", "deployment", "coredns", "-n", "kube-system")
            return d.get("status", {}).get("availableReplicas", 0) >= 1

        self.wait_for(available, "CoreDNS Available")

    # -- diagnostics -------------------------------------------------------------------

    def logs(self, lines: int = 40) -> str:
        return "\n".join(f"--- {p.name}\n{_tail(p.log, lines)}" for p in self._procs)

    @property
    def pids(self) -> list[int]:
        return [p.popen.pid for p in self._procs]

