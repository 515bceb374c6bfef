"""How soon a router finds an engine emptied behind its address (issue 38, part 3).

    python -m bench.reset_detect [--event reset|restart|sleep] [--signal vitals|answers]
        [--engines 4] [--seconds 30] [--rate 6] [--json FILE]

Simulators (no KV events: the router's index is its decisions, `corrected`), one router, the
workload `system-prompts` at --rate. A third of the way in, the engine that served the most
so far is emptied in place: its prefix cache reset (/reset_prefix_cache), the process killed
and started again on its port, or put to sleep. The figure is the time from that event to the
router's drop of its entries (prefix_router_engine_cache_drops_total, polled every 50 ms), and
the signal that fired (`ejected`: the router took it out of rotation first, which drops its
entries as well; for a restart, the time includes the new process's start).
--signal answers: the router scrapes no /metrics after its first, so only the answers' cached
tokens (far below prediction on most of the last few) can tell.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from .harness import capacity
from .harness.fleet import Fleet, Proc
from .harness.loadgen import run_load
from .harness.promtext import sample_sum
from .harness.workloads import build
from .provenance import publish
from .runner import MODEL

PROFILE = "llama-3.1-70b-h100"
REASONS = ("restart", "reset", "sleep", "wake", "shortfall")


async def drops(http: aiohttp.ClientSession, metrics: str, backend: str) -> dict[str, float]:
    """The router's drops of the backend's entries so far (`metrics`: its /metrics page), by
    reason; `ejected`: 1 while it is out of rotation (an ejection drops its entries too:
    backends.py)."""
    async with http.get(metrics) as r:
        page = await r.text()
    out = {why: sample_sum(page, "prefix_router_engine_cache_drops_total", backend=backend,
                           reason=why) for why in REASONS}  # fmt: skip
    out["ejected"] = 1 - sample_sum(page, "prefix_router_backend_healthy", backend=backend)
    return out


async def busiest(http: aiohttp.ClientSession, sims: list[Proc]) -> Proc:
    served = []
    for p in sims:
        async with http.get(p.url + "/stats") as r:
            served.append(((await r.json())["requests"], p))
    return max(served, key=lambda x: x[0])[1]


async def empty(fleet: Fleet, http: aiohttp.ClientSession, sim: Proc, event: str) -> None:
    if event == "restart":
        await fleet.restart(sim)
        return
    path = "/reset_prefix_cache" if event == "reset" else "/sleep?level=1"
    async with http.post(sim.url + path) as r:
        r.raise_for_status()


async def run(a: argparse.Namespace) -> dict[str, Any]:
    wl = build(a.workload, capacity.run_count(a.rate, a.seconds) + 50)
    kv = capacity.kv_capacity(wl, wl.working_set_tokens)
    settings: dict[str, Any] = {"index": "corrected", "cached_tokens_reported": True}
    if a.signal == "answers":
        settings["health"] = {"metrics_poll_interval_s": 3600}
    async with Fleet(Path(tempfile.mkdtemp(prefix="reset-detect-"))) as fleet:
        sims = list(await asyncio.gather(*(fleet.start_sim(
            f"sim{k}", model=MODEL, kv_capacity=kv, profile=PROFILE, time_scale=1.0,
            extra=["--enable-prompt-tokens-details"]) for k in range(a.engines))))
        path = fleet.log_dir / "router.yaml"
        path.write_text(yaml.safe_dump(settings))
        router = await fleet.start_router("router", [p.url for p in sims], policy="prefix",
                                          kv_capacity=kv, extra=["--config", str(path)])
        load = asyncio.create_task(run_load(wl, [router.url], MODEL, a.rate, a.seconds,
                                            progress=False))
        async with aiohttp.ClientSession() as http:
            await asyncio.sleep(a.seconds / 3)
            target = await busiest(http, sims)
            before = await drops(http, router.metrics, target.url)
            t0 = time.monotonic()
            await empty(fleet, http, target, a.event)
            detected, reason = None, None
            deadline = t0 + a.seconds
            while time.monotonic() < deadline:
                now = await drops(http, router.metrics, target.url)
                fired = [why for why in (*REASONS, "ejected") if now[why] > before[why]]
                if fired:
                    detected, reason = round(time.monotonic() - t0, 3), fired[0]
                    break
                await asyncio.sleep(0.05)
            if a.event == "sleep":
                async with http.post(target.url + "/wake_up") as r:
                    r.raise_for_status()
        log = await load
    return {"event": a.event, "signal": a.signal, "engines": a.engines, "rate": a.rate,
            "seconds": a.seconds, "workload": a.workload, "kv_capacity_tokens": kv,
            "detect_s": detected, "reason": reason, "requests": len(log.results),
            "errors": sum(not x.ok for x in log.results)}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.reset_detect", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--event", choices=("reset", "restart", "sleep"), default="reset")
    p.add_argument("--signal", choices=("vitals", "answers"), default="vitals")
    p.add_argument("--engines", type=int, default=4)
    p.add_argument("--seconds", type=float, default=30.0, help="of load in all")
    p.add_argument("--rate", type=float, default=6.0, help="requests/s")
    p.add_argument("--workload", default="system-prompts")
    p.add_argument("--json", type=Path, help="write the result here")
    a = p.parse_args(argv)
    publish("bench.reset_detect", argv, lambda: asyncio.run(run(a)), a.json)


if __name__ == "__main__":
    main()
