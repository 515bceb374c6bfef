"""`python -m bench long-point`: one workload at one rate, long, through several router setups.

A `bench compare` point is one 11 s step of a staircase: ~100-250 requests, so its TTFT p99 is
the second or third slowest request, and its repeats send the SAME sequence, so their spread
shows the host's noise, not the workload's. When ours and an anchor differ by a few ms there,
this runs the same workload for longer (default 30 s: ~1,100 requests at 32 req/s) from an
emptied fleet, each setup in turn, round after round, to tell a routing difference from the
luck of one short sample. A setup is a router name (ours, a baseline or an anchor) or
`prefix,key=value[,key=value]`: our router with those settings (RouterSettings fields).
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from pathlib import Path
from typing import Any

import yaml

from .anchors import ANCHORS, start_anchor
from .compare import SESSION_HEADER, settle
from .fleet import Fleet, Proc
from .loadgen import run_load
from .provenance import stamp
from .run import MODEL, fetch_stats, kv_capacity, run_count, run_working_set, start_sims
from .stats import imbalance, percentiles_ms
from .workloads import build

RESULTS = Path("bench/results/long-point")
PROFILE = "llama-3.1-70b-h100"


def parse_setup(setup: str) -> tuple[str, dict[str, Any]]:
    """`prefix,load_slack=64` -> ("prefix", {"load_slack": 64.0}); a bare name -> (name, {})."""
    name, *pairs = setup.split(",")
    settings: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"{setup!r}: settings are key=value")
        settings[key] = yaml.safe_load(value)
    if settings and name in ANCHORS:
        raise ValueError(f"{setup!r}: settings apply to our router only")
    return name, settings


def figures(results: list[Any], stats: list[dict[str, Any]]) -> dict[str, Any]:
    """One run: engine hit rate and imbalance from the simulators, TTFT from the client."""
    ttfts = [r.ttft for r in results if r.ok and r.ttft is not None]
    prompt = sum(s["prompt_tokens"] for s in stats)
    cached = sum(s["cached_tokens"] for s in stats)
    return {
        "requests_ok": len(ttfts),
        "errors": sum(1 for r in results if not r.ok),
        "engine_hit_rate": round(cached / prompt, 4) if prompt else 0.0,
        **percentiles_ms(ttfts),
        "imbalance": round(imbalance([s["requests"] for s in stats]) or 0.0, 3),
    }


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Median and (min, max) of each figure over the runs of one setup."""
    out: dict[str, Any] = {}
    for key in ("engine_hit_rate", "ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms", "imbalance"):
        vals = [r[key] for r in runs if r.get(key) is not None]
        if vals:
            out[key] = {"median": round(statistics.median(vals), 4), "min": min(vals),
                        "max": max(vals)}
    return out


def readme(result: dict[str, Any]) -> str:
    """bench/results/long-point/README.md (pure)."""
    lines = [
        "# Long points: one workload and rate, router setups in turn, round after round",
        "",
        "Written by `python -m bench long-point` (bench/long_point.py says why and how).",
        "",
    ]
    for r in result["points"]:
        lines += [
            f"## {r['workload']} at {r['rate']:g} req/s for {r['seconds']:g} s, "
            f"{r['repeats']} rounds",
            "",
            f"Command: `{r['command']}`. Measured {r['measured_at']} on {r['machine']}.",
            "",
            "| setup | engine hit rate | TTFT p50 ms | TTFT p90 ms | TTFT p99 ms | imbalance | "
            "requests |",
            "|---|---|---|---|---|---|---|",
        ]
        for setup, s in r["summary"].items():
            def cell(key: str, s: dict[str, Any] = s) -> str:
                v = s.get(key)
                return "-" if v is None else f"{v['median']} ({v['min']}-{v['max']})"

            n = "/".join(str(x["requests_ok"]) for x in r["runs"][setup])
            lines.append(f"| {setup} | {cell('engine_hit_rate')} | {cell('ttft_p50_ms')} | "
                         f"{cell('ttft_p90_ms')} | {cell('ttft_p99_ms')} | {cell('imbalance')} "
                         f"| {n} |")
        lines += ["", "Cells: median (min-max) over the rounds.", ""]
    return "\n".join(lines)


async def _start(fleet: Fleet, setup: str, sims: list[str], kv: int, tmp: Path) -> Proc:
    name, settings = parse_setup(setup)
    if name in ANCHORS:
        return await start_anchor(fleet, ANCHORS[name], sims)
    extra: list[str] = []
    if settings:
        path = tmp / f"settings-{abs(hash(setup))}.yaml"
        path.write_text(yaml.safe_dump(settings))
        extra = ["--config", str(path)]
    return await fleet.start_router("router", sims, policy=name, kv_capacity=kv, extra=extra)


async def measure(
    workload: str, rate: float, seconds: float, repeats: int, setups: list[str], log_dir: Path
) -> dict[str, list[dict[str, Any]]]:
    for s in setups:
        parse_setup(s)  # refuse a bad setup before anything starts
    wl = build(workload, run_count(rate, seconds))
    kv = kv_capacity(wl, run_working_set(wl, rate, seconds))
    runs: dict[str, list[dict[str, Any]]] = {s: [] for s in setups}
    async with Fleet(log_dir) as fleet:
        sims = await start_sims(fleet, 8, kv, PROFILE, 1.0)
        for rnd in range(1, repeats + 1):
            for setup in setups:
                print(f"== {workload} at {rate:g} req/s via {setup} (round {rnd}/{repeats})",
                      flush=True)
                proc = await _start(fleet, setup, sims, kv, log_dir)
                try:
                    await settle(sims)
                    log = await run_load(wl, [proc.url], MODEL, rate, seconds, progress=False,
                                         session_header=SESSION_HEADER, drain_timeout=30)
                    stats = await fetch_stats(sims)
                finally:
                    await fleet.stop(proc)
                fig = figures(log.results, stats)
                runs[setup].append(fig)
                print(f"   {fig}", flush=True)
    return runs


def main(workload: str, rate: float, seconds: float, repeats: int,
         setups: list[str], tag: str = "") -> dict[str, Any]:

    log_dir = Path("bench/.logs") / f"long-point-{int(time.time())}"
    log_dir.mkdir(parents=True, exist_ok=True)
    runs = asyncio.run(measure(workload, rate, seconds, repeats, setups, log_dir))
    point = {
        "workload": workload,
        "rate": rate,
        "seconds": seconds,
        "repeats": repeats,
        "runs": runs,
        "summary": {s: summary(r) for s, r in runs.items()},
        "command": (f".venv/bin/python -m bench long-point --workload {workload} --rate "
                    f"{rate:g} --seconds {seconds:g} --repeat {repeats} --setups "
                    + " ".join(f"'{s}'" if "," in s else s for s in setups)),
        **stamp(),
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    if tag:
        point["command"] += f" --tag {tag}"
    name = f"{workload}-{rate:g}" + (f"-{tag}" if tag else "")
    (RESULTS / f"{name}.json").write_text(json.dumps(point, indent=2) + "\n")
    points = [json.loads(p.read_text()) for p in sorted(RESULTS.glob("*.json"))]
    (RESULTS / "README.md").write_text(readme({"points": points}))
    return point
