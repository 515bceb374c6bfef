"""`python -m bench client-check`: one request sequence, two clients, the same router.

Issue 5 asks that TTFT measured by a client nobody on this project wrote stand beside ours, and
that a disagreement be explained. `bench compare` runs inference-perf on its own `shared_prefix`
data (uniform groups, other prompts), so its figures differ from our load generator's for a
reason that is not the clients. Here both clients send the SAME requests, in the same order, at
the same Poisson rate, through the same router, to a fleet reset before each:
- ours: bench/loadgen.py with `api="completions"`;
- inference-perf: its `shareGPT` data type reading a local file of those prompts
  (bench/thirdparty.py `run_inference_perf_file`).
Each prompt is what the simulator's chat template makes of the workload's messages, so the
engines do the same work as in our chat runs. Per client: the engines' own figures (hit rate,
TTFT from arrival at the engine to first token, p50/p90/p99 from the simulators' `/stats`) beside
the client's TTFT; the client's TTFT less the engines' is what the client, the router and the
network add. Two clients agree when they see the same engine work and add about the same.

Single-turn workloads only (a multi-turn request depends on the answers before it, which a
pre-written file cannot carry).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from pathlib import Path
from typing import Any

from engine_sim.chat import render_chat

from .compare import _git_version, router_info, settle, start_router
from .fleet import Fleet
from .loadgen import run_load
from .provenance import stamp
from .run import KV_CAPACITY, MODEL, fetch_stats, start_sims
from .stats import percentiles_ms
from .workloads import Workload, build, messages_for

RESULTS = Path("bench/results/client-check")
PROFILE = "llama-3.1-70b-h100"


def requests_of(wl: Workload, n: int) -> tuple[Workload, list[tuple[str, int]]]:
    """The first `n` sessions of a single-turn workload, and each one's (prompt, max_tokens)."""
    if any(len(s.turns) != 1 for s in wl.sessions[:n]):
        raise ValueError(f"{wl.name}: client-check needs a single-turn workload")
    if len(wl.sessions) < n:
        raise ValueError(f"{wl.name}: {len(wl.sessions)} sessions, {n} asked for")
    part = dataclasses.replace(wl, sessions=wl.sessions[:n])
    return part, [(render_chat(messages_for(s, 0, [])), s.turns[0].max_tokens)
                  for s in part.sessions]


def engine_figures(stats: list[dict[str, Any]]) -> dict[str, Any]:
    """The engines' own figures since their last reset."""
    prompt = sum(s["prompt_tokens"] for s in stats)
    cached = sum(s["cached_tokens"] for s in stats)
    ttfts = [t for s in stats for t in s.get("ttft_s", ())]
    return {
        "engine_requests": sum(s["requests"] for s in stats),
        "engine_hit_rate": round(cached / prompt, 4) if prompt else 0.0,
        **percentiles_ms(ttfts, "engine_ttft"),
    }


def added(row: dict[str, Any]) -> dict[str, Any]:
    """What the client, the router and the network add to the engines' TTFT, per percentile."""
    out: dict[str, Any] = {}
    for q in ("p50", "p90", "p99"):
        c, e = row.get(f"ttft_{q}_ms"), row.get(f"engine_ttft_{q}_ms")
        out[f"added_{q}_ms"] = None if c is None or e is None else round(c - e, 2)
    return out


def verdict(ours: dict[str, Any], theirs: dict[str, Any], tolerance: float = 0.05) -> str:
    """Whether the two clients' TTFT p50 agree within `tolerance`, and if not, whether the
    engines saw different work (hit rate, engine TTFT) or the clients added different time."""
    a, b = ours.get("ttft_p50_ms"), theirs.get("ttft_p50_ms")
    if not a or not b:
        return "no figures to compare"
    ratio = b / a
    if abs(ratio - 1.0) <= tolerance:
        return f"agree: inference-perf's TTFT p50 is {ratio:.3f} x ours"
    ea, eb = ours.get("engine_ttft_p50_ms"), theirs.get("engine_ttft_p50_ms")
    if ea and eb and abs(eb / ea - ratio) < abs(ratio - 1.0) / 2:
        return (f"disagree ({ratio:.3f} x ours) and so do the engines ({eb / ea:.3f} x): "
                "the two runs gave the engines different work (arrival times, hits)")
    return (f"disagree ({ratio:.3f} x ours), the engines less so: the clients add different "
            f"time (added p50 {ours.get('added_p50_ms')} vs {theirs.get('added_p50_ms')} ms)")


async def check(
    workload: str, routers: list[str], rate: float, n: int, log_dir: Path
) -> list[dict[str, Any]]:
    from .thirdparty import _installed, run_inference_perf_file

    _installed("inference-perf")  # before any run: says how to install it
    wl, prompts = requests_of(build(workload, n), n)
    kv = KV_CAPACITY[workload]
    rows: list[dict[str, Any]] = []
    async with Fleet(log_dir) as fleet:
        sims = await start_sims(fleet, 8, kv, PROFILE, 1.0)
        for router in routers:
            for client in ("loadgen", "inference-perf"):
                print(f"== {workload}: {client} via {router}, {n} requests at {rate:g} req/s",
                      flush=True)
                procs = await start_router(fleet, router, sims, kv)
                try:
                    clean = await settle(sims)
                    url = procs[0].url
                    if client == "loadgen":
                        log = await run_load(wl, [url], MODEL, rate, n / rate * 3 + 30,
                                             progress=False, api="completions")
                        ok = [r for r in log.results if r.ok]
                        res: dict[str, Any] = {
                            "client": "loadgen",
                            "requests_ok": len(ok),
                            "errors": len(log.sent) - len(ok),
                            **percentiles_ms([r.ttft for r in ok if r.ttft is not None]),
                        }
                    else:
                        res = await run_inference_perf_file(
                            url, MODEL, prompts, rate, log_dir / f"inference-perf-{router}",
                            timeout=n / rate + 300)
                    stats = await fetch_stats(sims)
                finally:
                    for p in procs:
                        await fleet.stop(p)
                row = {"workload": workload, "router": router, "rate": rate, "requests": n,
                       **res, **engine_figures(stats), "caches_emptied_before": clean}
                row.update(added(row))
                rows.append(row)
                print(f"   TTFT p50 {row['ttft_p50_ms']} ms, engine p50 "
                      f"{row['engine_ttft_p50_ms']} ms, engine hit {row['engine_hit_rate']}, "
                      f"{row['requests_ok']} ok, {row['engine_requests']} at the engines",
                      flush=True)
    return rows


def ratio_lines(rows: list[dict[str, Any]]) -> list[str]:
    """Per client, the first router's TTFT p50 over each other router's (client and engine)."""
    routers = list(dict.fromkeys(r["router"] for r in rows))
    out = []
    for client in dict.fromkeys(r["client"] for r in rows):
        by = {r["router"]: r for r in rows if r["client"] == client}
        first = by.get(routers[0])
        for other in routers[1:]:
            o = by.get(other)
            if not first or not o or not o.get("ttft_p50_ms") or not o.get("engine_ttft_p50_ms"):
                continue
            out.append(
                f"- {client}: `{routers[0]}` / `{other}` = "
                f"{first['ttft_p50_ms'] / o['ttft_p50_ms']:.3f} at the client, "
                f"{first['engine_ttft_p50_ms'] / o['engine_ttft_p50_ms']:.3f} at the engines")
    return out


def readme(result: dict[str, Any]) -> str:
    """bench/results/client-check/README.md from the run's JSON (pure)."""
    lines = [
        "# Two clients, one request sequence (issue 5)",
        "",
        "Written by `python -m bench client-check` (bench/client_check.py, which says how).",
        f"Command: `{result['command']}`. Measured {result['measured_at']} on "
        f"{result['machine']}. Client: inference-perf {result.get('inference_perf', '-')}.",
        "",
        "Both clients send the same requests in the same order (streaming completions, the",
        f"first {result['requests']} of `{result['workload']}`) at Poisson "
        f"{result['rate']:g} req/s through the same router",
        "to 8 simulators emptied before each run. Engine figures are the simulators' own;",
        "`added` = client TTFT - engine TTFT, at the same percentile (what the client, the",
        "router and the network add).",
        "",
        "| router | client | ok | engine requests | engine hit | TTFT p50 | p90 | p99 | "
        "engine TTFT p50 | p90 | p99 | added p50 | added p99 |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        cells = [r["router"], r["client"], r.get("requests_ok"), r.get("engine_requests"),
                 r.get("engine_hit_rate"), r.get("ttft_p50_ms"), r.get("ttft_p90_ms"),
                 r.get("ttft_p99_ms"), r.get("engine_ttft_p50_ms"), r.get("engine_ttft_p90_ms"),
                 r.get("engine_ttft_p99_ms"), r.get("added_p50_ms"), r.get("added_p99_ms")]
        lines.append("| " + " | ".join("-" if c is None else str(c) for c in cells) + " |")
    lines += ["", "Verdicts (TTFT p50, inference-perf against ours, same router):", ""]
    lines += [f"- `{router}`: {v}" for router, v in result["verdicts"].items()]
    ratios = ratio_lines(result["rows"])
    if ratios:
        lines += ["", "Each client's own TTFT p50 ratio of the first router to each other one:", ""]
        lines += ratios
    return "\n".join(lines) + "\n"


def main(workload: str, routers: list[str], rate: float, n: int) -> dict[str, Any]:
    from .anchors import PACKAGES

    log_dir = Path("bench/.logs") / f"client-check-{int(time.time())}"
    rows = asyncio.run(check(workload, routers, rate, n, log_dir))
    verdicts = {}
    for router in routers:
        pair = {r["client"]: r for r in rows if r["router"] == router}
        if len(pair) == 2:
            verdicts[router] = verdict(pair["loadgen"], pair["inference-perf"])
    result = {
        "workload": workload,
        "rate": rate,
        "requests": n,
        "routers": {r: router_info(r, _git_version()) for r in routers},
        "inference_perf": PACKAGES["inference-perf"].version,
        "rows": rows,
        "verdicts": verdicts,
        "command": (f".venv/bin/python -m bench client-check --workload {workload} --routers "
                    f"{' '.join(routers)} --rate {rate:g} --requests {n}"),
        **stamp(),
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{workload}.json").write_text(json.dumps(result, indent=2) + "\n")
    (RESULTS / "README.md").write_text(readme(result))
    return result
