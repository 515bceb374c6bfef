"""`python -m bench stream-cpu`: CPU per streamed token of the simulator and of our load
generator, the two ends of every TTFT this harness measures.

Why it exists: every router's TTFT carries the path client -> router -> engine -> router ->
client, and on a 2-core host the simulator writing a burst of tokens and the client reading
them compete with the router for the same cores. Step-aware placement sends a request to an
engine just as its step ends, when that simulator writes its burst, so these costs weigh on
`prefix` more than on the baselines. The before/after pairs in the comments of
sim/engine_sim/server.py and bench/loadgen.py came from ad-hoc scripts on asyncio's own loop;
this command gives the current figures, as bench commands run.

How: one simulator (Llama-3.1-70B profile, time scale 0.1 so a stream is short but still
paced), N concurrent streams of T tokens read by `loadgen._one` (the load generator's own
reader, with its checks), again and again for S seconds. Simulator CPU from /proc, client CPU
from `time.process_time()` of this process (it runs nothing else meanwhile). The client runs
on uvloop, as every `python -m bench` command does: on asyncio's own loop the same reader
took about twice the CPU (30-35 against 15-20 us a token, 2026-12-05).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path
from typing import Any

import aiohttp

from .fleet import Fleet, cpu_seconds
from .loadgen import _one
from .provenance import stamp
from .run import PROFILE

OUT = Path("bench/results/stream-cpu")
MODEL = "sim-cpu"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--streams", type=int, default=16, help="concurrent streams")
    p.add_argument("--tokens", type=int, default=200, help="tokens per stream")
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--json", dest="json_out", default=str(OUT / "result.json"))


def per_token_us(cpu_s: float, tokens: int) -> float:
    return round(cpu_s / tokens * 1e6, 1) if tokens else 0.0


async def measure(streams: int, tokens: int, seconds: float, log_dir: Path) -> dict[str, Any]:
    msgs = [{"role": "user", "content": "hello " * 50}]
    async with Fleet(log_dir) as fleet:
        sim = await fleet.start_sim(
            "sim", model=MODEL, kv_capacity=1_000_000, profile=PROFILE, time_scale=0.1
        )
        assert sim.process is not None
        conn = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=conn) as session:

            async def one() -> int:
                res, answer = await _one(session, sim.url, MODEL, msgs, tokens, 60.0)
                # a stream cut short would make the figures per token look cheaper
                if not res.ok or res.output_tokens != tokens or not answer:
                    raise RuntimeError(f"stream failed or short: {res}")
                return res.output_tokens

            await asyncio.gather(*(one() for _ in range(streams)))  # warm: pools, caches
            sim0, me0 = cpu_seconds(sim.process.pid), time.process_time()
            t0 = time.monotonic()
            done = rounds = 0
            while time.monotonic() - t0 < seconds:
                done += sum(await asyncio.gather(*(one() for _ in range(streams))))
                rounds += 1
            wall = time.monotonic() - t0
            sim_cpu, client_cpu = cpu_seconds(sim.process.pid) - sim0, time.process_time() - me0
    return {
        "streams": streams,
        "tokens_per_stream": tokens,
        "rounds": rounds,
        "tokens": done,
        "wall_s": round(wall, 2),
        "sim_cpu_s": round(sim_cpu, 3),
        "client_cpu_s": round(client_cpu, 3),
        "sim_us_per_token": per_token_us(sim_cpu, done),
        "client_us_per_token": per_token_us(client_cpu, done),
    }


def readme(r: dict[str, Any]) -> str:
    return "\n".join([
        "# CPU per streamed token: simulator and load generator",
        "",
        "Written by `python -m bench stream-cpu` (bench/stream_cpu.py says why and how).",
        "",
        f"Command: `{r['command']}`. Measured {r['measured_at']} on {r['machine']}.",
        "",
        "| streams x tokens | rounds | tokens | simulator us/token | load generator us/token |",
        "|---|---|---|---|---|",
        f"| {r['streams']} x {r['tokens_per_stream']} | {r['rounds']} | {r['tokens']} | "
        f"{r['sim_us_per_token']} | {r['client_us_per_token']} |",
        "",
    ])


def main(args: argparse.Namespace) -> dict[str, Any]:
    log_dir = Path("bench/.logs") / f"stream-cpu-{int(time.time())}"
    r = asyncio.run(measure(args.streams, args.tokens, args.seconds, log_dir))
    r["command"] = (
        f".venv/bin/python -m bench stream-cpu --streams {args.streams} --tokens {args.tokens} "
        f"--seconds {args.seconds:g}"
    )
    r.update(stamp())
    out = Path(args.json_out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(r, indent=2) + "\n")
    (out.parent / "README.md").write_text(readme(r))
    return r
