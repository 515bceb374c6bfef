"""What the abuse run watches besides the answers: the router's memory and descriptors (from
/proc), `/healthz` latency on a connection of its own, the router's log, its gauges and
Redis's own figures."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from bench.harness.fleet import parse_status
from bench.harness.stats import percentile


def proc_figures(pid: int) -> dict[str, float]:
    """RSS, peak RSS (MB) and open descriptors of one process, now."""
    try:
        vm = parse_status(Path(f"/proc/{pid}/status").read_text())
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return {}
    return {"rss_mb": round(vm.get("VmRSS", 0) / 1024, 1),
            "peak_rss_mb": round(vm.get("VmHWM", 0) / 1024, 1), "fds": fds}


class Background:
    """Its `_loop()` runs as a task from `start()` until `stop()` cancels it."""

    _task: asyncio.Task[None] | None = None

    async def _loop(self) -> None:
        raise NotImplementedError

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop())

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


@dataclass
class ProcWatch(Background):
    """Samples a process a few times a second; keeps the highest RSS and descriptor count."""

    pid: int
    period_s: float = 0.25
    max_rss_mb: float = 0.0
    max_fds: int = 0

    def sample(self) -> dict[str, float]:
        f = proc_figures(self.pid)
        if f:
            self.max_rss_mb = max(self.max_rss_mb, f["rss_mb"])
            self.max_fds = max(self.max_fds, int(f["fds"]))
        return f

    async def _loop(self) -> None:
        while True:
            self.sample()
            await asyncio.sleep(self.period_s)


@dataclass
class HealthzWatch(Background):
    """GET /healthz every `period_s` on one kept-alive connection of its own; each answer's
    latency is kept under the phase it was asked in."""

    url: str
    period_s: float = 0.05
    timeout_s: float = 5.0
    phase: str = "idle"
    latencies: dict[str, list[float]] = field(default_factory=dict)
    failures: Counter[str] = field(default_factory=Counter)

    async def _loop(self) -> None:
        conn = aiohttp.TCPConnector(limit=1)
        async with aiohttp.ClientSession(connector=conn) as s:
            while True:
                phase, t0 = self.phase, time.perf_counter()
                try:
                    async with s.get(self.url + "/healthz",
                                     timeout=aiohttp.ClientTimeout(total=self.timeout_s)) as r:
                        await r.read()
                        ok = r.status == 200
                except (aiohttp.ClientError, TimeoutError, OSError):
                    ok = False
                took = time.perf_counter() - t0
                if ok:
                    self.latencies.setdefault(phase, []).append(took)
                else:
                    self.failures[phase] += 1
                await asyncio.sleep(max(0.0, self.period_s - took))

    def summary(self) -> dict[str, dict[str, Any]]:
        """Per phase; "attack" is every phase named "attack: <group>" together."""
        out = {p: latency_summary(v, self.failures[p]) for p, v in self.latencies.items()}
        parts = [p for p in self.latencies if p.startswith("attack: ")]
        if parts:
            out["attack"] = latency_summary([x for p in parts for x in self.latencies[p]],
                                            sum(self.failures[p] for p in parts))
        return out


def latency_summary(values: list[float], failures: int = 0) -> dict[str, Any]:
    def ms(q: float) -> float | None:
        v = percentile(values, q)
        return None if v is None else round(v * 1000, 1)

    return {"n": len(values), "failures": failures, "p50_ms": ms(50), "p99_ms": ms(99),
            "max_ms": round(max(values) * 1000, 1) if values else None}


_NOISE = re.compile(r"https?://\S+|\d+(\.\d+)?|'[^']*'|\"[^\"]*\"")
_LINE = re.compile(r"^\S+ \S+ (DEBUG|INFO|WARNING|ERROR|CRITICAL) (\S+) (.*)$")


def scan_log(text: str, markers: dict[str, str]) -> dict[str, Any]:
    """Tracebacks, ERROR and CRITICAL lines, how often each marker occurs, and the log's
    lines by level and kind (numbers, addresses and quoted values blanked out)."""
    lines = text.splitlines()
    kinds: Counter[str] = Counter()
    levels: Counter[str] = Counter()
    errors = []
    for line in lines:
        m = _LINE.match(line)
        if not m:
            continue
        level, name, message = m.groups()
        levels[level] += 1
        if level in ("ERROR", "CRITICAL"):
            errors.append(line[:300])
        if level != "DEBUG":
            kinds[f"{level} {name} {_NOISE.sub('#', message)[:120]}"] += 1
    return {
        "lines": len(lines),
        "tracebacks": text.count("Traceback (most recent call last)"),
        "error_lines": len(errors),
        "first_errors": errors[:10],
        "levels": dict(levels),
        "markers": {name: text.count(m) for name, m in markers.items()},
        "kinds": dict(kinds.most_common(25)),
    }


def traceback_excerpts(text: str, limit: int = 3, width: int = 1500) -> list[str]:
    """The first tracebacks of a log, each with the line that logged it."""
    out = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("Traceback (most recent call last)"):
            start = max(0, i - 1)
            end = i + 1
            while end < len(lines) and (lines[end].startswith((" ", "\t")) or
                                        (not _LINE.match(lines[end]) and lines[end].strip())):
                end += 1
            out.append("\n".join(lines[start:end])[:width])
            if len(out) == limit:
                break
    return out


def gauge_sum(text: str, name: str) -> float:
    """The sum of a metric's samples over its label sets, from Prometheus text."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and line[len(name) : len(name) + 1] in ("{", " "):
            with contextlib.suppress(ValueError, IndexError):
                total += float(line.rsplit(" ", 1)[1])
    return total


async def metrics_text(session: aiohttp.ClientSession, url: str) -> str:
    try:
        async with session.get(url + "/metrics", timeout=aiohttp.ClientTimeout(total=5)) as r:
            return await r.text()
    except (aiohttp.ClientError, TimeoutError, OSError):
        return ""


async def redis_prepare(url: str) -> None:
    """Keep every command over 10 ms in the slow log (its default length, 128, fills up)."""
    import redis.asyncio as aioredis

    r = aioredis.from_url(url)
    try:
        await r.config_set("slowlog-max-len", 100_000)
        await r.config_set("slowlog-log-slower-than", 10_000)
        await r.slowlog_reset()
    finally:
        await r.aclose()


async def redis_figures(url: str) -> dict[str, Any]:
    """Keys, memory and the slow log of a redis-server: commands over 10 ms, over 50 ms, the
    slowest, and which commands they were."""
    import redis.asyncio as aioredis

    r = aioredis.from_url(url)
    try:
        keys = await r.dbsize()
        mem = (await r.info("memory"))["used_memory"]
        slow = await r.slowlog_get(100_000)
        ms = [e["duration"] / 1000 for e in slow]
        names = Counter((e["command"] or b"?").split()[0].decode(errors="replace").upper()
                        for e in slow)
        return {"keys": keys, "used_memory_mb": round(mem / 2**20, 1),
                "commands_over_10ms": len(ms), "over_50ms": sum(1 for x in ms if x > 50),
                "slowest_ms": round(max(ms, default=0), 1), "slow_commands": dict(names)}
    except (OSError, aioredis.RedisError) as exc:
        return {"error": repr(exc)}
    finally:
        await r.aclose()


TCP_STATES = {1: "ESTABLISHED", 2: "SYN_SENT", 3: "SYN_RECV", 4: "FIN_WAIT1", 5: "FIN_WAIT2",
              6: "TIME_WAIT", 7: "CLOSE", 8: "CLOSE_WAIT", 9: "LAST_ACK", 10: "LISTEN",
              11: "CLOSING"}


def tcp_table(text: str) -> dict[int, tuple[int, int, str]]:
    """/proc/net/tcp: socket inode -> (local port, remote port, state)."""
    out = {}
    for line in text.splitlines()[1:]:
        f = line.split()
        if len(f) < 10:
            continue
        lport = int(f[1].rsplit(":", 1)[1], 16)
        rport = int(f[2].rsplit(":", 1)[1], 16)
        out[int(f[9])] = (lport, rport, TCP_STATES.get(int(f[3], 16), f[3]))
    return out


def fd_kinds(pid: int, own_port: int, roles: dict[int, str]) -> dict[str, int]:
    """A process's open descriptors by kind: its TCP sockets by role (`clients`: accepted on
    `own_port`; else the peer's role by its port) and state, the rest by what they are."""
    table: dict[int, tuple[int, int, str]] = {}
    for name in ("tcp", "tcp6"):
        with contextlib.suppress(OSError):
            table.update(tcp_table(Path(f"/proc/{pid}/net/{name}").read_text()))
    kinds: Counter[str] = Counter()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return {}
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        m = re.match(r"socket:\[(\d+)\]", target)
        if m and int(m.group(1)) in table:
            lport, rport, state = table[int(m.group(1))]
            role = ("listener" if state == "LISTEN" else "clients" if lport == own_port
                    else roles.get(rport, "other peers"))
            kinds[f"{role} {state}"] += 1
        else:
            kinds[re.sub(r"[:/\[].*", "", target) or target] += 1
    return dict(kinds.most_common())
