"""What this machine looks like, as far as a real node can change it.

A kubelet, containerd, runc, the CNI bridge plugin and kube-proxy change the host: sysctls,
iptables (tables, chains and rules), cgroups, mounts (container root filesystems, network
namespaces, volumes, the kubelet's shared root), network links, addresses and routes, a few
directories. `capture()` reads each of them whole; `fingerprint()` is that reading as plain
data, and what must read the same before the node came up and after it went down
(`difference()` says how two readings differ). hostrestore.py takes the machine back.

What is left out, and why:
- sysctls that are read-only (counters and state, not settings) and two the kernel itself
  changes all the time (VOLATILE_SYSCTLS);
- cgroups below the top level: this machine's process manager makes a cgroup per command of
  every session under its own top-level one, while everything the kubelet makes (cgroupfs
  driver, cgroup root /) hangs under a new top-level `kubepods`;
- address lifetimes and route expiry (they count down), packet counters of iptables.

The state is plain JSON (`HostState.to_json`), so a teardown can run in another process than
the one that brought the node up (`make cluster-down`), or after that process was killed.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

# iptables front ends and the nftables family each writes to
IPTABLES = {"iptables": "ip", "ip6tables": "ip6"}
# The last PID handed out, and a rate the kernel lowers by itself when sampling takes too long.
VOLATILE_SYSCTLS = frozenset({"kernel/ns_last_pid", "kernel/perf_event_max_sample_rate"})
# Directories outside the work directory that containerd, the CRI plugin, libcni and the
# kubelet write to whatever their settings (see node.py): removed if they were not there.
SHARED_DIRS = ("/run/containerd", "/var/run/netns", "/var/lib/cni", "/var/log/containers")
_COUNTERS = re.compile(r"\s*\[\d+:\d+\]\s*")
_LIFETIMES = re.compile(r"\s*(valid|preferred)_lft \S+")
_EXPIRES = re.compile(r"\s*expires \S+")


def _run(*cmd: str) -> subprocess.CompletedProcess[str] | None:
    """Run a command of the host; None when it is not installed."""
    if shutil.which(cmd[0]) is None:
        return None
    return subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=60)


# --------------------------------------------------------------------------- sysctls


def _sysctl_path(name: str) -> Path:
    """`net/ipv4/conf/eth0.5/forwarding` (a path under /proc/sys, the form read_sysctls keys
    by: an interface name may hold dots) or `net.ipv4.ip_forward`."""
    return Path("/proc/sys", name if "/" in name else name.replace(".", "/"))


def read_sysctls(names: Iterable[str] | None = None) -> dict[str, str]:
    """Every sysctl that is a setting (readable and writable) but the volatile ones, keyed by
    its path under /proc/sys; or those of `names` that can be read."""
    if names is None:
        paths = []
        for dirpath, _, filenames in os.walk("/proc/sys"):
            paths += [Path(dirpath, f) for f in filenames]
        names = [str(p.relative_to("/proc/sys")) for p in paths]
    values = {}
    for name in names:
        if name in VOLATILE_SYSCTLS:
            continue
        path = _sysctl_path(name)
        with contextlib.suppress(OSError):
            mode = path.stat().st_mode
            if mode & 0o222 and mode & 0o444:
                values[name] = path.read_text().strip()
    return values


def write_sysctl(name: str, value: str) -> None:
    _sysctl_path(name).write_text(value + "\n")


# --------------------------------------------------------------------------- iptables


@dataclass
class Table:
    """One table of an `iptables-save`: chain -> policy ('-' for a chain of its own), and
    each rule as its words (`-A CHAIN ...`, quoted arguments one word each)."""

    chains: dict[str, str] = field(default_factory=dict)
    rules: list[list[str]] = field(default_factory=list)

    def empty(self) -> bool:
        """No rule, no chain of its own, every built-in chain accepting: a table that does
        nothing (iptables-nft leaves one behind when the last rule goes)."""
        return not self.rules and all(p == "ACCEPT" for p in self.chains.values())


def normalized_save(text: str) -> list[str]:
    """`iptables-save` output without its timestamps and packet counters."""
    out = []
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        if line.startswith(":"):
            line = _COUNTERS.sub("", line) if line.endswith("]") else line
        elif line.startswith("["):
            line = _COUNTERS.sub("", line, count=1)
        out.append(line)
    return out


def parse_save(lines: Iterable[str]) -> dict[str, Table]:
    tables: dict[str, Table] = {}
    table = Table()
    for line in lines:
        if line.startswith("*"):
            table = tables.setdefault(line[1:], Table())
        elif line.startswith(":"):
            chain, policy = line[1:].split()[:2]
            table.chains[chain] = policy
        elif line.startswith("-A "):
            table.rules.append(shlex.split(line))
    return tables


def iptables_save(tool: str) -> list[str]:
    """Every table of `tool` as it is now (normalized); [] when the tool is not installed.
    Only the whole save lists the tables that exist (`-t TABLE` shows one that does not)."""
    proc = _run(f"{tool}-save")
    return normalized_save(proc.stdout) if proc is not None and proc.returncode == 0 else []


def nft_ruleset() -> list[str]:
    """`nft -s list ruleset` (stateless: no counters); [] without nft."""
    proc = _run("nft", "-s", "list", "ruleset")
    return [ln.rstrip() for ln in proc.stdout.splitlines() if ln.strip()] \
        if proc is not None and proc.returncode == 0 else []


# --------------------------------------------------------------------------- the rest


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
            tops[mount] = sorted(p.name for p in Path(mount).iterdir() if p.is_dir())
    return tops


def links() -> list[str]:
    return sorted(p.name for p in Path("/sys/class/net").iterdir())


def _ip_lines(*args: str, drop: re.Pattern[str]) -> list[str]:
    proc = _run("ip", *args)
    if proc is None or proc.returncode != 0:
        return []
    return [drop.sub("", ln).replace("\\", " ").strip() for ln in proc.stdout.splitlines()
            if ln.strip()]


def addresses() -> list[str]:
    return sorted(_ip_lines("-o", "addr", "show", drop=_LIFETIMES))


def routes() -> list[str]:
    out = []
    for family in ("-4", "-6"):
        out += [f"route{family} {r}" for r in _ip_lines(family, "route", "show", "table", "all",
                                                        drop=_EXPIRES)]
        out += [f"rule{family} {r}" for r in _ip_lines(family, "rule", "show", drop=_EXPIRES)]
    return sorted(out)


def mount_points() -> list[str]:
    return [line.split()[4].replace("\\040", " ")
            for line in Path("/proc/self/mountinfo").read_text().splitlines()]


def mounts() -> list[str]:
    """Every mount: where, what, type, options and propagation (peer group numbers left out,
    the kernel hands out new ones when a mount is made again)."""
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        pre, _, post = line.partition(" - ")
        words = pre.split()
        fstype, source, superopts = [*post.split(), "", "", ""][:3]
        propagation = " ".join(sorted(w.split(":")[0] for w in words[6:])) or "private"
        out.append(f"{words[4]} root={words[3]} {fstype} {source} {words[5]} {superopts} "
                   f"{propagation}")
    return sorted(out)


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


# --------------------------------------------------------------------------- the whole


@dataclass
class HostState:
    sysctls: dict[str, str] = field(default_factory=dict)
    iptables: dict[str, list[str]] = field(default_factory=dict)
    nft: list[str] = field(default_factory=list)
    cgroups: dict[str, list[str]] = field(default_factory=dict)
    links: list[str] = field(default_factory=list)
    addresses: list[str] = field(default_factory=list)
    routes: list[str] = field(default_factory=list)
    mounts: list[str] = field(default_factory=list)
    dirs: dict[str, list[str] | None] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True)

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> HostState:
        """From a state file, also one an earlier version wrote (unknown keys are ignored)."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})  # type: ignore[arg-type]

    def tables(self, tool: str) -> dict[str, Table]:
        return parse_save(self.iptables.get(tool, []))


def capture() -> HostState:
    return HostState(sysctls=read_sysctls(),
                     iptables={tool: iptables_save(tool) for tool in IPTABLES},
                     nft=nft_ruleset(), cgroups=cgroup_tops(), links=links(),
                     addresses=addresses(), routes=routes(), mounts=mounts(),
                     dirs={d: _listing(d) for d in SHARED_DIRS})


def fingerprint() -> dict[str, object]:
    """What must read the same before the node and after its teardown: all of capture()."""
    return json.loads(capture().to_json())


def _list_difference(key: str, b: list[object], a: list[object]) -> list[str]:
    gone = [x for x in b if x not in a]
    new = [x for x in a if x not in b]
    if not gone and not new:  # the same items, in another order or count
        return [f"{key}: {b!r} -> {a!r}"]
    return [f"{key}: -{x}" for x in gone] + [f"{key}: +{x}" for x in new]


def difference(before: Mapping[str, object], after: Mapping[str, object],
               key: str = "") -> list[str]:
    """Human-readable differences between two fingerprints (empty: the same)."""
    out: list[str] = []
    for k in sorted(set(before) | set(after)):
        b, a = before.get(k), after.get(k)
        name = f"{key}[{k}]" if key else k
        if b == a:
            continue
        if isinstance(b, Mapping) and isinstance(a, Mapping):
            out += difference(b, a, name)
        elif isinstance(b, list) and isinstance(a, list):
            out += _list_difference(name, b, a)
        else:
            out.append(f"{name}: {b!r} -> {a!r}")
    return out
