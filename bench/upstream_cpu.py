"""CPU per request of the forwarding client: aiohttp's ClientSession vs prefix_router.upstream.

CPU time, unlike latency, hardly moves with what else the host is doing, so this answers "is
the hand-written client cheaper" even on a busy 2-core machine.

    .venv/bin/python -m bench.upstream_cpu                      # the two clients, in-process
    .venv/bin/python -m bench.upstream_cpu --router             # + a router process of this tree
    .venv/bin/python -m bench.upstream_cpu --router --router-tree /tmp/exp/wt-old  # of another

Starts one `engine-sim --profile zero` on a free port, then, in this process (uvloop, as the
router runs), sends `--requests` small non-streaming POST /v1/completions (bench/overhead.py's
bodies) at `--concurrency` through (a) aiohttp.ClientSession configured as the router's was,
(b) UpstreamClient; `--rounds` times each, alternating, after a warm-up. It reports
`time.process_time()` per request of this process: the client's CPU plus the loop's, with the
same load generator around both.

With `--router`, also the CPU per request of a router process (utime + stime from /proc) in
front of the same simulator, the requests sent by UpstreamClient: the whole router, server side
included. `--router-tree DIR` runs that router from another checkout (PYTHONPATH=DIR/router),
to compare commits.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp

from prefix_router.upstream import UpstreamClient

from .fleet import Fleet
from .overhead import _body, start_zero_sim

HEADERS = {"Content-Type": "application/json"}
PATH = "/v1/completions"

Send = Callable[[bytes], Awaitable[int]]


def _aiohttp_session() -> aiohttp.ClientSession:
    # the router's forwarding session before prefix_router.upstream (app.py's lifecycle)
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(
            limit=0, limit_per_host=0, keepalive_timeout=60, enable_cleanup_closed=True
        ),
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=2.0, sock_read=300.0),
        auto_decompress=False,
        skip_auto_headers=("User-Agent",),
    )


async def _drive(send: Send, n: int, concurrency: int, seed: int) -> tuple[float, float, int]:
    """(CPU seconds of this process, wall seconds, non-200 answers) for `n` requests."""
    rng = random.Random(seed)
    bodies = [_body(rng) for _ in range(n)]
    it = iter(bodies)
    bad = 0

    async def worker() -> None:
        nonlocal bad
        for body in it:
            if await send(body) != 200:
                bad += 1

    c0, w0 = time.process_time(), time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.process_time() - c0, time.perf_counter() - w0, bad


def _aiohttp_sender(session: aiohttp.ClientSession, url: str) -> Send:
    async def send(body: bytes) -> int:
        async with session.post(url + PATH, data=body, headers=HEADERS) as r:
            await r.read()
            return r.status

    return send


def _upstream_sender(client: UpstreamClient, url: str) -> Send:
    async def send(body: bytes) -> int:
        async with await client.post(url, PATH, body, HEADERS) as r:
            await r.read()
            return r.status

    return send


def _proc_cpu(pid: int) -> float:
    """utime + stime of `pid`, in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _row(name: str, n: int, cpu: float, wall: float, bad: int, sim_cpu: float) -> dict[str, Any]:
    row = {
        "client": name,
        "requests": n,
        "cpu_us_per_request": round(cpu / n * 1e6, 1),
        "sim_cpu_us_per_request": round(sim_cpu / n * 1e6, 1),
        "wall_s": round(wall, 2),
        "rps": round(n / wall, 1),
        "non_200": bad,
    }
    print(
        f"  {name:>9}: {row['cpu_us_per_request']:7.1f} us CPU/request (the simulator's "
        f"{row['sim_cpu_us_per_request']:.1f}), {row['rps']:8.1f} req/s"
        f"{f', {bad} not 200' if bad else ''}",
        flush=True,
    )
    return row


async def run(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {"requests": args.requests, "concurrency": args.concurrency}
    async with Fleet(Path("bench/.logs") / f"upstream-cpu-{int(time.time())}") as fleet:
        sim_proc = await start_zero_sim(fleet)
        sim, sim_pid = sim_proc.url, sim_proc.process.pid
        session = _aiohttp_session()
        client = UpstreamClient(2.0, 300.0)
        senders = {
            "aiohttp": _aiohttp_sender(session, sim),
            "upstream": _upstream_sender(client, sim),
        }
        try:
            for send in senders.values():
                await _drive(send, args.warmup, args.concurrency, 0)
            rows = []
            for k in range(args.rounds):
                print(f"round {k + 1}/{args.rounds}", flush=True)
                order = list(senders) if k % 2 == 0 else list(reversed(senders))
                for name in order:
                    sim0 = _proc_cpu(sim_pid)
                    cpu, wall, bad = await _drive(
                        senders[name], args.requests, args.concurrency, k + 1
                    )
                    sim_cpu = _proc_cpu(sim_pid) - sim0
                    rows.append(_row(name, args.requests, cpu, wall, bad, sim_cpu))
            out["rounds"] = rows
            for name in senders:
                mine = [r["cpu_us_per_request"] for r in rows if r["client"] == name]
                out[f"{name}_cpu_us_per_request"] = round(min(mine), 1)
            a, u = out["aiohttp_cpu_us_per_request"], out["upstream_cpu_us_per_request"]
            out["client_cpu_cut"] = round(1 - u / a, 3)
            print(
                f"best of each: aiohttp {a} us, upstream {u} us: {1 - u / a:.0%} less", flush=True
            )
            if args.router:
                out["router"] = await _router_cpu(fleet, sim, sim_pid, client, args)
        finally:
            await session.close()
            await client.close()
    return out


async def _router_cpu(
    fleet: Fleet, sim: str, sim_pid: int, client: UpstreamClient, args: argparse.Namespace
) -> dict[str, Any]:
    env = None
    tree = args.router_tree
    if tree:
        env = {"PYTHONPATH": os.pathsep.join([f"{tree}/router", f"{tree}/sim", tree])}
    router = await fleet.start_router(
        "router", [sim], policy="prefix", kv_capacity=1_000_000, env=env
    )
    send = _upstream_sender(client, router.url)
    await _drive(send, args.warmup, args.concurrency, 0)
    pid = router.process.pid
    per = []
    for k in range(args.rounds):
        before, sim0 = _proc_cpu(pid), _proc_cpu(sim_pid)
        _, wall, bad = await _drive(send, args.requests, args.concurrency, k + 1)
        cpu, sim_cpu = _proc_cpu(pid) - before, _proc_cpu(sim_pid) - sim0
        row = _row("router", args.requests, cpu, wall, bad, sim_cpu)
        per.append(row["cpu_us_per_request"])
    await fleet.stop(router)
    return {"tree": tree or str(Path.cwd()), "cpu_us_per_request": per, "best": min(per)}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.upstream_cpu", description=__doc__)
    p.add_argument("--requests", type=int, default=20000)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--warmup", type=int, default=1000)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--router", action="store_true", help="also a router process's CPU/request")
    p.add_argument("--router-tree", help="the checkout that router runs from (default: this)")
    p.add_argument("--no-uvloop", action="store_true")
    p.add_argument("--json", dest="json_out")
    args = p.parse_args(argv)
    if args.router_tree:
        args.router_tree = str(Path(args.router_tree).resolve())
    if not args.no_uvloop:
        import uvloop

        uvloop.install()
    out = asyncio.run(run(args))
    out.update(loop="asyncio" if args.no_uvloop else "uvloop", python=sys.version.split()[0])
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
