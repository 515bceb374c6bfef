"""`make bench`: the runs behind bench/results/README.md, re-runnable by anyone.

Each run writes its JSON under bench/results/<group>/ and the README's tables are rebuilt
from every JSON found there, so a partial re-run updates only what it re-measured.
"""

from __future__ import annotations

import asyncio
import json
import platform
import subprocess
import time
from pathlib import Path

from .report import table
from .run import RunConfig, run

RESULTS = Path("bench/results")
RATE = 24.0  # req/s: round-robin's fleet is loaded (p99 climbing) but not saturated
SECONDS = 90.0

ISSUE2 = [
    ("system-prompts", p) for p in ("prefix", "round-robin", "least-loaded", "random", "chwbl")
] + [("unique", p) for p in ("prefix", "least-loaded", "round-robin")]


def _machine() -> str:
    cpu = "unknown cpu"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    cores = subprocess.getoutput("nproc")
    return f"{cpu}, {cores} cores, Python {platform.python_version()}"


def run_group(group: str, runs: list[tuple[str, str]], rate: float, seconds: float) -> None:
    out = RESULTS / group
    out.mkdir(parents=True, exist_ok=True)
    for workload, policy in runs:
        print(f"== {group}: {workload} via {policy} at {rate} req/s for {seconds:.0f}s", flush=True)
        res = asyncio.run(
            run(RunConfig(workload=workload, router=policy, rate=rate, seconds=seconds))
        )
        res["command"] = (
            f".venv/bin/python -m bench run --workload {workload} --router {policy} "
            f"--replicas 8 --rate {rate:g} --seconds {seconds:g}"
        )
        res["measured_at"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        res["machine"] = _machine()
        (out / f"{workload}-{policy}.json").write_text(json.dumps(res, indent=2) + "\n")


def load(group: str) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((RESULTS / group).glob("*.json"))]


def suite(quick: bool = False) -> None:
    seconds = 30.0 if quick else SECONDS
    run_group("routing", ISSUE2, RATE, seconds)
    from .overhead import measure

    print("== overhead", flush=True)
    res = asyncio.run(measure(500, 10 if quick else 20))
    res["command"] = ".venv/bin/python -m bench overhead --rate 500 --seconds 20"
    res["machine"] = _machine()
    (RESULTS / "overhead.json").write_text(json.dumps(res, indent=2) + "\n")
    print("see bench/results/*.json; bench/results/README.md is written by hand from them")


def tables() -> str:
    rows = load("routing")
    parts = []
    for wl in ("system-prompts", "unique"):
        sel = [r for r in rows if r["workload"] == wl]
        if sel:
            parts.append(f"### {wl}\n\n" + table(sel))
    return "\n\n".join(parts)
