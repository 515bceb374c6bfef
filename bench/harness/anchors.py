"""Third-party routers ("anchors") and clients, each pinned, in its own cached venv built once
by `python -m bench install` (`make test` runs it: tests/bench/test_anchors.py runs each).
Why each setting and flag: bench/results/anchors/NOTES.md."""

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from .fleet import Fleet, Proc, free_port

ANCHORS_DIR = Path(os.environ.get("PREFIX_ROUTER_CACHE", "~/.cache/prefix-router"),
                   "anchors").expanduser()


@dataclass(frozen=True)
class Package:
    name: str  # on PyPI
    version: str  # pinned
    module: str  # imported to check the install
    min_python: tuple[int, int] = (3, 11)
    run_flags: tuple[str, ...] = ()  # operational flags for its routers: logs, shutdown

    @property
    def spec(self) -> str:
        return f"{self.name}=={self.version}"

    @property
    def venv(self) -> Path:
        return ANCHORS_DIR / f"{self.name}-{self.version}"

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    @property
    def installed(self) -> bool:
        # the install's record is written last: a venv without it is half-built
        return (self.venv / "installed.json").exists() and self.python.exists()


PACKAGES: dict[str, Package] = {
    "sglang-router": Package("sglang-router", "0.3.2", "sglang_router", run_flags=(
        "--log-level", "warn", "--shutdown-grace-period-secs", "2")),
    "vllm-router": Package("vllm-router", "0.1.17", "vllm_router",
                           run_flags=("--log-level", "warning")),
    "inference-perf": Package("inference-perf", "0.7.0", "inference_perf", min_python=(3, 12)),
}


def find_python(pkg: Package) -> str:
    """An interpreter `pkg` installs on: the one behind this one (a venv's python makes a venv
    of its base anyway), or the oldest pythonX.Y on PATH that runs (pyenv's shims too)."""
    minimum = pkg.min_python
    if sys.version_info[:2] >= minimum:
        return getattr(sys, "_base_executable", sys.executable)
    check = f"import sys; sys.exit(sys.version_info[:2] < {minimum})"
    for minor in range(minimum[1], 20):
        exe = shutil.which(f"python{minimum[0]}.{minor}")
        if exe and subprocess.run([exe, "-c", check], capture_output=True).returncode == 0:
            return exe
    raise SystemExit(f"{pkg.spec} needs Python >= {minimum[0]}.{minimum[1]}: no python"
                     f"{minimum[0]}.{minimum[1]} or newer runs from PATH (with pyenv: set "
                     "PYENV_VERSION to one, e.g. `PYENV_VERSION=3.13.0 python -m bench install`)")


def install(name: str) -> Path:
    """The venv of `name`, built if absent; its record (installed.json) keeps the command, the
    interpreter and `pip freeze`. Returns the venv's python."""
    pkg = PACKAGES[name]
    venv, py = pkg.venv, str(pkg.python)
    if pkg.installed:
        return pkg.python
    shutil.rmtree(venv, ignore_errors=True)  # a half-built venv from an interrupted install
    venv.parent.mkdir(parents=True, exist_ok=True)
    base = find_python(pkg)
    cmd = [py, "-m", "pip", "install", "-q", pkg.spec]
    for step in ([base, "-m", "venv", str(venv)], [py, "-m", "pip", "install", "-q", "-U", "pip"],
                 cmd, [py, "-c", f"import {pkg.module}"]):
        subprocess.run(step, check=True)
    out = [subprocess.run([py, *a], capture_output=True, text=True, check=True).stdout
           for a in (["--version"], ["-m", "pip", "freeze"])]
    record = {"name": pkg.name, "version": pkg.version, "python": out[0].split()[-1],
              "base_interpreter": base, "freeze": out[1].split(),
              "command": " ".join([base, "-m", "venv", str(venv), "&&", *cmd])}
    (venv / "installed.json").write_text(json.dumps(record, indent=2) + "\n")
    return pkg.python


def check_names(names: list[str]) -> list[str]:
    """The packages to install: those named, or every one when none is."""
    if bad := [n for n in names if n not in PACKAGES]:
        raise SystemExit(f"unknown {', '.join(bad)} (choose from {', '.join(sorted(PACKAGES))})")
    return names or list(PACKAGES)


@dataclass(frozen=True)
class Anchor:
    """A third-party router, `python -m <package's module>.launch_router` from its venv. One
    entry in ANCHORS adds it to every comparison."""

    package: str  # key of PACKAGES
    policy: str
    settings: tuple[str, ...]  # the documented settings, passed explicitly
    source: str  # where those settings are documented

    def command(self, python: str | Path, workers: list[str], port: int, metrics: int) -> list[str]:
        pkg = PACKAGES[self.package]
        # its metrics port: both default to 29000, which collides with any other router here
        return [str(python), "-m", f"{pkg.module}.launch_router", "--host", "127.0.0.1",
                "--port", str(port), "--worker-urls", *workers, "--policy", self.policy,
                *self.settings, "--prometheus-host", "127.0.0.1", "--prometheus-port",
                str(metrics), *pkg.run_flags]


VLLM_DOC = "vllm-project/router docs/load_balancing/README.md"
ANCHORS: dict[str, Anchor] = {
    "sglang-cache_aware": Anchor(
        "sglang-router", "cache_aware",
        ("--cache-threshold", "0.3", "--balance-abs-threshold", "64", "--balance-rel-threshold",
         "1.5", "--eviction-interval-secs", "120", "--max-tree-size", "67108864"),
        "lightseekorg/smg docs/configuration/routing.md (Cache-Aware Policy); "
        "sgl-project/sglang docs/advanced_features/router.md (Cache-Aware Tuning)"),
    "vllm-cache_aware": Anchor(
        "vllm-router", "cache_aware", ("--cache-threshold", "0.5", "--balance-abs-threshold",
                                       "32", "--balance-rel-threshold", "1.1"),
        f"{VLLM_DOC} (Cache Aware)"),
    # keyed by X-Session-ID, which the comparison sends (without, it hashes the whole body)
    "vllm-consistent_hash": Anchor("vllm-router", "consistent_hash", (),
                                   f"{VLLM_DOC} (Consistent Hash)"),
}


def missing(anchor: Anchor | Package) -> str | None:
    """Why `anchor` (or a client's package) cannot run here (its venv is absent), or None."""
    pkg = anchor if isinstance(anchor, Package) else PACKAGES[anchor.package]
    if pkg.installed:
        return None
    return (f"{pkg.name} {pkg.version} is not installed; run `python -m bench install "
            f"{pkg.name}` (builds {pkg.venv})")


async def start_anchor(fleet: Fleet, name: str, workers: list[str]) -> Proc:
    """Anchor `name` in front of `workers`, once its /readiness counts them all healthy."""
    anchor = ANCHORS[name]
    if why := missing(anchor):
        raise RuntimeError(why)
    port = free_port()
    args = anchor.command(PACKAGES[anchor.package].python, workers, port, free_port())

    def all_healthy(body: str) -> bool:  # both: {"status": "ready", "healthy_workers": k, ...}
        return json.loads(body).get("healthy_workers", 0) >= len(workers)

    return await fleet.start(name, args, port, "/readiness", timeout=60.0, ready=all_healthy)
