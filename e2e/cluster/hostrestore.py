"""Taking the machine back after a real node: `restore(before, owned)` removes what appeared
since `before` (a hoststate.HostState), touching only what is ours: processes we started (by
PID) and the shims and pod processes they left, mounts under the work directory and
containerd's root, the links the node made, iptables chains named as kube-proxy, the kubelet
and the CNI plugins name theirs (and every jump to them), tables that did not exist before and
are left empty, the kubelet's cgroups, sysctls that differ from before, what appeared in the
directories containerd, libcni and the kubelet hard-code. Idempotent: safe to run twice or
after a crash. What it cannot take back shows in hoststate.difference().

node.host_network_down() removes the node's own rule (it knows the rule it added).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from hoststate import (
    IPTABLES,
    HostState,
    Table,
    _listing,
    cgroup_mounts,
    iptables_save,
    mount_points,
    parse_save,
    read_sysctls,
    write_sysctl,
)

# Chains that kube-proxy, the kubelet and the CNI plugins create.
CHAIN_PREFIXES = ("KUBE-", "CNI-")
# Top-level cgroups the kubelet creates (cgroupfs driver) in every hierarchy.
CGROUP_NAMES = ("kubepods", "kubepods.slice")


@dataclass
class Owned:
    """What the node made, by name: the teardown removes these and nothing else."""

    work_dir: str
    containerd_socket: str
    links: list[str]
    pids: list[int] = field(default_factory=list)
    containerd_root: str = ""


def _run(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=60)


# --------------------------------------------------------------------------- processes


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


def processes_left(before: HostState, owned: Owned) -> list[str]:
    """The node's processes still alive (empty after a complete teardown)."""
    ours = {p for p in owned.pids if _alive(p)}
    return [f"processes: {what} {sorted(pids)} still alive" for what, pids in (
        ("started", ours), ("shim", shim_processes(owned.containerd_socket)),
        ("pod", {p for p in pod_processes(before) if _alive(p)})) if pids]


# --------------------------------------------------------------------------- mounts


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


# --------------------------------------------------------------------------- iptables


def _targets(rule: list[str]) -> set[str]:
    return {rule[i + 1] for i, w in enumerate(rule[:-1]) if w in ("-j", "-g")}


def new_chains(before: Table, now: Table) -> set[str]:
    """Chains of ours: named as kube-proxy, the kubelet and the CNI plugins name theirs, and
    not there before."""
    return {c for c in now.chains if c not in before.chains and c.startswith(CHAIN_PREFIXES)}


def rules_into(chains: set[str], now: Table) -> list[list[str]]:
    """Rules outside `chains` that jump or go to one of them (deleted before the chains)."""
    return [r for r in now.rules if r[1] not in chains and _targets(r) & chains]


def remove_chains(before: HostState) -> list[str]:
    """Delete the chains (and the jumps to them) that appeared since `before` and are ours."""
    removed = []
    for tool in IPTABLES:
        was = before.tables(tool)
        for name, table in parse_save(iptables_save(tool)).items():
            ours = new_chains(was.get(name, Table()), table)
            for rule in rules_into(ours, table):
                _run(tool, "-w", "-t", name, "-D", *rule[1:])
            for chain in ours:
                _run(tool, "-w", "-t", name, "-F", chain)
            for chain in ours:
                if _run(tool, "-w", "-t", name, "-X", chain).returncode == 0:
                    removed.append(f"{tool}/{name}/{chain}")
    return removed


def _nf_tables(tool: str) -> bool:
    """Whether `tool` is iptables-nft (its tables are nftables tables, deletable by nft)."""
    return shutil.which(tool) is not None and "nf_tables" in _run(tool, "-V").stdout


def remove_new_tables(before: HostState) -> list[str]:
    """Delete the tables that did not exist before and are now empty. iptables-nft creates a
    table (with its built-in chains) at first use and never deletes it; only nft can."""
    removed = []
    for tool, family in IPTABLES.items():
        was = before.tables(tool)
        left = [n for n, t in parse_save(iptables_save(tool)).items()
                if n not in was and t.empty()]
        if not left:
            continue
        if not _nf_tables(tool) or shutil.which("nft") is None:
            removed.append(f"{tool}: cannot delete the new empty tables {left} "
                           "(not iptables-nft, or nft is not installed)")
            continue
        for name in left:
            if _run("nft", "delete", "table", family, name).returncode == 0:
                removed.append(f"{family}/{name}")
    return removed


# --------------------------------------------------------------------------- cgroups, sysctls, dirs


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


def restore_sysctls(before: HostState) -> list[str]:
    """Write back every sysctl that differs from before. Twice: a global switch
    (net.ipv4.ip_forward) also sets every interface's, which the second pass puts back."""
    restored = []
    for _ in range(2):
        now = read_sysctls(before.sysctls)
        for name, value in before.sysctls.items():
            if name in now and now[name] != value:
                with contextlib.suppress(OSError):
                    write_sysctl(name, value)
                    restored.append(f"{name}={value}")
    return restored


def restore_dirs(before: HostState) -> None:
    """Shared directories: remove what was added to them, and them if they were not there."""
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


# --------------------------------------------------------------------------- all of it


def restore(before: HostState, owned: Owned) -> list[str]:
    """Take the machine back to `before`. Returns notes of what it did (and how long each
    slow step took)."""
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
    # 2. mounts: under the work dir and containerd's root, and pods' network namespaces
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
    # 4. iptables: chains, then the tables they leave empty
    t0 = time.monotonic()
    chains = remove_chains(before)
    tables = remove_new_tables(before)
    step("iptables", t0, "; ".join(filter(None, [
        f"removed {len(chains)} chains" if chains else "",
        f"tables {', '.join(tables)}" if tables else ""])))
    # 5. cgroups, sysctls, directories
    t0 = time.monotonic()
    cgroups = remove_cgroups(before)
    step("cgroups", t0, f"removed {', '.join(cgroups)}" if cgroups else "")
    restored = restore_sysctls(before)
    if restored:
        notes.append(f"sysctls restored: {', '.join(restored)}")
    restore_dirs(before)
    return notes
