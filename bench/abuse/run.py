"""One round of the abuse run: a router (local or Redis store) over simulators behind the tap,
the attack (cases.py, all at once where they wait on timeouts), then the faults under load,
then what it cost the router and what its log says."""

from __future__ import annotations

import asyncio
import secrets
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import yaml

from bench.harness.fleet import Fleet, free_port
from bench.provenance import now_utc

from . import cases as C
from .attacks import Canary, Outcome, check_probes, control_trickle, run_cases, tenant_probe
from .faults import (
    Load,
    hung_engine,
    judge_load,
    killed_engine,
    readyz,
    redis_outage,
    tap_records,
    wait_for,
)
from .watch import (
    HealthzWatch,
    ProcWatch,
    fd_kinds,
    gauge_sum,
    metrics_text,
    proc_figures,
    redis_figures,
    redis_prepare,
    scan_log,
    traceback_excerpts,
)

MODEL = "abuse-model"
SIMS = 3
# Room for every prompt of the flood without eviction: what bounds the index is its budget.
SIM_KV_TOKENS = 2_000_000
MAX_BODY = 8 * C.MiB  # the router's default max_body_bytes
# The router's settings in this run: its defaults, but for timeouts short enough for a run of
# minutes and an index budget small enough for the flood to reach it.
ROUTER: dict[str, Any] = {
    "keepalive_timeout_s": 5.0,
    "body_timeout_s": 8.0,
    "first_token_budget_s": 2.0,
    "upstream_timeout_s": 10.0,
    "index_memory_mb": 32.0,
    "shutdown_timeout_s": 10.0,
    "log_level": "debug",
    "health": {"probe_interval_s": 0.5, "readmit_after_s": 2.0},
}
INDEX_ENTRY_BYTES = 200  # prefix_router.config's figure, for the bound the flood must meet
FLOOD = 160  # 100 KB prompts: ~250,000 new index entries against a bound of ~168,000
CONNECTIONS = 800
BURST = 200
PER_CASE = ("body size",)  # groups whose cases run one after the other, /healthz per case
HOP_PROBE_IDS = 1  # the first header probe's id

T = TypeVar("T")


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


class Round:
    def __init__(self, store: str, log_dir: Path) -> None:
        self.store = store
        self.log_dir = log_dir / store
        self.marker = "PLANTED-" + secrets.token_hex(6)
        self.tag = "HDRTAG-" + secrets.token_hex(6)
        self.timings: dict[str, float] = {}
        self.outcomes: list[Outcome] = []
        self.errors: list[str] = []
        self.load_results: list[Any] = []

    async def timed(self, name: str, work: Awaitable[T]) -> T:
        t0 = time.monotonic()
        try:
            return await work
        finally:
            self.timings[name] = round(time.monotonic() - t0, 1)

    async def run(self) -> dict[str, Any]:
        canary = Canary()
        await canary.start()
        try:
            async with Fleet(self.log_dir) as fleet:
                return await self._run(fleet, canary)
        finally:
            await canary.close()

    async def _run(self, fleet: Fleet, canary: Canary) -> dict[str, Any]:
        started, load_before = now_utc(), uptime()
        sims = [await fleet.start_sim(f"sim{i}", model=MODEL, kv_capacity=SIM_KV_TOKENS,
                                      profile="fast", time_scale=1.0) for i in range(SIMS)]
        taps = [free_port() for _ in sims]
        control_port = free_port()
        control = f"http://127.0.0.1:{control_port}"
        await fleet.start("tap", [sys.executable, "-m", "bench.abuse.tap", "--control",
                                  str(control_port), *(f"--pair={p}={s.url}"
                                                       for p, s in zip(taps, sims, strict=True))],
                          control_port, "/health")
        redis_url = await fleet.start_redis() if self.store == "redis" else None
        if redis_url:
            await redis_prepare(redis_url)
        settings = {**ROUTER, "discovery": {"backends": [f"http://127.0.0.1:{p}" for p in taps]}}
        if redis_url:
            settings["store"] = {"mode": "redis", "url": redis_url}
            settings["model_key"] = "abuse"
        cfg = self.log_dir / "router.yaml"
        cfg.write_text(yaml.safe_dump(settings))
        port = free_port()
        router = await fleet.start("router", [sys.executable, "-m", "prefix_router", "--config",
                                              str(cfg), "--port", str(port)], port, "/readyz")
        url = router.url
        pid = router.process.pid
        private = [f"127.0.0.1:{p}" for p in taps] + [s.url.split("//")[1] for s in sims]
        ctx = C.Ctx(MODEL, self.marker, self.tag, MAX_BODY, canary.port)
        session = aiohttp.ClientSession()
        try:
            await wait_for(lambda: _healthy(session, url, SIMS), 60, "every engine healthy")
            warm = await run_cases([C.Case("warm-up", "small chat", (C.post(C.CHAT, C.js(
                C.chat(ctx, C.text(ctx, f"warm-{i}", 2000)))),), ("200",)) for i in range(20)],
                port, private, parallel=4)
            if any(not o.met for o in warm):
                raise RuntimeError(f"warm-up failed: {[o.status for o in warm]}")
            redis_before = await redis_figures(redis_url) if redis_url else None
            roles = {p: "engines" for p in taps}
            if redis_url:
                roles[int(redis_url.rsplit(":", 1)[1].split("/")[0])] = "redis"
            before = proc_figures(pid) | {"fd_kinds": fd_kinds(pid, port, roles)}
            procs = ProcWatch(pid)
            healthz = HealthzWatch(url, phase="attack: start")
            procs.start()
            healthz.start()
            await self.timed("attack", self.attack(ctx, port, url, private, healthz))
            leak = await self.timed("in-flight drain", self.drained(session, url, sims))
            entries = gauge_sum(await metrics_text(session, url), "prefix_router_table_entries")
            redis_after = await redis_figures(redis_url) if redis_url else None
            # the shared store lost while Redis was there all along (the faults kill it later)
            outages = [line.split(" WARNING ", 1)[1][:160] for line in
                       router.log_path.read_text(errors="replace").splitlines()
                       if "shared store unavailable" in line]
            healthz.phase = "faults"
            faults = await self.timed("faults", self.faults(
                fleet, ctx, session, url, control, sims, taps, redis_url))
            healthz.phase = "after"
            settle = await self.timed("settle", self.settle(pid, port, roles, before))
            after = proc_figures(pid) | {"fd_kinds": fd_kinds(pid, port, roles)}
            metrics = await metrics_text(session, url)
            records = await tap_records(session, control)
            await procs.stop()
            await healthz.stop()
            alive = router.process.returncode is None
            stop = await self.sigterm(fleet, router)
        finally:
            await session.close()
        probes = {int(k): v for b in records for k, v in b["probes"].items()}
        check_probes(self.outcomes, self.catalogue_probes(ctx), probes)
        allowed = {rid for b in records for rid in (*b["held"], *b["cut"])}
        log_text = router.log_path.read_text(errors="replace")
        entries_end = gauge_sum(metrics, "prefix_router_table_entries")
        return {
            "store": self.store, "started": started, "load_before": load_before,
            "load_after": uptime(), "settings": settings | {"discovery": "3 simulators"},
            "sims": {"count": SIMS, "profile": "fast", "kv_capacity_tokens": SIM_KV_TOKENS,
                     "max_model_len": 32768},
            "timings_s": self.timings, "outcomes": [o.__dict__ for o in self.outcomes],
            "faults": faults | {"load": judge_load(self.load_results, allowed)},
            "leak_check": leak, "settle": settle,
            "router": {"before": before, "after": after, "peak_rss_mb": max(
                procs.max_rss_mb, after.get("peak_rss_mb", 0)), "max_fds": procs.max_fds,
                "alive_at_end": alive, "sigterm": stop},
            "index": {"entries": entries, "entries_at_end": entries_end, "bound": max(1000, int(
                ROUTER["index_memory_mb"] * 2**20 / INDEX_ENTRY_BYTES))},
            "redis": {"before": redis_before, "after the attack": redis_after,
                      "store lost during the attack": outages} if redis_url else None,
            "healthz": healthz.summary(), "canary_connections": canary.hits,
            "log": scan_log(log_text, {"prompt marker": self.marker,
                                       "header/path marker": self.tag})
            | {"traceback_excerpts": traceback_excerpts(log_text)},
            "probes_at_engine": probes,
            "errors": self.errors,
        }

    def catalogue_probes(self, ctx: C.Ctx) -> list[C.Case]:
        return C.hop_by_hop(ctx, HOP_PROBE_IDS)

    async def attack(self, ctx: C.Ctx, port: int, url: str, private: list[str],
                     healthz: HealthzWatch) -> None:
        keep, body = ROUTER["keepalive_timeout_s"], ROUTER["body_timeout_s"]
        stop = asyncio.Event()
        background = [
            asyncio.create_task(run_cases(C.slow(ctx, keep, body), port, private, parallel=64)),
            asyncio.create_task(run_cases(C.many_connections(CONNECTIONS, keep), port, private,
                                          parallel=CONNECTIONS)),
            asyncio.create_task(control_trickle(ctx, port, private, stop)),
        ]
        groups: list[tuple[str, list[C.Case], int]] = [
            ("body size", C.body_size(ctx), 6),
            ("prompt over max_model_len", C.context(ctx), 6),
            ("JSON", C.json_garbage(ctx), 16),
            ("wrong types", C.wrong_types(ctx), 16),
            ("encodings", C.encodings(ctx), 16),
            ("header tricks", C.headers(ctx), 16),
            ("hop-by-hop and forwarding", C.hop_by_hop(ctx, HOP_PROBE_IDS), 4),
            ("Expect", C.expect_tricks(ctx), 16),
            ("methods and paths", C.methods(ctx), 16),
            ("many connections: burst", C.burst(ctx, BURST), BURST),
            ("index flood", C.index_flood(ctx, FLOOD), 8),
            ("clients leaving", C.leaving(ctx), 20),
        ]
        for name, group, parallel in groups:
            healthz.phase = f"attack: {name}"
            if name in PER_CASE:  # each case alone: which one holds the loop up
                t0 = time.monotonic()
                for case in group:
                    healthz.phase = f"attack: {name}: {case.name}"
                    self.outcomes += await run_cases([case], port, private, parallel)
                self.timings[name] = round(time.monotonic() - t0, 1)
                continue
            self.outcomes += await self.timed(name, run_cases(group, port, private, parallel))
        healthz.phase = "attack: tenant probing"
        self.outcomes += await self.timed("tenant probing", tenant_probe(ctx, url))
        healthz.phase = "attack: slow clients and connections left"
        stop.set()
        for t in background:
            self.outcomes += await t

    async def drained(self, s: aiohttp.ClientSession, url: str, sims: list[Any]
                      ) -> dict[str, Any]:
        """After the clients left: nothing in flight at the router nor at any engine."""
        async def idle() -> bool:
            texts = [await metrics_text(s, url)] + [await metrics_text(s, p.url) for p in sims]
            return (gauge_sum(texts[0], "prefix_router_backend_in_flight") == 0 and
                    all(gauge_sum(t, "vllm:num_requests_running") == 0 for t in texts[1:]))
        try:
            return {"seconds": await wait_for(idle, 30, "nothing in flight"), "drained": True}
        except TimeoutError as exc:
            self.errors.append(str(exc))
            return {"seconds": None, "drained": False}

    async def faults(self, fleet: Fleet, ctx: C.Ctx, s: aiohttp.ClientSession, url: str,
                     control: str, sims: list[Any], taps: list[int], redis_url: str | None
                     ) -> dict[str, Any]:
        load = Load(ctx, url)
        self.load_results = load.results
        served: Callable[[], int] = lambda: len(load.results)  # noqa: E731
        load.start()
        out: dict[str, Any] = {}
        try:
            out["engine hung"] = await hung_engine(load, s, url, control, SIMS, served)
            # another engine than the one that hung (now back), killed for real
            victim = sims[(out["engine hung"]["backend"] + 1) % SIMS]
            port = int(victim.url.rsplit(":", 1)[1])

            async def kill() -> None:
                await fleet.stop(victim, "kill")

            async def restart() -> None:
                await fleet.start_sim(f"{victim.name}-restarted", model=MODEL,
                                      kv_capacity=SIM_KV_TOKENS, profile="fast",
                                      time_scale=1.0, port=port)

            out["engine killed"] = await killed_engine(load, s, url, SIMS, kill, restart)
            if redis_url:
                rport = int(redis_url.rsplit(":", 1)[1].split("/")[0])

                async def kill_redis() -> None:
                    await fleet.stop(fleet.proc("redis"), "kill")

                async def restart_redis() -> None:
                    await fleet.start_redis("redis-back", port=rport)

                out["redis killed"] = await redis_outage(load, s, url, kill_redis,
                                                         restart_redis, served)
            load.phase = "after the faults"
            start = served()
            await wait_for(lambda: _true(served() - start >= 20), 60, "20 more requests")
        except TimeoutError as exc:
            self.errors.append(str(exc))
        finally:
            await load.stop()
        return out

    async def settle(self, pid: int, port: int, roles: dict[int, str],
                     before: dict[str, Any]) -> dict[str, Any]:
        """The attack's client connections closed: as many open as before it, give or take
        the watchers' own. (Idle connections to the engines stay pooled for 60 s by design.)"""
        def clients(kinds: dict[str, int]) -> int:
            return sum(n for k, n in kinds.items() if k.startswith("clients "))

        bar = clients(before["fd_kinds"]) + 2

        async def back() -> bool:
            return clients(fd_kinds(pid, port, roles)) <= bar
        try:
            return {"seconds": await wait_for(back, 30, f"client connections back to {bar}",
                                              interval=0.25), "client_connections_bar": bar}
        except TimeoutError as exc:
            self.errors.append(str(exc))
            return {"seconds": None, "client_connections_bar": bar}

    async def sigterm(self, fleet: Fleet, router: Any) -> dict[str, Any]:
        t0 = time.monotonic()
        router.process.terminate()
        try:
            code = await asyncio.wait_for(router.process.wait(), 30)
        except TimeoutError:
            code = None
            await fleet.stop(router, "kill")
        return {"exit_code": code, "seconds": round(time.monotonic() - t0, 2)}


async def _true(v: bool) -> bool:
    return v


async def _healthy(s: aiohttp.ClientSession, url: str, n: int) -> bool:
    r = await readyz(s, url)
    return r.get("healthy_backends") == n


async def run_all(stores: list[str], log_dir: Path) -> list[dict[str, Any]]:
    out = []
    for store in stores:
        print(f"abuse: {store} store ...", flush=True)
        out.append(await Round(store, log_dir).run())
    return out
