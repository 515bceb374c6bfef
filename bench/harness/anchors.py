"""Third-party routers ("anchors") and clients, each pinned, in its own cached venv
(`~/.cache/prefix-router/anchors/<name>-<version>/`, built once by `python -m bench install`;
nothing here is installed by `make test`)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from .fleet import Fleet, Proc, free_port

CACHE = Path(os.environ.get("PREFIX_ROUTER_CACHE", "~/.cache/prefix-router")).expanduser()
ANCHORS_DIR = CACHE / "anchors"
STAMP = "installed.json"


@dataclass(frozen=True)
class Package:
    name: str  # the PyPI name
    version: str  # pinned
    module: str  # import name, to check the install
    min_python: tuple[int, int] = (3, 11)

    @property
    def spec(self) -> str:
        return f"{self.name}=={self.version}"


PACKAGES: dict[str, Package] = {
    "sglang-router": Package("sglang-router", "0.3.2", "sglang_router"),
    "vllm-router": Package("vllm-router", "0.1.17", "vllm_router"),
    # inference-perf 0.7.0 declares Requires-Python >=3.12.
    "inference-perf": Package("inference-perf", "0.7.0", "inference_perf", (3, 12)),
}


def venv_dir(pkg: Package) -> Path:
    return ANCHORS_DIR / f"{pkg.name}-{pkg.version}"


def venv_python(pkg: Package) -> Path:
    return venv_dir(pkg) / "bin" / "python"


def stamp(pkg: Package) -> dict | None:
    """The install record, or None when the cached venv is absent or incomplete."""
    p = venv_dir(pkg) / STAMP
    with contextlib.suppress(OSError, ValueError):
        return json.loads(p.read_text()) if venv_python(pkg).exists() else None
    return None


def _version_of(exe: str) -> tuple[int, int] | None:
    try:
        out = subprocess.run([exe, "-c", "import sys; print(*sys.version_info[:2])"],
                             capture_output=True, text=True, timeout=30, check=True).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return None
    return int(out[0]), int(out[1])


def find_python(minimum: tuple[int, int]) -> str:
    """An interpreter of at least `minimum`: the one behind this one (a venv's python makes a
    venv of its base anyway), or the oldest pythonX.Y on PATH (pyenv's shims included)."""
    if sys.version_info[:2] >= minimum:
        return getattr(sys, "_base_executable", sys.executable)
    for minor in range(minimum[1], 20):
        exe = shutil.which(f"python{minimum[0]}.{minor}")
        if exe and (_version_of(exe) or (0, 0)) >= minimum:
            return exe
    raise RuntimeError(f"no Python >= {minimum[0]}.{minimum[1]} on PATH")


def install(name: str) -> Path:
    """The venv of `name`, built if absent (its stamp records the command, the interpreter
    and `pip freeze`); idempotent. Returns the venv's python."""
    pkg = PACKAGES[name]
    d, py = venv_dir(pkg), str(venv_python(pkg))
    if stamp(pkg) is not None:
        return Path(py)
    shutil.rmtree(d, ignore_errors=True)  # a half-built venv from an interrupted install
    d.parent.mkdir(parents=True, exist_ok=True)
    base = find_python(pkg.min_python)
    cmd = [py, "-m", "pip", "install", "-q", pkg.spec]
    for step in ([base, "-m", "venv", str(d)], [py, "-m", "pip", "install", "-q", "-U", "pip"],
                 cmd, [py, "-c", f"import {pkg.module}"]):
        subprocess.run(step, check=True)
    freeze = subprocess.run([py, "-m", "pip", "freeze"], capture_output=True, text=True,
                            check=True).stdout.split()
    record = {"name": pkg.name, "version": pkg.version, "python": _version_of(py),
              "base_interpreter": base, "freeze": freeze,
              "command": " ".join([base, "-m", "venv", str(d), "&&", *cmd])}
    (d / STAMP).write_text(json.dumps(record, indent=2) + "\n")
    return Path(py)


# ----------------------------------------------------------------------------------------------
# Anchor routers: how each is started in front of a list of worker (simulator) URLs.


@dataclass(frozen=True)
class Anchor:
    """One third-party router configuration, started as `python -m <module>` from its venv.
    Adding one to every comparison is one entry in ANCHORS (and its Package if new)."""

    package: str  # key of PACKAGES
    module: str
    policy: str
    settings: tuple[str, ...]  # the documented settings, passed explicitly
    source: str  # where those settings are documented

    def command(self, python: str | Path, workers: list[str], port: int, metrics: int) -> list[str]:
        # Both default to a fixed metrics port 29000, which collides with any other router here.
        return [str(python), "-m", self.module, "--host", "127.0.0.1", "--port", str(port),
                "--worker-urls", *workers, "--policy", self.policy, *self.settings,
                "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics),
                *_RUNTIME[self.package]]


# Operational flags, not routing settings: quiet logs, and for sglang-router a short shutdown
# grace (default 180 s, which would outlast Fleet.stop's 10 s before SIGKILL).
_RUNTIME: dict[str, tuple[str, ...]] = {
    "sglang-router": ("--log-level", "warn", "--shutdown-grace-period-secs", "2"),
    "vllm-router": ("--log-level", "warning"),
}

ANCHORS: dict[str, Anchor] = {
    # SGLang Model Gateway's own guide recommends the cache_aware defaults "for most workloads"
    # (lightseekorg/smg docs/configuration/routing.md, "Cache-Aware Policy": cache-threshold
    # 0.3, balance-abs-threshold 64, balance-rel-threshold 1.5, eviction-interval 120,
    # max-tree-size 67108864; "Recommended: 0.3 for most workloads"); SGLang's router page
    # (sgl-project/sglang docs/advanced_features/router.md, "Cache-Aware Tuning") lists the
    # same values as the defaults. sglang-router 0.3.2's own eviction default is 60 s, so every
    # value is passed explicitly.
    "sglang-cache_aware": Anchor(
        "sglang-router", "sglang_router.launch_router", "cache_aware",
        ("--cache-threshold", "0.3", "--balance-abs-threshold", "64", "--balance-rel-threshold",
         "1.5", "--eviction-interval-secs", "120", "--max-tree-size", "67108864"),
        "lightseekorg/smg docs/configuration/routing.md (Cache-Aware Policy); "
        "sgl-project/sglang docs/advanced_features/router.md (Cache-Aware Tuning)",
    ),
    # vllm-project/router docs/load_balancing/README.md, "Cache Aware": the example command
    # passes --cache-threshold 0.5 --balance-abs-threshold 32 --balance-rel-threshold 1.1 (the
    # page calls them the defaults; vllm-router 0.1.17's code defaults are 0.3 / 64 / 1.5). The
    # page's eviction_interval 30 and max_tree_size 10000 are not in its command and contradict
    # the package (120 s, 2**25 nodes); the package's are kept.
    "vllm-cache_aware": Anchor(
        "vllm-router", "vllm_router.launch_router", "cache_aware",
        ("--cache-threshold", "0.5", "--balance-abs-threshold", "32", "--balance-rel-threshold",
         "1.1"),
        "vllm-project/router docs/load_balancing/README.md (Cache Aware)",
    ),
    # Same page, "Consistent Hash": no tunables. The key is X-Session-ID (then X-User-ID, ...,
    # body fields session_params.session_id / user); without one it hashes the whole body, so
    # every distinct request lands on an arbitrary worker: the comparison sends X-Session-ID.
    "vllm-consistent_hash": Anchor(
        "vllm-router", "vllm_router.launch_router", "consistent_hash", (),
        "vllm-project/router docs/load_balancing/README.md (Consistent Hash)",
    ),
}


def missing(anchor: Anchor) -> str | None:
    """Why `anchor` cannot start here (its venv is not installed), or None."""
    pkg = PACKAGES[anchor.package]
    if stamp(pkg) is None:
        return (f"{pkg.name} {pkg.version} is not installed; run `python -m bench install "
                f"{pkg.name}` (builds {venv_dir(pkg)})")
    return None


async def wait_workers(url: str, n: int, timeout: float = 60.0) -> None:
    """Until the router's /readiness reports `n` healthy workers (both anchors answer
    {"status": "ready", "healthy_workers": k, "total_workers": m})."""
    deadline, last = time.monotonic() + timeout, ""
    async with aiohttp.ClientSession() as s:
        while time.monotonic() < deadline:
            with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError, ValueError):
                async with s.get(url + "/readiness", timeout=aiohttp.ClientTimeout(total=2)) as r:
                    last = await r.text()
                    if r.status == 200 and json.loads(last).get("healthy_workers", 0) >= n:
                        return
            await asyncio.sleep(0.2)
    raise RuntimeError(f"{url}: fewer than {n} healthy workers after {timeout}s: {last[:300]}")


async def start_anchor(fleet: Fleet, name: str, workers: list[str]) -> Proc:
    """Start anchor `name` in front of `workers`; returns once it routes to all of them."""
    anchor = ANCHORS[name]
    if why := missing(anchor):
        raise RuntimeError(why)
    port, metrics_port = free_port(), free_port()
    args = anchor.command(venv_python(PACKAGES[anchor.package]), workers, port, metrics_port)
    p = await fleet.start(name, args, port, "/readiness", timeout=60.0)
    await wait_workers(p.url, len(workers))
    return p


def check_names(names: list[str]) -> list[str]:
    """The packages to install: those named, or every one when none is."""
    if bad := [n for n in names if n not in PACKAGES]:
        raise SystemExit(f"unknown {', '.join(bad)} (choose from {', '.join(sorted(PACKAGES))})")
    return names or list(PACKAGES)
