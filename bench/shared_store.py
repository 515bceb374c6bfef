"""`python -m bench shared-store`: what sharing the table through Redis buys (issue 4).

For each workload, on the same fleet shape and request sequence: one router (the reference),
three routers sharing one Redis, and three routers with a local table each. Writes one JSON
per run under bench/results/shared-store/ and the table `shared-store.md` beside them.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from .provenance import machine, stamp
from .report import table
from .run import RunConfig, run

OUT = Path("bench/results/shared-store")
# (router replicas, store): the reference first
SETUPS: tuple[tuple[int, str], ...] = ((1, "local"), (3, "redis"), (3, "local"))
HIT_RATIO_TARGET = 0.97
IMBALANCE_TARGET = 1.3


def name(workload: str, routers: int, store: str) -> str:
    return f"{workload}-{routers}router{'s' if routers > 1 else ''}-{store}"


def verdicts(rows: Sequence[Mapping[str, object]]) -> list[dict[str, object]]:
    """Each run beside the single-router reference of its workload, with the issue's checks."""
    ref = {
        r["workload"]: r["engine_hit_rate"]
        for r in rows
        if r["router_replicas"] == 1 and r["store"] == "local"
    }
    out = []
    for r in rows:
        base = ref.get(r["workload"])
        hit = r["engine_hit_rate"]
        ratio = round(hit / base, 3) if isinstance(hit, float) and base else None
        row = dict(r)
        row["setup"] = f"{r['router_replicas']} x {r['store']}"
        row["hit_ratio"] = ratio
        if r["router_replicas"] != 1 and r["store"] == "redis":
            ok = (ratio is not None and ratio >= HIT_RATIO_TARGET
                  and float(r["imbalance"]) <= IMBALANCE_TARGET)  # type: ignore[arg-type]
            row["verdict"] = "met" if ok else "NOT met"
        else:
            row["verdict"] = "reference" if r["router_replicas"] == 1 else "-"
        out.append(row)
    return out


COLUMNS = (
    ("workload", "workload"),
    ("setup", "routers x store"),
    ("engine_hit_rate", "engine hit rate"),
    ("hit_ratio", "vs 1 router"),
    ("imbalance", "imbalance"),
    ("ttft_p50_ms", "TTFT p50 ms"),
    ("ttft_p99_ms", "TTFT p99 ms"),
    ("errors", "errors"),
    ("redis_round_trips_per_request", "round trips / req"),
    ("redis_timer_round_trips_per_request", "timer trips / req"),
    ("verdict", "hit >= 0.97x and imbalance <= 1.3"),
)


def main(workloads: Sequence[str], rate: float, seconds: float) -> str:
    OUT.mkdir(parents=True, exist_ok=True)
    rows = []
    for workload in workloads:
        for routers, store in SETUPS:
            print(f"== {workload}: {routers} router(s), {store} store, {rate:g} req/s, "
                  f"{seconds:g} s", flush=True)
            res = asyncio.run(run(RunConfig(workload=workload, rate=rate, seconds=seconds,
                                            router_replicas=routers, store=store)))
            res["command"] = (
                f".venv/bin/python -m bench run --workload {workload} --rate {rate:g} "
                f"--seconds {seconds:g} --router-replicas {routers} --store {store}"
            )
            res.update(stamp())
            (OUT / f"{name(workload, routers, store)}.json").write_text(
                json.dumps(res, indent=2) + "\n")
            rows.append(res)
    text = (
        f"# Shared store: {rate:g} req/s, {seconds:g} s per run, 8 simulated replicas\n\n"
        f"Command: `.venv/bin/python -m bench shared-store --rate {rate:g} "
        f"--seconds {seconds:g}`; machine: {machine()}.\n\n"
        + table(verdicts(rows), COLUMNS) + "\n"
    )
    (OUT / "shared-store.md").write_text(text)
    return text
