"""What a real node changes on this machine, and how to take it back.

A kubelet, containerd, runc, the CNI bridge plugin and kube-proxy change the host: sysctls,
iptables chains, cgroups, mounts (container root filesystems, network namespaces, volumes),
network links, a few directories, and processes that outlive their parents (containerd's shims,
the pods' processes). `capture()` records the state of each before the node starts;
`restore(before, owned)` takes back what appeared since, touching only what is ours: names the
node uses, paths under its work directory, chains and cgroups that did not exist before.
`fingerprint()` is what must read the same before the node came up and after it went down.

The state is plain JSON (`HostState.to_json`), so a teardown can run in another process than
the one that brought the node up (`make cluster-down`), or after that process was killed.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

# kubelet's kernel tunables (it sets them unless protectKernelDefaults), the forwarding the
# pods need, and what kube-proxy and the bridge plugin may touch.
SYSCTLS = (
    "kernel.panic",
    "kernel.panic_on_oops",
    "vm.overcommit_memory",
    "vm.panic_on_oom",
    "kernel.keys.root_maxkeys",
    "kernel.keys.root_maxbytes",
    "net.ipv4.ip_forward",
    "net.ipv4.conf.all.forwarding",
    "net.ipv4.conf.default.forwarding",
    "net.ipv4.conf.all.route_localnet",
    "net.ipv6.conf.all.forwarding",
    "net.bridge.bridge-nf-call-iptables",
    "net.bridge.bridge-nf-call-ip6tables",
    "net.netfilter.nf_conntrack_max",
    "net.netfilter.nf_conntrack_tcp_timeout_established",
    "net.netfilter.nf_conntrack_tcp_timeout_close_wait",
)
# Chains that kube-proxy, the kubelet and the CNI plugins create, and our own.
CHAIN_PREFIXES = ("KUBE-", "CNI-", "PRNODE-")
TABLES = ("filter", "nat", "mangle", "raw")
IPTABLES = ("iptables", "ip6tables")
# Top-level cgroups the kubelet creates (cgroupfs driver) in every hierarchy.
CGROUP_NAMES = ("kubepods", "kubepods.slice")
# Directories outside the work directory that containerd, the CRI plugin, libcni and the
# kubelet write to whatever their settings (see node.py): removed if they were not there.
SHARED_DIRS = ("/run/containerd", "/var/run/netns", "/var/lib/cni", "/var/log/containers")


def _sysctl_path(name: str) -> Path:
    return Path("/proc/sys") / name.replace(".", "/")


def read_sysctls(names: Iterable[str] = SYSCTLS) -> dict[str, str]:
    values = {}
    for name in names:
        with contextlib.suppress(OSError):
            values[name] = _sysctl_path(name).read_text().strip()
    return values


def write_sysctl(name: str, value: str) -> None:
    _sysctl_path(name).write_text(value + "\n")


def _run(*cmd: str, check: bool = False) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, check=check, timeout=60)


def iptables_rules(tool: str, table: str) -> tuple[list[str], list[list[str]]]:
    """(chains, rules) of one table; a rule is its `-A CHAIN ...` words."""
    proc = _run(f"{tool}-save", "-t", table)
    chains, rules = [], []
    if proc.returncode != 0:
        return chains, rules
    for line in proc.stdout.splitlines():
        if line.startswith(":"):
            chains.append(line[1:].split()[0])
        elif line.startswith("-A "):
            rules.append(shlex.split(line))
    return chains, rules


def iptables_chains() -> dict[str, list[str]]:
    out = {}
    for tool in IPTABLES:
        for table in TABLES:
            chains, _ = iptables_rules(tool, table)
            out[f"{tool}/{table}"] = sorted(chains)
    return out


def cgroup_mounts() -> list[str]:
    mounts = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        pre, _, post = line.partition(" - ")
        if post.split()[:1] in (["cgroup"], ["cgroup2"]):
            mounts.append(pre.split()[4])
    return sorted(mounts)


def cgroup_tops() -> dict[str, list[str]]:
    tops = {}
    for mount in cgroup_mounts():
        with contextlib.suppress(OSError):
            tops[mount] = sorted(p.name for p in Path(mount).iterdir()
                                 if p.is_dir() and p.name in CGROUP_NAMES)
    return tops


def links() -> list[str]:
    return sorted(p.name for p in Path("/sys/class/net").iterdir())


def mount_points() -> list[str]:
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        points.append(point)
    return points


@dataclass
class HostState:
    sysctls: dict[str, str] = field(default_factory=dict)
    chains: dict[str, list[str]] = field(default_factory=dict)
    cgroups: dict[str, list[str]] = field(default_factory=dict)
    links: list[str] = field(default_factory=list)
    dirs: dict[str, list[str] | None] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> HostState:
        return cls(**json.loads(text))


def _listing(path: str) -> list[str] | None:
    """Every entry under path (relative, at any depth), or None when path does not exist."""
    root = Path(path)
    if not root.is_dir():
        return None
    entries = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel = Path(dirpath).relative_to(root)
        entries += [str(rel / n) for n in dirnames + filenames]
    return sorted(entries)


def capture() -> HostState:
    return HostState(sysctls=read_sysctls(), chains=iptables_chains(), cgroups=cgroup_tops(),
                     links=links(), dirs={d: _listing(d) for d in SHARED_DIRS})


def fingerprint(work_dir: Path | None = None) -> dict[str, object]:
    """What must read the same before the node and after its teardown."""
    state = capture()
    fp: dict[str, object] = {"sysctls": state.sysctls, "chains": state.chains,
                             "cgroups": state.cgroups, "links": state.links,
                             "dirs": state.dirs}
    if work_dir is not None:
        prefix = str(work_dir.resolve()) + "/"
        fp["mounts_under_work_dir"] = sorted(p for p in mount_points() if p.startswith(prefix))
    return fp


def difference(before: dict[str, object], after: dict[str, object]) -> list[str]:
    """Human-readable differences between two fingerprints (empty: the same)."""
    out = []
    for key in sorted(set(before) | set(after)):
        b, a = before.get(key), after.get(key)
        if b == a:
            continue
        if isinstance(b, dict) and isinstance(a, dict):
            for sub in sorted(set(b) | set(a)):
                if b.get(sub) != a.get(sub):
                    out.append(f"{key}[{sub}]: {b.get(sub)!r} -> {a.get(sub)!r}")
        else:
            out.append(f"{key}: {b!r} -> {a!r}")
    return out


# --------------------------------------------------------------------------- taking it back


@dataclass
class Owned:
    """What the node made, by name: the teardown removes these and nothing else."""

    work_dir: str
    containerd_socket: str
    links: list[str]
    pids: list[int] = field(default_factory=list)
    containerd_root: str = ""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie is dead for our purposes
    with contextlib.suppress(OSError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    return False


def kill_pids(pids: Iterable[int], grace: float = 10.0) -> None:
    """SIGTERM, `grace` seconds, SIGKILL: the processes we started, by PID."""
    pids = [p for p in pids if p > 1 and _alive(p)]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.1)
    for pid in pids:
        if _alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _cgroup_procs(root: Path) -> set[int]:
    pids: set[int] = set()
    if not root.is_dir():
        return pids
    for procs in root.rglob("cgroup.procs"):
        with contextlib.suppress(OSError, ValueError):
            pids.update(int(x) for x in procs.read_text().split())
    return pids


def pod_processes(before: HostState) -> set[int]:
    """Processes in the kubelet's cgroups that were not there before: the pods' processes."""
    pids: set[int] = set()
    for mount in cgroup_mounts():
        for name in CGROUP_NAMES:
            if name not in before.cgroups.get(mount, []):
                pids |= _cgroup_procs(Path(mount) / name)
    return pids


def shim_processes(containerd_socket: str) -> set[int]:
    """containerd-shim processes started for our containerd (they name its socket)."""
    pids = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = proc.joinpath("cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and b"containerd-shim" in argv[0] and containerd_socket.encode() in argv:
            pids.add(int(proc.name))
    return pids


def unmount_all(predicate: Callable[[str], bool]) -> list[str]:
    """Unmount every mount point for which predicate(path) is true, deepest first."""
    done = []
    for _ in range(5):  # stacked mounts appear once per pass
        points = sorted({p for p in mount_points() if predicate(p)}, key=len, reverse=True)
        if not points:
            break
        for point in points:
            if _run("umount", point).returncode != 0:
                _run("umount", "-l", point)
            done.append(point)
    return done


def remove_chains(before: HostState) -> list[str]:
    """Delete the chains (and the jumps to them) that appeared since `before` and are ours."""
    removed = []
    for tool in IPTABLES:
        for table in TABLES:
            chains, rules = iptables_rules(tool, table)
            had = set(before.chains.get(f"{tool}/{table}", []))
            ours = {c for c in chains if c not in had and c.startswith(CHAIN_PREFIXES)}
            for rule in rules:
                chain = rule[1]
                if chain in ours:
                    continue
                targets = {rule[i + 1] for i, w in enumerate(rule[:-1]) if w in ("-j", "-g")}
                if targets & ours or "prefix-router-node" in rule:
                    _run(tool, "-w", "-t", table, "-D", *rule[1:])
            for chain in ours:
                _run(tool, "-w", "-t", table, "-F", chain)
            for chain in ours:
                if _run(tool, "-w", "-t", table, "-X", chain).returncode == 0:
                    removed.append(f"{tool}/{table}/{chain}")
    return removed


def remove_cgroups(before: HostState) -> list[str]:
    removed = []
    for mount in cgroup_mounts():
        for name in CGROUP_NAMES:
            root = Path(mount) / name
            if name in before.cgroups.get(mount, []) or not root.is_dir():
                continue
            dirs = sorted((p for p in root.rglob("*") if p.is_dir()),
                          key=lambda p: len(p.parts), reverse=True)
            for d in [*dirs, root]:
                for _ in range(50):  # a cgroup empties a moment after its last process
                    try:
                        d.rmdir()
                        break
                    except FileNotFoundError:
                        break
                    except OSError:
                        time.sleep(0.1)
            removed.append(str(root))
    return removed


def restore_dirs(before: HostState) -> None:
    """Shared directories: remove what was added to them, and them if they were not there."""
    import shutil

    for d, listing in before.dirs.items():
        path = Path(d)
        if not path.exists():
            continue
        if listing is None:
            shutil.rmtree(path, ignore_errors=True)
            continue
        had = set(listing)
        for rel in sorted(set(_listing(d) or []) - had, key=len, reverse=True):
            entry = path / rel
            with contextlib.suppress(OSError):
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry, ignore_errors=True)
                else:
                    entry.unlink()


def restore(before: HostState, owned: Owned) -> list[str]:
    """Take the machine back to `before`. Idempotent: safe to run twice or after a crash.
    Returns notes of what it did (and how long each slow step took)."""
    notes: list[str] = []
    work = str(Path(owned.work_dir).resolve()) + "/"

    def step(what: str, t0: float, detail: str = "") -> None:
        took = time.monotonic() - t0
        if detail or took > 1.0:
            notes.append(f"{what}{': ' + detail if detail else ''} ({took:.1f}s)")

    # 1. processes: ours by PID, then the shims of our containerd and the pods' processes
    t0 = time.monotonic()
    kill_pids(owned.pids)
    killed = 0
    for _ in range(3):
        stray = shim_processes(owned.containerd_socket) | pod_processes(before)
        if not stray:
            break
        killed += len(stray)
        kill_pids(stray, grace=2.0)
    step("processes", t0, f"killed {killed} shim/pod processes" if killed else "")
    # 2. mounts: under the work dir, and network namespaces of pods in /var/run/netns
    t0 = time.monotonic()
    had_netns = set(before.dirs.get("/var/run/netns") or [])
    netns_new = {f"/var/run/netns/{n}" for n in set(_listing("/var/run/netns") or []) - had_netns}
    netns_new |= {p.replace("/var/run/", "/run/", 1) for p in netns_new}
    roots = (work, *([str(Path(owned.containerd_root).resolve()) + "/"]
                     if owned.containerd_root else []))
    unmounted = unmount_all(lambda p: p.startswith(roots) or p in netns_new)
    step("mounts", t0, f"unmounted {len(unmounted)}" if unmounted else "")
    # 3. links (the pods' veths went with their namespaces)
    t0 = time.monotonic()
    for link in owned.links:
        if Path("/sys/class/net", link).exists():
            _run("ip", "link", "delete", link)
    step("links", t0)
    # 4. iptables, cgroups, sysctls, directories
    t0 = time.monotonic()
    chains = remove_chains(before)
    step("iptables", t0, f"removed {len(chains)} chains" if chains else "")
    t0 = time.monotonic()
    cgroups = remove_cgroups(before)
    step("cgroups", t0, f"removed {', '.join(cgroups)}" if cgroups else "")
    restored = []
    for name, value in before.sysctls.items():
        if read_sysctls([name]).get(name) != value:
            with contextlib.suppress(OSError):
                write_sysctl(name, value)
                restored.append(f"{name}={value}")
    if restored:
        notes.append(f"sysctls restored: {', '.join(restored)}")
    restore_dirs(before)
    return notes
