"""Where the time to the first chunk goes between the client and the engine.

`python -m bench first-chunk`: the benchmark's own client (bench/loadgen.py) sends
system-prompts requests (streaming chat, ~9 KB bodies), one at a time, to one simulator
(`--profile`, default zero: no simulated time) by three paths:
- `direct`: to the simulator;
- `pipe`: through bench/pipe.py, a byte pipe (the floor of any extra hop in Python here);
- `router`: through our router (policy prefix, one backend).
Paths take turns, request by request within each round (direct, pipe, router, direct, ...), so
a drift of the host falls on all three alike. TTFT is measured as `bench run` measures it: to
the first SSE event with content. The differences split what a hop costs: pipe - direct is the
hop itself, router - pipe what the router does beyond copying bytes. Every request carries an
x-request-id, and the simulator's timestamps of it (GET /stats `timings`) split its TTFT into
to-the-engine, the engine, and back. The router's own view (its /metrics: decision time,
arrival to the upstream's first byte) is read around its turns.

`--background R` adds streaming load from a second client at R req/s through the same router
to a second simulator (profile `fast`), so the sequential probe sees a router that is busy
with other streams, as in a routing run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp

from .fleet import Fleet, free_port
from .loadgen import Result, _one, run_load
from .provenance import stamp
from .run import timings_by_id, ttft_split
from .stats import histogram_sum_count, percentile, percentiles_ms
from .workloads import build, messages_for

MODEL = "sim-zero"
BG_MODEL = "sim-bg"
BACKGROUND_S = 600.0  # longer than any probe; cancelled when the probe ends
PATHS = ("direct", "pipe", "router")
OUT = Path("bench/results/first-chunk")


async def _router_means(http: aiohttp.ClientSession, url: str) -> dict[str, tuple[float, float]]:
    async with http.get(url + "/metrics") as r:
        text = await r.text()
    return {
        "decision": histogram_sum_count(text, "prefix_router_decision_seconds"),
        "upstream_first_byte": histogram_sum_count(text, "prefix_router_ttft_seconds"),
    }


async def probe(
    requests: int,
    rounds: int,
    max_tokens: int,
    background: float,
    log_dir: Path,
    profile: str = "zero",
) -> dict[str, Any]:
    work = build("system-prompts", requests)
    bodies = [messages_for(s, 0, []) for s in work.sessions]
    async with Fleet(log_dir) as fleet:
        sim = await fleet.start_sim(
            "sim-probe", model=MODEL, kv_capacity=1_000_000, profile=profile, time_scale=1.0
        )
        backends = [sim.url]
        if background:
            # a second simulator serving another model: the router sends the background there
            # (it routes by the model each backend serves) and the probe to sim-zero
            bg_sim = await fleet.start_sim(
                "sim-bg", model=BG_MODEL, kv_capacity=1_000_000, profile="fast", time_scale=1.0
            )
            backends.append(bg_sim.url)
        router = await fleet.start_router(
            "router", backends, policy="prefix", kv_capacity=1_000_000
        )
        port = free_port()
        target = sim.url.rsplit(":", 1)[1]
        pipe = await fleet.start(
            "pipe",
            [sys.executable, "-m", "bench.pipe", "--port", str(port), "--target",
             f"127.0.0.1:{target}"],
            port,
            "/health",
        )
        urls = {"direct": sim.url, "pipe": pipe.url, "router": router.url}
        ttfts: dict[str, list[float]] = {p: [] for p in PATHS}
        router_seen = {"decision": [0.0, 0.0], "upstream_first_byte": [0.0, 0.0]}
        bg_task = None
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
            # warm every path: connections, code paths, the simulator's cache of these prompts
            for p in PATHS:
                for msgs in bodies[:20]:
                    await _one(http, urls[p], MODEL, msgs, max_tokens, 30.0)
            if background:
                # built before it starts: building a workload blocks this loop for a while
                bg_work = build("system-prompts", int(background * BACKGROUND_S), seed=11)
                bg_task = asyncio.create_task(
                    run_load(bg_work, [router.url], BG_MODEL, background, BACKGROUND_S,
                             progress=False)
                )
                await asyncio.sleep(2.0)  # let it reach its rate
            sent: dict[str, list[Result]] = {p: [] for p in PATHS}
            for rnd in range(rounds):
                print(f"  round {rnd + 1}/{rounds}: {len(bodies)} requests per path", flush=True)
                for i, msgs in enumerate(bodies):
                    for p in PATHS:
                        before = await _router_means(http, router.url) if p == "router" else None
                        tag = f"{p}-{rnd}-{i}"
                        res, _ = await _one(
                            http, urls[p], MODEL, msgs, max_tokens, 30.0, {"x-request-id": tag}
                        )
                        if not res.ok or res.ttft is None:
                            raise RuntimeError(f"{p}: request failed: {res.status} {res.error}")
                        ttfts[p].append(res.ttft)
                        res.request_id = tag
                        sent[p].append(res)
                        if before is not None:
                            after = await _router_means(http, router.url)
                            for k in router_seen:
                                router_seen[k][0] += after[k][0] - before[k][0]
                                router_seen[k][1] += after[k][1] - before[k][1]
            if bg_task is not None:
                bg_task.cancel()
                await asyncio.gather(bg_task, return_exceptions=True)
            async with http.get(sim.url + "/stats") as r:
                timed = timings_by_id([await r.json()])
    # Each TTFT split where the simulator timed it: to the simulator's handler, the
    # simulator's own part (parse to first chunk written), and back to the client.
    parts: dict[str, dict[str, list[float]]] = {
        p: {"to_engine": [], "engine": [], "back": []} for p in PATHS
    }
    for p in PATHS:
        for res in sent[p]:
            split = ttft_split(res, timed)
            if split is None:
                continue
            parts[p]["to_engine"].append(split["to_engine"])
            parts[p]["engine"].append(
                split["engine_parse"] + split["engine_ttft"] + split["engine_write"]
            )
            parts[p]["back"].append(split["back"])
    figures: dict[str, Any] = {}
    for p in PATHS:
        figures[p] = {"requests": len(ttfts[p]), **percentiles_ms(ttfts[p])}
        figures[p]["ttft_mean_ms"] = round(1000 * sum(ttfts[p]) / len(ttfts[p]), 3)
        for part, values in parts[p].items():
            figures[p][f"{part}_p50_ms"] = round(percentile(values, 50) or 0.0, 3)
    p50 = {p: percentile(ttfts[p], 50) or 0.0 for p in PATHS}
    means = {k: (v[0] / v[1] if v[1] else None) for k, v in router_seen.items()}
    return {
        "command": "python -m bench first-chunk "
        + f"--requests {requests} --rounds {rounds} --max-tokens {max_tokens}"
        + (f" --profile {profile}" if profile != "zero" else "")
        + (f" --background {background:g}" if background else ""),
        **stamp(),
        "max_tokens": max_tokens,
        "profile": profile,
        "background_rps": background,
        "paths": figures,
        "hop_p50_ms": round(1000 * (p50["pipe"] - p50["direct"]), 3),
        "router_beyond_pipe_p50_ms": round(1000 * (p50["router"] - p50["pipe"]), 3),
        "router_added_p50_ms": round(1000 * (p50["router"] - p50["direct"]), 3),
        "router_decision_mean_ms": None if means["decision"] is None
        else round(1000 * means["decision"], 3),
        "router_arrival_to_upstream_first_byte_mean_ms": None
        if means["upstream_first_byte"] is None
        else round(1000 * means["upstream_first_byte"], 3),
    }


def write_readme(out: Path, results: list[dict[str, Any]]) -> None:
    lines = [
        "# Time to the first chunk: client to engine, piece by piece",
        "",
        "Written by `python -m bench first-chunk` (bench/first_chunk.py). The benchmark's",
        "client sends system-prompts requests (streaming chat, ~9 KB bodies) one at a time",
        "to one simulator (`zero`: no simulated time; `fast`: a 2 ms step before the first",
        "token, so the headers and the first chunk come apart, as from an engine): `direct`;",
        "through `pipe`, a byte pipe in Python (bench/pipe.py, the floor of any extra hop on",
        "this host); through our `router`. The paths take turns request by request. TTFT is",
        "to the first SSE event with content, as in `bench run`. `bg24`: meanwhile 24 req/s",
        "of other streams through the router, to a second simulator.",
        "",
        "Each TTFT is split with the simulator's own timestamps (one clock, CLOCK_MONOTONIC):",
        "*to engine* from the client's send to the simulator's handler; *engine* the",
        "simulator, to its first chunk written; *back* from there to the client's first",
        "content. All in ms; split columns are p50s of the parts.",
        "",
        "| run | path | requests | TTFT p50 | p90 | p99 | to engine | engine | back |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        tag = r["tag"]
        for p in PATHS:
            f = r["paths"][p]
            lines.append(
                f"| {tag} | {p} | {f['requests']} | {f['ttft_p50_ms']} | {f['ttft_p90_ms']} "
                f"| {f['ttft_p99_ms']} | {f.get('to_engine_p50_ms')} | {f.get('engine_p50_ms')} "
                f"| {f.get('back_p50_ms')} |"
            )
    lines += [
        "",
        "| run | hop (pipe - direct) p50 | router - pipe p50 | router - direct p50 "
        "| router: decision mean | router: arrival to upstream first byte, mean |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r['tag']} | {r['hop_p50_ms']} | {r['router_beyond_pipe_p50_ms']} "
            f"| {r['router_added_p50_ms']} | {r['router_decision_mean_ms']} "
            f"| {r['router_arrival_to_upstream_first_byte_mean_ms']} |"
        )
    lines += ["", "Runs:", ""]
    for r in results:
        lines.append(f"- {r['tag']}: `{r['command']}` ({r['measured_at']}, {r['machine']})")
    notes = out / "NOTES.md"
    if notes.exists():
        lines += ["", "Reading: [NOTES.md](NOTES.md)."]
    (out / "README.md").write_text("\n".join(lines) + "\n")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--requests", type=int, default=100, help="distinct requests per round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--background", type=float, default=0.0,
                   help="streaming req/s through the router to another simulator meanwhile")
    p.add_argument("--profile", default="zero",
                   help="the probed simulator's timing profile (fast: a 2 ms step before the "
                   "first token, so headers and the first chunk come apart, as from an engine)")
    p.add_argument("--tag", default="baseline", help="name of this run in the results")
    p.add_argument("--out", default=str(OUT))


def main(args: argparse.Namespace) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    res = asyncio.run(
        probe(args.requests, args.rounds, args.max_tokens, args.background,
              Path("bench/.logs") / f"first-chunk-{int(time.time())}", args.profile)
    )
    res["tag"] = args.tag
    (out / f"{args.tag}.json").write_text(json.dumps(res, indent=2) + "\n")
    results = [json.loads(f.read_text()) for f in sorted(out.glob("*.json"))]
    write_readme(out, results)
    print(json.dumps({k: v for k, v in res.items() if k != "paths"}, indent=2))
    for p in PATHS:
        print(p, res["paths"][p])
