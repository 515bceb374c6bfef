"""Third-party routers ("anchors") and clients, each in its own cached virtual environment.

Every package is pinned; `install` builds `~/.cache/prefix-router/anchors/<name>-<version>/`
once (a stamp file records the exact install command, the interpreter and `pip freeze`) and
returns at once when the stamp is there. Nothing here is installed by `make test`.
"""

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
from typing import Any

from .fleet import Fleet, Proc, free_port
from .provenance import now_utc

CACHE = Path(os.environ.get("PREFIX_ROUTER_CACHE", "~/.cache/prefix-router")).expanduser()
ANCHORS_DIR = CACHE / "anchors"
STAMP = "installed.json"


@dataclass(frozen=True)
class Package:
    name: str  # the PyPI name
    version: str  # pinned
    min_python: tuple[int, int] = (3, 11)
    module: str = ""  # import name, to check the install

    @property
    def spec(self) -> str:
        return f"{self.name}=={self.version}"


PACKAGES: dict[str, Package] = {
    "sglang-router": Package("sglang-router", "0.3.2", module="sglang_router"),
    "vllm-router": Package("vllm-router", "0.1.17", module="vllm_router"),
    # inference-perf 0.7.0 declares Requires-Python >=3.12.
    "inference-perf": Package("inference-perf", "0.7.0", (3, 12), module="inference_perf"),
    "aiperf": Package("aiperf", "0.13.0", module="aiperf"),
}


def venv_dir(pkg: Package) -> Path:
    return ANCHORS_DIR / f"{pkg.name}-{pkg.version}"


def venv_python(pkg: Package) -> Path:
    return venv_dir(pkg) / "bin" / "python"


def stamp(pkg: Package) -> dict | None:
    """The install record, or None when the cached venv is absent or incomplete."""
    p = venv_dir(pkg) / STAMP
    if not p.exists() or not venv_python(pkg).exists():
        return None
    try:
        return json.loads(p.read_text())
    except ValueError:
        return None


def _version_of(exe: str) -> tuple[int, int] | None:
    try:
        out = subprocess.run(
            [exe, "-c", "import sys; print(sys.version_info[0], sys.version_info[1])"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return None
    return int(out[0]), int(out[1])


def _numeric(version: str) -> tuple[int, ...]:
    parts = []
    for piece in version.split("."):
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else -1)
    return tuple(parts)


def find_python(minimum: tuple[int, int]) -> str:
    """An interpreter of at least `minimum`: this one, pythonX.Y on PATH, or a pyenv build."""
    if sys.version_info[:2] >= minimum:
        # the interpreter behind this one (a venv's python makes a venv of its base anyway)
        return getattr(sys, "_base_executable", sys.executable)
    candidates: list[str] = []
    for minor in range(minimum[1], 15):
        exe = shutil.which(f"python{minimum[0]}.{minor}")
        if exe:
            candidates.append(exe)
    root = Path(os.environ.get("PYENV_ROOT", "~/.pyenv")).expanduser() / "versions"
    if root.is_dir():
        # newest first (3.13 before 3.12 before 3.9)
        builds = sorted(root.iterdir(), key=lambda p: _numeric(p.name), reverse=True)
        candidates += [str(p / "bin" / "python") for p in builds]
    for exe in candidates:
        v = _version_of(exe)
        if v is not None and v >= minimum and Path(exe).exists():
            return exe
    raise RuntimeError(f"no Python >= {minimum[0]}.{minimum[1]} found (PATH, pyenv)")


def install_command(pkg: Package) -> list[str]:
    return [str(venv_python(pkg)), "-m", "pip", "install", "-q", pkg.spec]


def install(name: str, *, quiet: bool = False) -> Path:
    """The venv of `name`, built if absent; idempotent. Returns the venv's python."""
    pkg = PACKAGES[name]
    if stamp(pkg) is not None:
        return venv_python(pkg)
    d = venv_dir(pkg)
    if d.exists():
        shutil.rmtree(d)  # a half-built venv from an interrupted install
    d.parent.mkdir(parents=True, exist_ok=True)
    base = find_python(pkg.min_python)
    out = None if not quiet else subprocess.DEVNULL
    subprocess.run([base, "-m", "venv", str(d)], check=True, stdout=out)
    subprocess.run(
        [str(venv_python(pkg)), "-m", "pip", "install", "-q", "-U", "pip"], check=True, stdout=out
    )
    cmd = install_command(pkg)
    subprocess.run(cmd, check=True, stdout=out)
    if pkg.module:
        subprocess.run([str(venv_python(pkg)), "-c", f"import {pkg.module}"], check=True)
    freeze = subprocess.run(
        [str(venv_python(pkg)), "-m", "pip", "freeze"], capture_output=True, text=True, check=True
    ).stdout.split()
    record = {
        "name": pkg.name,
        "version": pkg.version,
        "python": _version_of(str(venv_python(pkg))),
        "base_interpreter": base,
        "command": " ".join([base, "-m", "venv", str(d), "&&", *cmd]),
        "freeze": freeze,
    }
    (d / STAMP).write_text(json.dumps(record, indent=2) + "\n")
    return venv_python(pkg)


# ----------------------------------------------------------------------------------------------
# Anchor routers: how each is started in front of a list of worker (simulator) URLs.


@dataclass(frozen=True)
class Anchor:
    """One third-party router configuration, started as `python -m <module>` from its venv."""

    name: str  # as it appears in our tables, e.g. "sglang-cache_aware"
    package: str  # key of PACKAGES
    module: str
    policy: str
    settings: tuple[str, ...]  # the documented settings, passed explicitly
    source: str  # where those settings are documented
    # headers our clients should send for the policy to have a key (none for cache-aware)
    note: str = ""

    def command(
        self, python: str | Path, workers: list[str], port: int, metrics_port: int
    ) -> list[str]:
        base = [
            str(python),
            "-m",
            self.module,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--worker-urls",
            *workers,
            "--policy",
            self.policy,
            *self.settings,
            # Both default to 0.0.0.0:29000 (sglang) / 127.0.0.1:29000 (vllm); a fixed port
            # collides with any other router on the machine.
            "--prometheus-host",
            "127.0.0.1",
            "--prometheus-port",
            str(metrics_port),
        ]
        return base + list(_RUNTIME[self.package])


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
        "sglang-cache_aware",
        "sglang-router",
        "sglang_router.launch_router",
        "cache_aware",
        (
            "--cache-threshold",
            "0.3",
            "--balance-abs-threshold",
            "64",
            "--balance-rel-threshold",
            "1.5",
            "--eviction-interval-secs",
            "120",
            "--max-tree-size",
            "67108864",
        ),
        "lightseekorg/smg docs/configuration/routing.md (Cache-Aware Policy); "
        "sgl-project/sglang docs/advanced_features/router.md (Cache-Aware Tuning)",
    ),
    # vllm-project/router docs/load_balancing/README.md, "Cache Aware": the example command
    # passes --cache-threshold 0.5 --balance-abs-threshold 32 --balance-rel-threshold 1.1 (the
    # page calls them the defaults; vllm-router 0.1.17's code defaults are 0.3 / 64 / 1.5). The
    # page's eviction_interval 30 and max_tree_size 10000 are not in its command and contradict
    # the package (120 s, 2**25 nodes); the package's are kept.
    "vllm-cache_aware": Anchor(
        "vllm-cache_aware",
        "vllm-router",
        "vllm_router.launch_router",
        "cache_aware",
        (
            "--cache-threshold",
            "0.5",
            "--balance-abs-threshold",
            "32",
            "--balance-rel-threshold",
            "1.1",
        ),
        "vllm-project/router docs/load_balancing/README.md (Cache Aware)",
    ),
    # Same page, "Consistent Hash": no tunables. The key is X-Session-ID (then X-User-ID, ...,
    # body fields session_params.session_id / user); without one it hashes the whole body, so
    # every distinct request lands on an arbitrary worker.
    "vllm-consistent_hash": Anchor(
        "vllm-consistent_hash",
        "vllm-router",
        "vllm_router.launch_router",
        "consistent_hash",
        (),
        "vllm-project/router docs/load_balancing/README.md (Consistent Hash)",
        note="keyed by X-Session-ID; without it, a hash of the request body",
    ),
}


def available(anchor: Anchor) -> bool:
    """Whether the anchor's cached venv is installed (never installs)."""
    return stamp(PACKAGES[anchor.package]) is not None


def version_of(anchor: Anchor) -> str:
    return PACKAGES[anchor.package].version


async def wait_workers(url: str, n: int, timeout: float = 60.0) -> None:
    """Until the router's /readiness reports `n` healthy workers (both anchors answer
    {"status": "ready", "healthy_workers": k, "total_workers": m})."""
    import aiohttp

    deadline = time.monotonic() + timeout
    last = ""
    async with aiohttp.ClientSession() as s:
        while time.monotonic() < deadline:
            with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError, ValueError):
                async with s.get(url + "/readiness", timeout=aiohttp.ClientTimeout(total=2)) as r:
                    last = await r.text()
                    if r.status == 200 and json.loads(last).get("healthy_workers", 0) >= n:
                        return
            await asyncio.sleep(0.2)
    raise RuntimeError(f"{url}: fewer than {n} healthy workers after {timeout}s: {last[:300]}")


async def start_anchor(fleet: Fleet, anchor: Anchor, workers: list[str]) -> Proc:
    """Start `anchor` in front of `workers`; returns once it routes to all of them."""
    pkg = PACKAGES[anchor.package]
    if stamp(pkg) is None:
        raise RuntimeError(
            f"{anchor.package} {pkg.version} is not installed; run "
            f"`python -m bench.anchors {anchor.package}` (builds {venv_dir(pkg)})"
        )
    port, metrics_port = free_port(), free_port()
    args = anchor.command(venv_python(pkg), workers, port, metrics_port)
    p = await fleet.start(anchor.name, args, port, "/readiness", timeout=60.0)
    await wait_workers(p.url, len(workers))
    return p


# ----------------------------------------------------------------------------------------------
# `python -m bench anchors-smoke`: every installed anchor, then a third-party client, briefly.


async def engine_ttft(urls: list[str]) -> tuple[float, float]:
    """(sum of seconds, count) of vllm:time_to_first_token_seconds over the simulators: the
    engine's own TTFT (arrival at the engine to first token), without network or router."""
    import aiohttp

    from .stats import histogram_sum_count

    total = count = 0.0
    async with aiohttp.ClientSession() as s:
        for u in urls:
            async with s.get(u + "/metrics") as r:
                text = await r.text()
            one_sum, one_count = histogram_sum_count(text, "vllm:time_to_first_token_seconds")
            total += one_sum
            count += one_count
    return total, count


def summarize(
    name: str, version: str, log: Any, stats: list[dict], ttft_engine: float | None
) -> dict[str, Any]:
    """One smoke row from a load-generator log and the simulators' /stats."""
    from .stats import ms, percentile

    ok = [r for r in log.results if r.ok]
    ttfts = [r.ttft for r in ok if r.ttft is not None]
    prompt = sum(s["prompt_tokens"] for s in stats)
    cached = sum(s["cached_tokens"] for s in stats)
    return {
        "router": name,
        "version": version,
        "requests_sent": len(log.sent),
        "requests_ok": len(ok),
        "errors": len(log.sent) - len(ok),
        "engine_hit_rate": round(cached / prompt, 4) if prompt else 0.0,
        "ttft_p50_ms": ms(percentile(ttfts, 50)),
        "ttft_p99_ms": ms(percentile(ttfts, 99)),
        "engine_ttft_mean_ms": ttft_engine,
        "per_replica_requests": [s["requests"] for s in stats],
        "first_errors": sorted({r.error for r in log.results if not r.ok})[:3],
    }


async def _measure(fleet_sims: list[str], run: Any) -> tuple[Any, list[dict], float | None]:
    from .run import fetch_stats, reset

    await reset(fleet_sims)
    s0, c0 = await engine_ttft(fleet_sims)
    out = await run()
    stats = await fetch_stats(fleet_sims)
    s1, c1 = await engine_ttft(fleet_sims)
    mean = round((s1 - s0) / (c1 - c0) * 1000.0, 2) if c1 > c0 else None
    return out, stats, mean


async def _clients(
    urls: list[str],
    router: str,
    rate: float,
    seconds: float,
    log_dir: Path,
    blocked: list[dict[str, str]],
) -> dict[str, dict[str, Any]]:
    """Each installed third-party client once through `router`, sims reset before each."""
    from .run import MODEL
    from .thirdparty import PrefixPromptLoad, SharedPrefixLoad, run_aiperf, run_inference_perf

    runs = {
        "inference-perf": lambda: run_inference_perf(
            router, MODEL, SharedPrefixLoad(rate=rate, seconds=int(seconds)), log_dir / "ip"
        ),
        "aiperf": lambda: run_aiperf(
            router, MODEL, PrefixPromptLoad(rate=rate, seconds=int(seconds)), log_dir / "aiperf"
        ),
    }
    out: dict[str, dict[str, Any]] = {}
    for name, go in runs.items():
        if stamp(PACKAGES[name]) is None:
            blocked.append({"name": name, "error": "not installed"})
            continue
        try:
            res, stats, eng = await _measure(urls, go)
        except RuntimeError as e:
            blocked.append({"name": name, "error": str(e)[-1500:]})
            continue
        prompt = sum(s["prompt_tokens"] for s in stats)
        cached = sum(s["cached_tokens"] for s in stats)
        res["engine_hit_rate"] = round(cached / prompt, 4) if prompt else 0.0
        res["engine_ttft_mean_ms"] = eng
        res["per_replica_requests"] = [s["requests"] for s in stats]
        out[name] = res
    return out


async def smoke(
    sims: int = 3,
    rate: float = 5.0,
    seconds: float = 10.0,
    out_path: Path | None = Path("bench/results/anchors/smoke.json"),
    client: bool = True,
) -> dict[str, Any]:
    """`sims` simulators; our router, then each installed anchor in turn, each sent the same
    system-prompts sequence by our load generator (~rate x seconds requests); then each
    installed third-party client (inference-perf, aiperf) once through our router. Prints one
    line per router and per client; writes `out_path`."""
    from .loadgen import run_load
    from .run import KV_CAPACITY, MODEL, start_sims
    from .workloads import build

    kv = KV_CAPACITY["system-prompts"]
    log_dir = Path("bench/.logs") / f"anchors-smoke-{int(time.time())}"
    rows: list[dict[str, Any]] = []
    blocked: list[dict[str, str]] = []
    third: dict[str, dict[str, Any]] = {}
    count = int(rate * seconds * 1.2) + 20

    def load(url: str) -> Any:
        return lambda: run_load(
            build("system-prompts", count), [url], MODEL, rate, seconds, progress=False
        )

    async with Fleet(log_dir) as fleet:
        urls = await start_sims(fleet, sims, kv, "llama-3.1-70b-h100", 1.0)
        ours = await fleet.start_router("prefix", urls, policy="prefix", kv_capacity=kv)
        log, stats, eng = await _measure(urls, load(ours.url))
        rows.append(summarize("prefix (ours)", "this tree", log, stats, eng))
        _print_row(rows[-1])
        if client:
            third = await _clients(urls, ours.url, rate, seconds, log_dir, blocked)
        await fleet.stop(ours)
        for a in ANCHORS.values():
            if not available(a):
                blocked.append({"name": a.name, "error": f"{a.package} not installed"})
                continue
            try:
                p = await start_anchor(fleet, a, urls)
            except RuntimeError as e:
                blocked.append({"name": a.name, "error": str(e)[-1500:]})
                continue
            log, stats, eng = await _measure(urls, load(p.url))
            rows.append(summarize(a.name, f"{a.package} {version_of(a)}", log, stats, eng))
            _print_row(rows[-1])
            await fleet.stop(p)
    for name, res in third.items():
        ours_row = rows[0]
        print(
            f"third-party client {name} {res['version']} via prefix (ours): "
            f"ok {res['requests_ok']} failed {res['errors']} "
            f"hit {res['engine_hit_rate']:.3f} TTFT p50 {res['ttft_p50_ms']} ms "
            f"p99 {res['ttft_p99_ms']} ms (engine mean {res['engine_ttft_mean_ms']} ms) | "
            f"our loadgen via prefix: TTFT p50 {ours_row['ttft_p50_ms']} ms "
            f"p99 {ours_row['ttft_p99_ms']} ms (engine mean {ours_row['engine_ttft_mean_ms']} ms)"
        )
    for b in blocked:
        print(f"blocked: {b['name']}: {b['error'][:300]}")
    result = {
        "command": f"python -m bench anchors-smoke --sims {sims} --rate {rate:g} "
        f"--seconds {seconds:g}",
        "measured_at": now_utc(),
        "sims": sims,
        "profile": "llama-3.1-70b-h100",
        "kv_capacity_tokens": kv,
        "workload": "system-prompts",
        "rate": rate,
        "seconds": seconds,
        "rows": rows,
        "third_party": third,
        "blocked": blocked,
        "settings": {a.name: [a.policy, *a.settings] for a in ANCHORS.values()},
    }
    if out_path is not None:
        _write_json(out_path, result)
    return result


def _write_json(path: Path, obj: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2) + "\n")


def _print_row(r: dict[str, Any]) -> None:
    print(
        f"{r['router']:<22} {r['version']:<20} ok {r['requests_ok']:>3} failed {r['errors']:>2} "
        f"hit {r['engine_hit_rate']:.3f} TTFT p50 {r['ttft_p50_ms']} ms "
        f"p99 {r['ttft_p99_ms']} ms per-replica {r['per_replica_requests']}",
        flush=True,
    )


def parse_names(argv: list[str] | None = None) -> list[str]:
    """The packages to install: those named, or every one when none is."""
    import argparse

    p = argparse.ArgumentParser(
        prog="python -m bench.anchors", description="install anchors into cached venvs"
    )
    # Checked by hand, not with `choices`: Python 3.11's argparse checks an empty `nargs="*"`
    # positional against `choices` as one value, so a bare `python -m bench.anchors` failed.
    p.add_argument("names", nargs="*", metavar="name", help=", ".join(sorted(PACKAGES)))
    names = p.parse_args(argv).names
    bad = [n for n in names if n not in PACKAGES]
    if bad:
        p.error(f"unknown {', '.join(bad)} (choose from {', '.join(sorted(PACKAGES))})")
    return names or list(PACKAGES)


def _main(argv: list[str] | None = None) -> None:
    for n in parse_names(argv):
        print(n, install(n))


if __name__ == "__main__":
    _main()
