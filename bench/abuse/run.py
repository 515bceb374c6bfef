"""One round: a router (local or Redis store) over simulators behind the tap; the attack, then
the faults under ordinary load (each waited on through /readyz, and undone), then the cost."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from bench.harness.fleet import Fleet, free_port, memory_of
from bench.harness.promtext import sample_sum
from bench.harness.stats import percentile
from bench.provenance import now_utc
from prefix_router.config import INDEX_ENTRY_BYTES

from . import cases as C
from .client import run_cases

MODEL, SIMS, SILENT = "abuse-model", 3, 800
SIM = {"model": MODEL, "kv_capacity": 2_000_000, "profile": "fast", "time_scale": 1.0}
# The router's defaults but for timeouts short enough for a run of minutes and an index budget
# small enough for the flood to reach.
ROUTER: dict[str, Any] = {
    "keepalive_timeout_s": 5.0, "body_timeout_s": 8.0, "first_token_budget_s": 2.0,
    "upstream_timeout_s": 10.0, "index_memory_mb": 32.0, "shutdown_timeout_s": 10.0,
    "log_level": "debug", "health": {"probe_interval_s": 0.5, "readmit_after_s": 2.0,
                                     "stall_after_s": 2.0}}
PARALLEL = {"body size": 6, "prompt over max_model_len": 6, "many connections": 200}


def figures(pid: int) -> dict[str, float]:
    """RSS and peak RSS (MB) of the router with its body-parsing worker (the pod's limit counts
    both), and its open descriptors."""
    return memory_of(pid) | {"fds": len(os.listdir(f"/proc/{pid}/fd"))}


async def watch(
    url: str, pid: int, stop: asyncio.Event, started: asyncio.Event | None = None
) -> dict[str, Any]:
    """/healthz every 50 ms from a process of its own (tap.py --probe) until `stop`, and the
    router's most open descriptors. `started` is set once the first probe has answered."""
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bench.abuse.tap", "--probe", url, stdout=subprocess.PIPE)
    ms, failures, fds = list[float](), 0, 0
    while not stop.is_set() and (line := await child.stdout.readline()):  # type: ignore
        took, ok = line.split()
        ms += [float(took) * 1e3] if ok == b"1" else []
        failures += ok != b"1"
        if started is not None:
            started.set()
        fds = max(fds, len(os.listdir(f"/proc/{pid}/fd")))
    child.kill()
    await child.wait()
    out = {"p50_ms": percentile(ms, 50), "p99_ms": percentile(ms, 99), "max_ms": max(ms or [0])}
    return {"n": len(ms), "failures": failures, "most_fds": fds,
            **{k: v and round(v, 1) for k, v in out.items()}}


async def get(s: aiohttp.ClientSession, url: str) -> str:  # "" if none came
    with contextlib.suppress(aiohttp.ClientError, TimeoutError, OSError):
        async with s.get(url, timeout=aiohttp.ClientTimeout(total=5)) as r:
            return await r.text()
    return ""


async def ready(s: aiohttp.ClientSession, url: str, key: str, value: Any) -> bool:
    return json.loads(await get(s, url + "/readyz") or "{}").get(key) == value


async def wait_for(check: Callable[[], bool | Awaitable[bool]], what: str,
                   timeout: float = 60) -> float:
    """Seconds until `check` holds; TimeoutError if it does not within `timeout`."""
    t0 = time.monotonic()
    while not (await r if inspect.isawaitable(r := check()) else r):
        if time.monotonic() - t0 > timeout:
            raise TimeoutError(f"{what}: not within {timeout:g}s")
        await asyncio.sleep(0.1)
    return round(time.monotonic() - t0, 2)


def judge_load(results: list[dict[str, Any]], allowed: set[int]) -> dict[str, dict[str, Any]]:
    """Per phase: answered whole, failed as the fault allows (`allowed`: ids the tap saw held
    or cut), or failed: the router's failure (and how many of those were 5xx)."""
    out: dict[str, dict[str, Any]] = {}
    for r in results:
        p = out.setdefault(r["phase"], {"whole": 0, "allowed": 0, "failed": 0, "five_xx": 0,
                                        "statuses": {}})
        p["statuses"][r["status"]] = p["statuses"].get(r["status"], 0) + 1
        p["whole" if r["whole"] else "allowed" if r["rid"] in allowed else "failed"] += 1
        p["five_xx"] += not r["whole"] and r["rid"] not in allowed and r["status"][:1] == "5"
    return out


async def faults(fleet: Fleet, s: aiohttp.ClientSession, url: str, taps: list[str], marker: str,
                 redis_url: str | None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Under ordinary load (8 requests a second, ids for the tap): the engine it reaches most
    hung (until 40 answers after its ejection), another killed, Redis killed; each undone."""
    stop, phase, results, out = asyncio.Event(), ["before"], list[dict[str, Any]](), {}

    async def one(rid: int) -> None:  # an ordinary request: four system prompts, half streamed
        stream, res = (rid // 4) % 2 == 0, {"rid": rid, "phase": phase[0], "whole": False}
        body = {"model": MODEL, "max_tokens": 16, "stream": stream, "messages": [
            {"role": "system", "content": f"You are assistant number {rid % 4}. " * 40},
            {"role": "user", "content": f"{marker} rid-{rid} what now?"}]}
        try:
            async with s.post(url + C.CHAT, json=body, timeout=aiohttp.ClientTimeout(60)) as r:
                data = await r.read()
            error = stream and b'"error"' in data
            res["status"] = f"{r.status}{' + error event' if error else ''}"
            res["whole"] = r.status == 200 and not error and (
                data.rstrip().endswith(b"[DONE]") if stream else "choices" in json.loads(data))
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
            res["status"] = type(exc).__name__
        results.append(res)

    async def load() -> None:  # open loop, 8 a second until `stop`, then every answer awaited
        sent: list[asyncio.Task[None]] = []
        while not stop.is_set():
            sent.append(asyncio.create_task(one(len(sent))))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.125)
        await asyncio.gather(*sent)

    async def answered(n: int) -> None:
        start = len(results)
        await wait_for(lambda: len(results) - start >= n, f"{n} answers, {phase[0]}", 120)

    async def fault(name: str, do: Awaitable[Any], undo: Callable[[], Awaitable[Any]], key: str,
                    values: tuple[Any, Any], answers: int = 0) -> None:
        phase[0] = name
        await do
        out[name] = {"seen_s": await wait_for(lambda: ready(s, url, key, values[0]), name)}
        await answered(answers)
        phase[0] = f"{name}: undone"
        await undo()
        out[name]["back_s"] = await wait_for(lambda: ready(s, url, key, values[1]), "undone")

    async def hang(what: str) -> None:
        async with s.post(f"{taps[hung]}/_tap/{what}") as r:
            r.raise_for_status()

    task = asyncio.create_task(load())
    try:
        await answered(20)
        seen = [len(json.loads(await get(s, t + "/_tap/records"))["seen"]) for t in taps]
        hung, backends = seen.index(max(seen)), ("healthy_backends", (SIMS - 1, SIMS))
        await fault("engine hung", hang("hang"), lambda: hang("unhang"), *backends, 40)
        sim = fleet.proc(f"sim{(hung + 1) % SIMS}")
        await fault("engine killed", fleet.stop(sim, "kill"), lambda: fleet.start_sim(
            f"{sim.name}-restarted", **SIM, port=int(sim.url.split(":")[-1])), *backends)
        if redis_url:
            port = int(redis_url.split(":")[-1].split("/")[0])
            await fault("redis killed", fleet.stop(fleet.proc("redis"), "kill"), lambda: (
                fleet.start_redis("redis-back", port=port)), "store", ("degraded", "ok"), 20)
        phase[0] = "after the faults"
        await answered(20)
    finally:  # a fault the router did not see fails the round
        stop.set()
        await task
    return out, results


async def run_round(store: str, log_dir: Path) -> dict[str, Any]:
    log_dir = log_dir / store
    marker, tag = "PLANTED-" + secrets.token_hex(6), "HDRTAG-" + secrets.token_hex(6)
    canary_hits = []  # connections to a port only the bench listens on
    canary = await asyncio.start_server(lambda _r, w: canary_hits.append(w.close()), "127.0.0.1")
    async with canary, Fleet(log_dir) as fleet, aiohttp.ClientSession() as s:
        started = now_utc()
        sims = [await fleet.start_sim(f"sim{i}", **SIM) for i in range(SIMS)]
        ports, cfg, port = [free_port() for _ in sims], log_dir / "router.yaml", free_port()
        metrics = f"http://127.0.0.1:{free_port()}/metrics"
        taps = [f"http://127.0.0.1:{p}" for p in ports]
        pairs = [f"{p}={sim.url}" for p, sim in zip(ports, sims, strict=True)]
        await fleet.start("tap", [sys.executable, "-m", "bench.abuse.tap", *pairs], ports[-1],
                          "/_tap/records")
        settings = {**ROUTER, "discovery": {"backends": taps}}
        if redis_url := await fleet.start_redis() if store == "redis" else None:
            settings.update(store={"mode": "redis", "url": redis_url}, model_key="abuse")
        cfg.write_text(yaml.safe_dump(settings))
        router = await fleet.start("router", [
            sys.executable, "-m", "prefix_router", "--config", str(cfg), "--port", str(port),
            "--metrics-port", metrics.split(":")[-1].split("/")[0]], port, "/readyz")
        await wait_for(lambda: ready(s, router.url, "healthy_backends", SIMS), "engines ready")
        private = [u.split("//")[1] for u in taps + [sim.url for sim in sims]]
        canary_at = f"127.0.0.1:{canary.sockets[0].getsockname()[1]}"
        ctx, before = C.Ctx(MODEL, marker, tag, 8 * C.MiB, canary_at), figures(router.process.pid)
        # the attack: class by class, while the slow clients and silent connections go on
        stop, cases = asyncio.Event(), C.attack(ctx)
        slow = asyncio.create_task(run_cases(C.slow(ctx, ROUTER["keepalive_timeout_s"], ROUTER[
            "body_timeout_s"], SILENT), port, private, SILENT + 100))
        watching = asyncio.create_task(watch(router.url, router.process.pid, stop))
        outcomes = []
        for cls in dict.fromkeys(c.cls for c in cases):
            outcomes += await run_cases([c for c in cases if c.cls == cls], port, private,
                                        PARALLEL.get(cls, 16))
        outcomes += await slow
        stop.set()
        healthz = await watching
        entries = sample_sum(await get(s, metrics), "prefix_router_table_entries")
        fault, results = await faults(fleet, s, router.url, taps, marker, redis_url)
        after = figures(router.process.pid)
        records = [json.loads(await get(s, t + "/_tap/records")) for t in taps]
    probes = {int(k): v for b in records for k, v in b["probes"].items()}
    hop = {c.name: c for c in cases if c.probe is not None}
    for o in outcomes:
        o.problems += C.check_probe(hop[o.case], probes) if o.case in hop else []
    log = router.log_path.read_text(errors="replace")
    error_lines = [x for x in log.splitlines() if " ERROR " in x or " CRITICAL " in x]
    return {
        "store": store, "started": started, "settings": ROUTER,
        "outcomes": [o.__dict__ for o in outcomes], "faults": fault,
        "load": judge_load(results, {r for b in records for r in b["held"] + b["cut"]}),
        "healthz": healthz, "canary_connections": len(canary_hits),
        "router": {"before": before, "after": after},
        "index": {"entries": entries, "bound": max(1000, int(
            ROUTER["index_memory_mb"] * C.MiB / INDEX_ENTRY_BYTES))},
        "log": {"lines": log.count("\n"), "tracebacks": log.count("Traceback (most recent"),
                "error_lines": len(error_lines), "first_errors": error_lines[:5],
                "markers": log.count(marker) + log.count(tag)},
    }
