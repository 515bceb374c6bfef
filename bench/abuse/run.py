"""One round of the abuse run: a router (local or Redis store) over simulators behind the tap,
the attack (cases.py, all at once where they wait on timeouts), then the faults under ordinary
load, then what it cost the router (/proc), how /healthz fared, and what its log says.

The faults (an engine hung while its /health still answers, an engine killed, Redis killed and
started again) each wait on what the router reports (/readyz), never on a fixed time, and
each is undone before the next. Which requests a fault may fail is known from the tap: those a
hung engine took (held) and those in flight on an engine when it was killed (cut). Any other
failure is the router's."""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import inspect
import json
import os
import re
import secrets
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from bench.harness.fleet import Fleet, free_port, parse_status
from bench.harness.promtext import sample_sum
from bench.harness.stats import percentile
from bench.provenance import now_utc

from . import cases as C
from .client import Outcome, check_probes, control_trickle, run_cases, tenant_probe

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
TIMEOUT = aiohttp.ClientTimeout(total=5)

# ------------------------------------------------------------------ what is watched besides


def proc_figures(pid: int) -> dict[str, float]:
    """RSS, peak RSS (MB) and open descriptors of one process, now."""
    try:
        vm = parse_status(Path(f"/proc/{pid}/status").read_text())
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return {}
    return {"rss_mb": round(vm.get("VmRSS", 0) / 1024, 1),
            "peak_rss_mb": round(vm.get("VmHWM", 0) / 1024, 1), "fds": fds}


TCP_STATES = dict(enumerate(("", "ESTABLISHED", "SYN_SENT", "SYN_RECV", "FIN_WAIT1", "FIN_WAIT2",
                             "TIME_WAIT", "CLOSE", "CLOSE_WAIT", "LAST_ACK", "LISTEN",
                             "CLOSING")))


def tcp_table(text: str) -> dict[int, tuple[int, int, str]]:
    """/proc/net/tcp: socket inode -> (local port, remote port, state)."""
    rows = [f for f in (line.split() for line in text.splitlines()[1:]) if len(f) >= 10]
    return {int(f[9]): (int(f[1].rsplit(":", 1)[1], 16), int(f[2].rsplit(":", 1)[1], 16),
                        TCP_STATES.get(int(f[3], 16), f[3])) for f in rows}


def fd_kinds(pid: int, own_port: int, roles: dict[int, str]) -> dict[str, int]:
    """A process's open descriptors by kind: its TCP sockets by role (`clients`: accepted on
    `own_port`; else the peer's role by its port) and state, the rest by what they are."""
    table: dict[int, tuple[int, int, str]] = {}
    for name in ("tcp", "tcp6"):
        with contextlib.suppress(OSError):
            table.update(tcp_table(Path(f"/proc/{pid}/net/{name}").read_text()))
    kinds: Counter[str] = Counter()
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                m = re.match(r"socket:\[(\d+)\]", target)
                if m and int(m.group(1)) in table:
                    lport, rport, state = table[int(m.group(1))]
                    role = ("listener" if state == "LISTEN" else "clients" if lport == own_port
                            else roles.get(rport, "other peers"))
                    kinds[f"{role} {state}"] += 1
                else:
                    kinds[re.sub(r"[:/\[].*", "", target) or target] += 1
    return dict(kinds.most_common())


def latency_summary(values: list[float], failures: int = 0) -> dict[str, Any]:
    def ms(q: float) -> float | None:
        v = percentile(values, q)
        return None if v is None else round(v * 1000, 1)

    return {"n": len(values), "failures": failures, "p50_ms": ms(50), "p99_ms": ms(99),
            "max_ms": round(max(values) * 1000, 1) if values else None}


@dataclass
class Watch:
    """The router watched while the round runs: GET /healthz every 50 ms from a process of its
    own (bench/abuse/probe.py; each answer's latency kept under the phase it was asked in),
    and its RSS and open descriptors from /proc every 250 ms (the highest kept)."""

    url: str
    pid: int
    latencies: dict[str, list[float]] = field(default_factory=dict)
    failures: Counter[str] = field(default_factory=Counter)
    max_rss_mb: float = 0.0
    max_fds: int = 0
    # (monotonic time, phase) at each change: a probe counts under the phase it began in
    phases: list[tuple[float, str]] = field(default_factory=lambda: [(0.0, "attack: start")])

    @property
    def phase(self) -> str:
        return self.phases[-1][1]

    @phase.setter
    def phase(self, name: str) -> None:
        self.phases.append((time.monotonic(), name))

    def _phase_at(self, t: float) -> str:
        return self.phases[bisect.bisect_right(self.phases, (t, "\uffff")) - 1][1]

    async def healthz(self) -> None:
        child = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bench.abuse.probe", self.url, stdout=subprocess.PIPE)
        assert child.stdout is not None
        try:
            while line := await child.stdout.readline():
                t0, took, ok = line.split()
                phase = self._phase_at(float(t0))
                if ok == b"1":
                    self.latencies.setdefault(phase, []).append(float(took))
                else:
                    self.failures[phase] += 1
        finally:
            with contextlib.suppress(ProcessLookupError):
                child.kill()
            await child.wait()

    async def proc(self) -> None:
        while True:
            if f := proc_figures(self.pid):
                self.max_rss_mb = max(self.max_rss_mb, f["rss_mb"])
                self.max_fds = max(self.max_fds, int(f["fds"]))
            await asyncio.sleep(0.25)

    def summary(self) -> dict[str, dict[str, Any]]:
        """Per phase; "attack" is every phase named "attack: <group>" together."""
        out = {p: latency_summary(v, self.failures[p]) for p, v in self.latencies.items()}
        if parts := [p for p in self.latencies if p.startswith("attack: ")]:
            out["attack"] = latency_summary([x for p in parts for x in self.latencies[p]],
                                            sum(self.failures[p] for p in parts))
        return out


_NOISE = re.compile(r"https?://\S+|\d+(\.\d+)?|'[^']*'|\"[^\"]*\"")
_LINE = re.compile(r"^\S+ \S+ (DEBUG|INFO|WARNING|ERROR|CRITICAL) (\S+) (.*)$")


def scan_log(text: str, markers: dict[str, str]) -> dict[str, Any]:
    """Tracebacks, ERROR and CRITICAL lines, how often each marker occurs, and the log's
    lines by level and kind (numbers, addresses and quoted values blanked out)."""
    kinds: Counter[str] = Counter()
    levels: Counter[str] = Counter()
    errors = []
    for line in text.splitlines():
        if m := _LINE.match(line):
            level, name, message = m.groups()
            levels[level] += 1
            if level in ("ERROR", "CRITICAL"):
                errors.append(line[:300])
            if level != "DEBUG":
                kinds[f"{level} {name} {_NOISE.sub('#', message)[:120]}"] += 1
    return {"lines": len(text.splitlines()),
            "tracebacks": text.count("Traceback (most recent call last)"),
            "error_lines": len(errors), "first_errors": errors[:10], "levels": dict(levels),
            "markers": {name: text.count(m) for name, m in markers.items()},
            "kinds": dict(kinds.most_common(25))}


def traceback_excerpts(text: str, limit: int = 3, width: int = 1500) -> list[str]:
    """The first tracebacks of a log, each with the line that logged it."""
    out: list[str] = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("Traceback (most recent call last)") and len(out) < limit:
            end = i + 1
            while end < len(lines) and (lines[end].startswith((" ", "\t")) or
                                        (not _LINE.match(lines[end]) and lines[end].strip())):
                end += 1
            out.append("\n".join(lines[max(0, i - 1):end])[:width])
    return out


async def get(s: aiohttp.ClientSession, url: str) -> Any:
    """A JSON answer (/readyz, the tap's records) or a /metrics page; {} or "" if none came."""
    try:
        async with s.get(url, timeout=TIMEOUT) as r:
            return await (r.text() if url.endswith("/metrics") else r.json(content_type=None))
    except (aiohttp.ClientError, TimeoutError, OSError, ValueError):
        return "" if url.endswith("/metrics") else {}


async def redis_figures(url: str, prepare: bool = False) -> dict[str, Any]:
    """Keys, memory and the slow log of a redis-server: commands over 10 ms, over 50 ms, the
    slowest, and which commands they were. `prepare`: first keep every command over 10 ms in
    the slow log (its default length, 128, fills up)."""
    import redis.asyncio as aioredis

    r = aioredis.from_url(url)
    try:
        if prepare:
            await r.config_set("slowlog-max-len", 100_000)
            await r.config_set("slowlog-log-slower-than", 10_000)
            await r.slowlog_reset()
        slow = await r.slowlog_get(100_000)
        ms = [e["duration"] / 1000 for e in slow]
        return {"keys": await r.dbsize(),
                "used_memory_mb": round((await r.info("memory"))["used_memory"] / 2**20, 1),
                "commands_over_10ms": len(ms), "over_50ms": sum(1 for x in ms if x > 50),
                "slowest_ms": round(max(ms, default=0), 1), "slow_commands": dict(Counter(
                    (e["command"] or b"?").split()[0].decode(errors="replace").upper()
                    for e in slow))}
    except (OSError, aioredis.RedisError) as exc:
        return {"error": repr(exc)}
    finally:
        await r.aclose()


# ------------------------------------------------------------------ the faults' load


@dataclass
class LoadResult:
    rid: int
    phase: str
    stream: bool
    status: int | str
    error_event: bool = False  # a stream that ended with an error event
    whole: bool = False  # a complete answer ([DONE], or a JSON body with choices)


@dataclass
class Load:
    """Open-loop ordinary requests (half streamed) at `rate` a second, each with its id in its
    prompt for the tap to see, until `stop` is set; those sent are then waited for (each ends
    within the router's timeouts)."""

    ctx: C.Ctx
    url: str
    rate: float = 8.0
    phase: str = "before"
    results: list[LoadResult] = field(default_factory=list)
    first_rid: int = 1_000_000

    async def one(self, s: aiohttp.ClientSession, rid: int) -> None:
        # four shared system prompts, each half streamed: whichever engine owns one gets both
        stream = (rid // 4) % 2 == 0
        body = {"model": self.ctx.model, "max_tokens": 16, "stream": stream, "messages": [
            {"role": "system", "content": f"You are assistant number {rid % 4}. " * 40},
            {"role": "user", "content": f"{self.ctx.marker} rid-{rid} what now?"}]}
        res = LoadResult(rid, self.phase, stream, "error")
        try:
            async with s.post(self.url + C.CHAT, json=body) as r:
                data = await r.read()
                res.status = r.status
            if stream:
                res.error_event = b'"error"' in data
                res.whole = data.rstrip().endswith(b"data: [DONE]") and not res.error_event
            elif r.status == 200:
                res.whole = bool(json.loads(data).get("choices"))
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
            res.status = type(exc).__name__
        self.results.append(res)

    async def run(self, stop: asyncio.Event) -> None:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60),
                                         connector=aiohttp.TCPConnector(limit=0)) as s:
            sent: list[asyncio.Task[None]] = []
            t0 = time.monotonic()
            while not stop.is_set():
                sent.append(asyncio.create_task(self.one(s, self.first_rid + len(sent) + 1)))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), max(
                        0.0, t0 + len(sent) / self.rate - time.monotonic()))
            await asyncio.gather(*sent)


def judge_load(results: list[LoadResult], allowed: set[int]) -> dict[str, Any]:
    """Every request of the load, by phase: answered whole, failed where a fault allowed it
    (`allowed`: ids the tap saw held by a hung engine or cut by a killed one), or failed
    otherwise (the router's failure)."""
    phases: dict[str, dict[str, Any]] = {}
    for r in results:
        p = phases.setdefault(r.phase, {"sent": 0, "whole": 0, "allowed_failures": 0,
                                        "failures": 0, "five_xx": 0, "statuses": {},
                                        "failed": []})
        p["sent"] += 1
        key = str(r.status) + (" + error event" if r.error_event else "")
        p["statuses"][key] = p["statuses"].get(key, 0) + 1
        if r.status == 200 and r.whole:
            p["whole"] += 1
        elif r.rid in allowed:
            p["allowed_failures"] += 1
        else:
            p["failures"] += 1
            p["five_xx"] += 1 if isinstance(r.status, int) and r.status >= 500 else 0
            if len(p["failed"]) < 10:
                p["failed"].append({"rid": r.rid, "stream": r.stream, "status": key})
    return phases


def busiest(records: list[dict[str, Any]], since: int) -> int:
    """The backend that took the most of the load's requests (ids above `since`)."""
    counts = [sum(1 for rid in b["seen"] if rid > since) for b in records]
    return counts.index(max(counts))


async def wait_for(check: Callable[[], bool | Awaitable[bool]], timeout: float, what: str,
                   interval: float = 0.1) -> float:
    """Seconds until `check` holds; raises TimeoutError if it does not within `timeout`."""
    t0 = time.monotonic()
    while not (await r if inspect.isawaitable(r := check()) else r):
        if time.monotonic() - t0 > timeout:
            raise TimeoutError(f"{what}: not within {timeout:g}s")
        await asyncio.sleep(interval)
    return round(time.monotonic() - t0, 2)


async def within(errors: list[str], what: str, check: Callable[[], bool | Awaitable[bool]],
                 timeout: float, interval: float = 0.1) -> float | None:
    """wait_for, its timeout noted among the run's errors instead of raised (None)."""
    try:
        return await wait_for(check, timeout, what, interval)
    except TimeoutError as exc:
        errors.append(str(exc))
        return None


def clients(kinds: dict[str, int]) -> int:
    """Connections from clients among a process's descriptors (fd_kinds)."""
    return sum(n for k, n in kinds.items() if k.startswith("clients "))


# ------------------------------------------------------------------ the round


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


async def timed(timings: dict[str, float], name: str, work: Awaitable[Any]) -> Any:
    t0 = time.monotonic()
    try:
        return await work
    finally:
        timings[name] = round(time.monotonic() - t0, 1)


async def attack(ctx: C.Ctx, port: int, url: str, private: list[str], watch: Watch,
                 timings: dict[str, float]) -> list[Outcome]:
    """Every group of cases in turn, while the slow clients, the silent connections and one
    ordinary request every 0.5 s go on in the background."""
    keep, body = ROUTER["keepalive_timeout_s"], ROUTER["body_timeout_s"]
    stop = asyncio.Event()
    background = [
        asyncio.create_task(run_cases(C.slow(ctx, keep, body), port, private, parallel=64)),
        asyncio.create_task(run_cases(C.many_connections(CONNECTIONS, keep), port, private,
                                      parallel=CONNECTIONS)),
        asyncio.create_task(control_trickle(ctx, port, private, stop))]
    out: list[Outcome] = []
    for name, group, parallel in [
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
            ("clients leaving", C.leaving(ctx), 20)]:
        watch.phase = f"attack: {name}"
        t0 = time.monotonic()
        # each case of PER_CASE alone, /healthz under its own phase: which one holds the loop
        for part in [[c] for c in group] if name in PER_CASE else [group]:
            if name in PER_CASE:
                watch.phase = f"attack: {name}: {part[0].name}"
            out += await run_cases(part, port, private, parallel)
        timings[name] = round(time.monotonic() - t0, 1)
    watch.phase = "attack: tenant probing"
    out += await timed(timings, "tenant probing", tenant_probe(ctx, url))
    watch.phase = "attack: slow clients and connections left"
    stop.set()
    for t in background:
        out += await t
    return out


async def faults(fleet: Fleet, load: Load, s: aiohttp.ClientSession, url: str, control: str,
                 redis_url: str | None, errors: list[str]) -> dict[str, Any]:
    """Under the load: the engine it reaches most hung (its /health still answers) until 40
    more requests are answered after the router ejects it (a probe that succeeds may take it
    back: how many requests does it still catch?), then answering again until taken back;
    another engine killed and started again; with Redis, Redis killed and started again
    empty (the router routes on local state meanwhile and fails nothing)."""
    def readyz(key: str, value: Any) -> Callable[[], Awaitable[bool]]:
        return lambda: ready_is(s, url, key, value)

    async def tap(what: str) -> None:
        async with s.post(f"{control}/{what}") as r:
            r.raise_for_status()

    def served() -> int:
        return len(load.results)

    async def records() -> list[dict[str, Any]]:
        return await get(s, control + "/records")

    stop = asyncio.Event()
    task = asyncio.create_task(load.run(stop))
    out: dict[str, Any] = {}
    try:
        await wait_for(lambda: served() >= 20, 60, "20 requests of the load")
        hung = busiest(await records(), load.first_rid)
        load.phase = "engine hung"
        await tap(f"hang/{hung}")
        eject = await wait_for(readyz("healthy_backends", SIMS - 1), 60,
                               "the hung engine ejected")
        held_at_eject, start = len((await records())[hung]["held"]), served()
        await wait_for(lambda: served() - start >= 40, 120,
                       "40 more requests answered while the engine hung")
        await tap(f"unhang/{hung}")
        load.phase = "engine recovered"
        back = await wait_for(readyz("healthy_backends", SIMS), 60,
                              "the engine taken back")
        out["engine hung"] = {"backend": hung, "seconds_to_eject": eject,
                              "seconds_to_readmit": back, "held_before_ejection": held_at_eject,
                              "held_after_ejection": len((await records())[hung]["held"])
                              - held_at_eject}
        # another engine than the one that hung (now back), killed for real
        victim = fleet.proc(f"sim{(hung + 1) % SIMS}")
        load.phase, t0 = "engine killed", time.monotonic()
        await fleet.stop(victim, "kill")
        eject = await wait_for(readyz("healthy_backends", SIMS - 1), 60,
                               "the killed engine ejected")
        load.phase = "engine restarted"
        await fleet.start_sim(f"{victim.name}-restarted", model=MODEL, kv_capacity=SIM_KV_TOKENS,
                              profile="fast", time_scale=1.0, port=int(victim.url.rsplit(":")[-1]))
        out["engine killed"] = {
            "seconds_to_eject": eject, "seconds_to_readmit": await wait_for(
                readyz("healthy_backends", SIMS), 60, "the engine taken back"),
            "seconds_total": round(time.monotonic() - t0, 2)}
        if redis_url:
            load.phase = "redis down"
            await fleet.stop(fleet.proc("redis"), "kill")
            degraded = await wait_for(readyz("store", "degraded"), 60,
                                      "the store degraded")
            start = served()
            await wait_for(lambda: served() - start >= 20, 60,
                           "20 requests answered while Redis was down")
            load.phase = "redis back"
            await fleet.start_redis("redis-back", port=int(redis_url.split(":")[-1].split("/")[0]))
            out["redis killed"] = {"seconds_to_degraded": degraded, "seconds_to_reconnect":
                                   await wait_for(readyz("store", "ok"), 60,
                                                  "the store back")}
        load.phase = "after the faults"
        start = served()
        await wait_for(lambda: served() - start >= 20, 60, "20 more requests")
    except TimeoutError as exc:
        errors.append(str(exc))
    finally:
        stop.set()
        await task
    return out


async def run_round(store: str, log_dir: Path) -> dict[str, Any]:
    """One round with the router on `store` ("local" or "redis"): its figures, as JSON."""
    log_dir = log_dir / store
    marker, tag = "PLANTED-" + secrets.token_hex(6), "HDRTAG-" + secrets.token_hex(6)
    timings: dict[str, float] = {}
    errors: list[str] = []
    canary_hits = [0]  # a port only the bench listens on: no client may make the router call it

    async def on_canary(_r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        canary_hits[0] += 1
        w.close()

    canary = await asyncio.start_server(on_canary, "127.0.0.1", 0)
    async with canary, Fleet(log_dir) as fleet, aiohttp.ClientSession() as s:
        started, load_before = now_utc(), uptime()
        sims = [await fleet.start_sim(f"sim{i}", model=MODEL, kv_capacity=SIM_KV_TOKENS,
                                      profile="fast", time_scale=1.0) for i in range(SIMS)]
        taps, control_port = [free_port() for _ in sims], free_port()
        control = f"http://127.0.0.1:{control_port}"
        await fleet.start("tap", [sys.executable, "-m", "bench.abuse.tap", "--control",
                                  str(control_port), *(f"--pair={p}={sim.url}"
                                                       for p, sim in zip(taps, sims, strict=True))],
                          control_port, "/health")
        settings = {**ROUTER, "discovery": {"backends": [f"http://127.0.0.1:{p}" for p in taps]}}
        roles = {p: "engines" for p in taps}
        redis_url = await fleet.start_redis() if store == "redis" else None
        if redis_url:
            await redis_figures(redis_url, prepare=True)
            settings.update(store={"mode": "redis", "url": redis_url}, model_key="abuse")
            roles[int(redis_url.split(":")[-1].split("/")[0])] = "redis"
        cfg = log_dir / "router.yaml"
        cfg.write_text(yaml.safe_dump(settings))
        port = free_port()
        router = await fleet.start("router", [sys.executable, "-m", "prefix_router", "--config",
                                              str(cfg), "--port", str(port)], port, "/readyz")
        url, pid = router.url, router.process.pid
        private = [f"127.0.0.1:{p}" for p in taps] + [sim.url.split("//")[1] for sim in sims]
        ctx = C.Ctx(MODEL, marker, tag, MAX_BODY, canary.sockets[0].getsockname()[1])
        await wait_for(lambda: ready_is(s, url, "healthy_backends", SIMS), 60,
                       "every engine healthy")
        warm = await run_cases([C.Case("warm-up", "small chat", (C.post(C.CHAT, C.js(
            C.chat(ctx, C.text(ctx, f"warm-{i}", 2000)))),), ("200",)) for i in range(20)],
            port, private, parallel=4)
        if any(not o.met for o in warm):
            raise RuntimeError(f"warm-up failed: {[o.status for o in warm]}")
        redis_before = await redis_figures(redis_url) if redis_url else None
        before = proc_figures(pid) | {"fd_kinds": fd_kinds(pid, port, roles)}
        watch = Watch(url, pid)
        watching = asyncio.gather(watch.healthz(), watch.proc())
        outcomes = await timed(timings, "attack", attack(ctx, port, url, private, watch, timings))
        async def idle() -> bool:  # nothing in flight at the router nor at any engine
            texts = [await get(s, u + "/metrics") for u in [url, *(p.url for p in sims)]]
            return (sample_sum(texts[0], "prefix_router_backend_in_flight") == 0 and
                    all(sample_sum(t, "vllm:num_requests_running") == 0 for t in texts[1:]))

        drain = await timed(timings, "in-flight drain", within(
            errors, "nothing in flight", idle, 30))
        entries = sample_sum(await get(s, url + "/metrics"), "prefix_router_table_entries")
        redis_after = await redis_figures(redis_url) if redis_url else None
        # the shared store lost while Redis was there all along (the faults kill it later)
        outages = [line.split(" WARNING ", 1)[1][:160] for line in
                   router.log_path.read_text(errors="replace").splitlines()
                   if "shared store unavailable" in line]
        watch.phase = "faults"
        load = Load(ctx, url)
        fault = await timed(timings, "faults", faults(fleet, load, s, url, control, redis_url,
                                                      errors))
        watch.phase = "after"
        # the attack's client connections closed: as many open as before it, give or take the
        # watchers' own (idle connections to the engines stay pooled for 60 s by design)
        bar = clients(before["fd_kinds"]) + 2
        settle = {"seconds": await timed(timings, "settle", within(
            errors, f"client connections back to {bar}",
            lambda: clients(fd_kinds(pid, port, roles)) <= bar, 30, 0.25)),
            "client_connections_bar": bar}
        after = proc_figures(pid) | {"fd_kinds": fd_kinds(pid, port, roles)}
        metrics = await get(s, url + "/metrics")
        records = await get(s, control + "/records")
        watching.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watching
        alive = router.process.returncode is None
        t0 = time.monotonic()
        router.process.terminate()
        try:
            code = await asyncio.wait_for(router.process.wait(), 30)
        except TimeoutError:
            code = None
            await fleet.stop(router, "kill")
        stop = {"exit_code": code, "seconds": round(time.monotonic() - t0, 2)}
    probes = {int(k): v for b in records for k, v in b["probes"].items()}
    check_probes(outcomes, C.hop_by_hop(ctx, HOP_PROBE_IDS), probes)
    allowed = {rid for b in records for rid in (*b["held"], *b["cut"])}
    log_text = router.log_path.read_text(errors="replace")
    return {
        "store": store, "started": started, "load_before": load_before,
        "load_after": uptime(), "settings": settings | {"discovery": "3 simulators"},
        "sims": {"count": SIMS, "profile": "fast", "kv_capacity_tokens": SIM_KV_TOKENS,
                 "max_model_len": 32768},
        "timings_s": timings, "outcomes": [o.__dict__ for o in outcomes],
        "faults": fault | {"load": judge_load(load.results, allowed)},
        "leak_check": {"seconds": drain, "drained": drain is not None}, "settle": settle,
        "router": {"before": before, "after": after, "peak_rss_mb": max(
            watch.max_rss_mb, after.get("peak_rss_mb", 0)), "max_fds": watch.max_fds,
            "alive_at_end": alive, "sigterm": stop},
        "index": {"entries": entries,
                  "entries_at_end": sample_sum(metrics, "prefix_router_table_entries"),
                  "bound": max(1000, int(ROUTER["index_memory_mb"] * 2**20 / INDEX_ENTRY_BYTES))},
        "redis": {"before": redis_before, "after the attack": redis_after,
                  "store lost during the attack": outages} if redis_url else None,
        "healthz": watch.summary(), "canary_connections": canary_hits[0],
        "log": scan_log(log_text, {"prompt marker": marker, "header/path marker": tag})
        | {"traceback_excerpts": traceback_excerpts(log_text)},
        "probes_at_engine": probes, "errors": errors,
    }


async def ready_is(s: aiohttp.ClientSession, url: str, key: str, value: Any) -> bool:
    """Whether the router's /readyz says `key` is `value` (healthy_backends, store)."""
    return (await get(s, url + "/readyz")).get(key) == value


async def run_all(stores: list[str], log_dir: Path) -> list[dict[str, Any]]:
    out = []
    for store in stores:
        print(f"abuse: {store} store ...", flush=True)
        out.append(await run_round(store, log_dir))
    return out
