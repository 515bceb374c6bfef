"""The real single-node cluster: a ControlPlane (controlplane.py) on the node's address plus a
Node (node.py), as one object and as one command.

    python e2e/cluster/cluster.py up [--work DIR]   bring it up in the background, print KUBECONFIG
    python e2e/cluster/cluster.py down              stop it and take the machine back
    python e2e/cluster/cluster.py status            say whether one is up, and where
    python e2e/cluster/cluster.py check             can this machine run a node (and why not)
    python e2e/cluster/cluster.py import-images     `make image`'s images into the running node

`make cluster` / `make cluster-down` run these. In Python (tests/node/conftest.py):

    with NodeCluster(work_dir) as cluster:
        cluster.cp.kubectl("get", "nodes")

One node cluster per machine (kube-proxy's chains, the bridge and the node address are
machine-wide): a lock (/run/lock/prefix-router-node.lock) makes a second one wait. The state
file (/run/prefix-router-node.json) holds what the teardown needs (the host's state before,
the PIDs started, the work directory), so `down` works from another process, and a cluster
whose owner was killed is cleaned up by the next `up` or `down`. A plain module, like
controlplane.py: put e2e/cluster on sys.path.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import hostrestore
import hoststate
import node as nodemod
from controlplane import (
    REPO_ROOT,
    BinariesUnavailable,
    ControlPlane,
    ControlPlaneError,
    ensure_binaries,
)

CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "prefix-router"
# Machine-wide, whoever's cache is in use (the node's address, bridge and chains are): a lock
# file where lock files go, and the running cluster's record in /run (gone after a reboot,
# as is everything it records).
LOCK_FILE = Path("/run/lock/prefix-router-node.lock")
STATE_FILE = Path("/run/prefix-router-node.json")
# 2: "before" is the whole hoststate.fingerprint()
STATE_FORMAT = 2
IMAGES_TSV = CACHE / "images" / "images.tsv"
# containerd's root across clusters: the images stay imported (only containers are removed)
CONTAINERD_ROOT = CACHE / "node" / "containerd"
DEFAULT_WORK = Path("/tmp/prefix-router-cluster")
NODE_BINARIES = ("kubelet", "kube-proxy", "coredns")
ENSURE_PACKAGES = REPO_ROOT / "hack" / "cluster" / "ensure-node-packages.sh"


class NodeUnavailable(ControlPlaneError):
    """This machine cannot run the node, or what it needs was not built; says which."""


def machine_problems() -> list[str]:
    """Why this machine cannot run a node at all (empty: it can). Each names its check."""
    problems = []
    if not sys.platform.startswith("linux"):
        problems.append(f"not Linux (sys.platform is {sys.platform})")
        return problems
    if os.geteuid() != 0:
        problems.append("not root (os.geteuid() != 0): containerd, runc, the CNI plugins and "
                        "kube-proxy need root")
    controllers = set()
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        controllers.update(c for c in line.split(":")[1].split(",") if c)
    v2 = Path("/sys/fs/cgroup/cgroup.controllers")
    if v2.exists():
        controllers.update(v2.read_text().split())
    lacking = {"cpu", "memory", "pids"} - controllers
    if lacking:
        problems.append(f"cgroup controllers missing: {', '.join(sorted(lacking))} "
                        "(/proc/self/cgroup, /sys/fs/cgroup/cgroup.controllers)")
    if "overlay" not in Path("/proc/filesystems").read_text():
        problems.append("no overlay filesystem in /proc/filesystems (containerd's snapshotter)")
    return problems


def ensure_packages() -> None:
    """Install the Debian packages the node runs on, or raise with the script's message."""
    proc = subprocess.run(["bash", str(ENSURE_PACKAGES)], capture_output=True, text=True,
                          check=False, timeout=900)
    if proc.returncode != 0:
        raise NodeUnavailable(proc.stderr.strip() or proc.stdout.strip())


def node_binaries() -> Path:
    try:
        bin_dir = ensure_binaries(build=False)
    except BinariesUnavailable as e:
        raise NodeUnavailable(f"{e}\n(run `make k8s-binaries`)") from e
    missing = [b for b in NODE_BINARIES if not (bin_dir / b).exists()]
    if missing:
        raise NodeUnavailable(f"{bin_dir} lacks {', '.join(missing)}: run `make k8s-binaries`")
    return bin_dir


def node_images(tsv: Path = IMAGES_TSV) -> dict[str, nodemod.Image]:
    if not tsv.exists():
        raise NodeUnavailable(f"no images ({tsv} is missing): run `make image`")
    images = nodemod.read_images(tsv)
    missing = [n for n in ("pause", "coredns", "product", "redis") if n not in images]
    if missing:
        raise NodeUnavailable(f"{tsv} lists no {', '.join(missing)} image: run `make image`")
    return images


# --------------------------------------------------------------------------- state


def owner_alive(state: dict[str, Any]) -> bool:
    pid = int(state.get("owner", 0))
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def read_state() -> dict[str, Any] | None:
    try:
        return json.loads(STATE_FILE.read_text())
    except (OSError, ValueError):
        return None


def restore_from(state: dict[str, Any]) -> list[str]:
    """Take the machine back from a state file's record (the owner is gone): the node's own
    rule first (a table it sits in can then go too), then everything else."""
    before = hoststate.HostState.from_dict(state["before"])
    owned = hostrestore.Owned(**state["owned"])
    guards = nodemod.host_network_down()
    notes = [f"removed {guards} guard rule(s)"] if guards else []
    notes += hostrestore.restore(before, owned)
    if not state.get("keep_work"):
        shutil.rmtree(owned.work_dir, ignore_errors=True)
    return notes


class _Lock:
    """The machine-wide lock: one node cluster at a time."""

    def __init__(self) -> None:
        self.fd: int | None = None

    def acquire(self, timeout: float) -> None:
        LOCK_FILE.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    os.close(fd)
                    state = read_state() or {}
                    raise NodeUnavailable(
                        f"another node cluster holds {LOCK_FILE} (owner PID "
                        f"{state.get('owner', '?')}, work dir "
                        f"{state.get('owned', {}).get('work_dir', '?')}); waited {timeout:.0f}s. "
                        "`make cluster-down` stops one started with `make cluster`.") from None
                time.sleep(1)
        self.fd = fd

    def release(self) -> None:
        if self.fd is not None:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None


# --------------------------------------------------------------------------- the cluster


class NodeCluster:
    """Control plane + node. Attributes after start(): cp (the ControlPlane: kubectl, apply,
    request, wait_for, kubeconfig...), node (the Node), timings, leftovers (after stop():
    what differs from the machine before start; empty when all was taken back)."""

    def __init__(self, work_dir: Path = DEFAULT_WORK, *, keep_work: bool = False,
                 lock_timeout: float = 1800.0, timeout: float = 180.0) -> None:
        self.work = Path(work_dir).resolve()
        self.keep_work = keep_work
        self.lock_timeout = lock_timeout
        self.timeout = timeout
        self.cp: ControlPlane | None = None
        self.node: nodemod.Node | None = None
        self.timings: dict[str, float] = {}
        self.leftovers: list[str] = []
        self._lock = _Lock()
        self._state: dict[str, Any] = {}
        self._fingerprint: dict[str, object] = {}

    def __enter__(self) -> NodeCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def kubeconfig(self) -> Path:
        return self.work / "admin.kubeconfig"

    def start(self) -> NodeCluster:
        problems = machine_problems()
        if problems:
            raise NodeUnavailable("; ".join(problems))
        t0 = time.monotonic()
        ensure_packages()
        bin_dir = node_binaries()
        images = node_images()
        self._lock.acquire(self.lock_timeout)
        try:
            stale = read_state()
            if stale is not None:
                # the lock is ours, so its owner is gone: take back what it left
                sys.stderr.write(f"[node] cleaning up after PID {stale.get('owner')}: "
                                 f"{restore_from(stale)}\n")
                STATE_FILE.unlink(missing_ok=True)
            left = nodemod.host_network_down()
            if left:
                sys.stderr.write(f"[node] removed {left} guard rule(s) an earlier version's "
                                 "teardown left behind\n")
            shutil.rmtree(self.work, ignore_errors=True)
            self.work.mkdir(parents=True)
            self._fingerprint = hoststate.fingerprint()
            self._state = {
                "format": STATE_FORMAT, "owner": os.getpid(), "ready": False,
                "keep_work": self.keep_work,
                "kubeconfig": str(self.kubeconfig), "before": self._fingerprint,
                "owned": {"work_dir": str(self.work),
                          "containerd_socket": str(self.work / "containerd" / "containerd.sock"),
                          "links": [nodemod.NODE_LINK, nodemod.BRIDGE], "pids": [],
                          "containerd_root": str(CONTAINERD_ROOT)},
            }
            self._save()
            nodemod.host_network_up()
            self.timings["host network"] = round(time.monotonic() - t0, 2)
            self.cp = ControlPlane(bin_dir, self.work, nodes=0, address=nodemod.NODE_IP,
                                   service_cidr=nodemod.SERVICE_CIDR,
                                   pod_cidr=nodemod.CLUSTER_CIDR, timeout=self.timeout)
            self.cp.start()
            self._state["owned"]["pids"] += self.cp.pids
            self._save()
            self.timings["control plane"] = round(time.monotonic() - t0, 2)
            self.node = nodemod.Node(self.cp, bin_dir, self.work, images,
                                     containerd_root=CONTAINERD_ROOT, timeout=self.timeout,
                                     on_spawn=self._add_pid)
            self.node.start()
            for k, v in self.node.timings.items():
                self.timings[k] = round(self.timings["control plane"] + v, 2)
            self._state["ready"] = True
            self._save()
        except BaseException:
            logs = self.node.logs() if self.node else ""
            self.stop()
            if logs:
                sys.stderr.write(f"[node] logs of the failed start:\n{logs}\n")
            raise
        return self

    def _add_pid(self, pid: int) -> None:
        self._state["owned"]["pids"].append(pid)
        self._save()

    def _save(self) -> None:
        tmp = STATE_FILE.with_suffix(".tmp")
        tmp.write_text(json.dumps(self._state))
        tmp.replace(STATE_FILE)

    def stop(self) -> None:
        """Stop everything, take the machine back, and compare it with before."""
        if not self._state:
            self._lock.release()
            return
        try:
            t0 = time.monotonic()
            if self.node is not None:
                self.node.stop()
            t1 = time.monotonic()
            if self.cp is not None:
                self.cp.stop()
            t2 = time.monotonic()
            notes = [f"node stopped ({t1 - t0:.1f}s)", f"control plane stopped ({t2 - t1:.1f}s)"]
            notes += restore_from({**self._state, "keep_work": True})
            self.leftovers = hoststate.difference(self._fingerprint, hoststate.fingerprint())
            self.leftovers += hostrestore.processes_left(
                hoststate.HostState.from_dict(self._state["before"]),
                hostrestore.Owned(**self._state["owned"]))
            if notes:
                sys.stderr.write(f"[node] teardown: {'; '.join(notes)}\n")
            if not self.keep_work:
                shutil.rmtree(self.work, ignore_errors=True)
            STATE_FILE.unlink(missing_ok=True)
        finally:
            self._state = {}
            self.node = self.cp = None
            self._lock.release()


# --------------------------------------------------------------------------- commands


def cmd_up(args: argparse.Namespace) -> int:
    state = read_state()
    if state is not None and owner_alive(state) and state.get("ready"):
        print(f"already up (PID {state['owner']})\nexport KUBECONFIG={state['kubeconfig']}")
        return 0
    problems = machine_problems()
    if problems:
        print("cluster: this machine cannot run the node: " + "; ".join(problems),
              file=sys.stderr)
        return 1
    work = Path(args.work).resolve()
    log_path = Path(f"{work}.log")
    t0 = time.monotonic()
    with open(log_path, "wb") as log:
        child = subprocess.Popen(
            [sys.executable, __file__, "serve", "--work", str(work)]
            + (["--keep-work"] if args.keep_work else []),
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, cwd=REPO_ROOT)
    deadline = time.monotonic() + args.timeout
    while time.monotonic() < deadline:
        if child.poll() is not None:
            print(f"cluster: failed to start (exit {child.returncode}); {log_path}:\n"
                  + log_path.read_text(errors="replace")[-4000:], file=sys.stderr)
            return 1
        state = read_state()
        if state and state.get("owner") == child.pid and state.get("ready"):
            print(f"cluster up in {time.monotonic() - t0:.0f}s (PID {child.pid}, log {log_path})")
            print(f"kubectl: {node_binaries() / 'kubectl'}  (v1.36.3, matches the cluster)")
            print(f"export KUBECONFIG={state['kubeconfig']}")
            return 0
        time.sleep(0.5)
    print(f"cluster: not ready after {args.timeout:.0f}s; stopping it (log {log_path})",
          file=sys.stderr)
    child.terminate()
    child.wait(300)
    return 1


def cmd_serve(args: argparse.Namespace) -> int:
    cluster = NodeCluster(Path(args.work), keep_work=args.keep_work)

    def _quit(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _quit)
    signal.signal(signal.SIGINT, _quit)
    try:
        cluster.start()
        print(f"up: {json.dumps(cluster.timings)}", flush=True)
        while True:
            signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        cluster.stop()
        print("down; machine as before" if not cluster.leftovers else
              "down; differs from before:\n  " + "\n  ".join(cluster.leftovers), flush=True)
    return 1 if cluster.leftovers else 0


def cmd_down(args: argparse.Namespace) -> int:
    state = read_state()
    if state is None:
        print("no node cluster is up")
        if os.geteuid() == 0:
            lock = _Lock()
            lock.acquire(60)
            try:
                if read_state() is None and (n := nodemod.host_network_down()):
                    print(f"removed {n} guard rule(s) an earlier version's teardown left")
            finally:
                lock.release()
        return 0
    owner = int(state.get("owner", 0))
    differs = False
    if owner_alive(state):
        os.kill(owner, signal.SIGTERM)
        deadline = time.monotonic() + args.timeout
        while time.monotonic() < deadline and owner_alive(state):
            time.sleep(0.5)
        if owner_alive(state):
            print(f"cluster: PID {owner} did not stop in {args.timeout:.0f}s", file=sys.stderr)
            return 1
        log = Path(f"{state['owned']['work_dir']}.log")
        if log.exists():
            # the owner's last words: its teardown's notes and how the machine compares
            lines = log.read_text(errors="replace").strip().splitlines()
            last = [i for i, ln in enumerate(lines) if ln.startswith(("[node] teardown", "down"))]
            print("\n".join(lines[last[0]:] if last else lines[-20:]))
            differs = any("differs from before" in ln for ln in lines)
    if STATE_FILE.exists():
        lock = _Lock()
        lock.acquire(60)
        try:
            stale = read_state()
            if stale is not None:
                print(f"cleaned up after PID {owner}: {restore_from(stale)}")
                STATE_FILE.unlink(missing_ok=True)
                # (a record written before whole fingerprints were kept cannot be compared)
                left = hoststate.difference(stale["before"], hoststate.fingerprint()) \
                    if stale.get("format") == STATE_FORMAT else []
                if left:
                    print("differs from before:\n  " + "\n  ".join(left))
                    differs = True
        finally:
            lock.release()
    with contextlib.suppress(OSError):
        Path(f"{state['owned']['work_dir']}.log").unlink()
    if differs:
        print("cluster: the teardown left this machine different from before (above)",
              file=sys.stderr)
    return 1 if differs else 0


def cmd_status(args: argparse.Namespace) -> int:
    state = read_state()
    if state is None:
        print("down")
        return 3
    alive = owner_alive(state)
    print(f"{'up' if alive and state.get('ready') else 'stale' if not alive else 'starting'} "
          f"(PID {state.get('owner')})\nexport KUBECONFIG={state.get('kubeconfig')}")
    return 0 if alive else 3


def cmd_check(args: argparse.Namespace) -> int:
    problems = machine_problems()
    for problem in problems:
        print(f"cluster: this machine cannot run the node: {problem}")
    return 1 if problems else 0


def cmd_import_images(args: argparse.Namespace) -> int:
    state = read_state()
    if state is None or not owner_alive(state) or not state.get("ready"):
        print("no node cluster is up: the images go in when one starts (make cluster)")
        return 0
    images = node_images()
    sock = Path(state["owned"]["containerd_socket"])
    n = nodemod.import_images(sock, images)
    print(f"imported {n} of {len(images)} images into the running node ({sock})")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="cluster.py", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="bring the cluster up in the background")
    up.add_argument("--work", default=str(DEFAULT_WORK))
    up.add_argument("--keep-work", action="store_true", help="keep the work dir at down")
    up.add_argument("--timeout", type=float, default=900)
    serve = sub.add_parser("serve", help="(internal) run the cluster in the foreground")
    serve.add_argument("--work", default=str(DEFAULT_WORK))
    serve.add_argument("--keep-work", action="store_true")
    down = sub.add_parser("down", help="stop it; take the machine back")
    down.add_argument("--timeout", type=float, default=300)
    sub.add_parser("status")
    sub.add_parser("check", help="can this machine run the node? (exit 1 and why if not)")
    sub.add_parser("import-images", help="import images.tsv into the running node, if any")
    args = p.parse_args(argv)
    commands = {"up": cmd_up, "serve": cmd_serve, "down": cmd_down, "status": cmd_status,
                "check": cmd_check, "import-images": cmd_import_images}
    return commands[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
