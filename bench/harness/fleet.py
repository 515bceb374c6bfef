"""Local processes for a benchmark (simulators, routers, redis-server, on 127.0.0.1), and what
they cost (CPU, memory), read from /proc."""

import asyncio
import contextlib
import json
import os
import shutil
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

import aiohttp


def _stat(pid: int) -> list[str]:
    # comm may hold spaces and parentheses; the fields after the last ")" cannot
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used so far (0.0 once it is gone)."""
    try:
        fields = _stat(pid)
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Proc:
    name: str
    url: str
    process: asyncio.subprocess.Process
    log_path: Path
    args: list[str] = field(default_factory=list)  # how it was started (to restart it)
    env: dict[str, str] | None = None
    # a simulator's KV events "tcp://127.0.0.1:P,tcp://127.0.0.1:R" (publisher, replay), as
    # the router's `events.endpoints` takes them
    events: str = ""
    # a router's /metrics page (on a port of its own)
    metrics: str = ""


@dataclass
class Fleet:
    log_dir: Path
    procs: list[Proc] = field(default_factory=list)

    async def spawn(self, name: str, url: str, args: list[str],
                    env: dict[str, str] | None = None, log_mode: str = "wb") -> Proc:
        """A process of its own session (so a stop reaches its children), output to its log."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.log_dir / f"{name.replace('/', '_')}.log"  # a setup's name may hold a path
        with log_path.open(log_mode) as log:
            process = await asyncio.create_subprocess_exec(
                *args, stdout=log, stderr=asyncio.subprocess.STDOUT,
                env={**os.environ, **(env or {})}, start_new_session=True)
        self.procs.append(Proc(name, url, process, log_path, args, env))
        return self.procs[-1]

    async def restart(self, p: Proc) -> Proc:
        """`p` killed (as a crashed pod) and started again with the same arguments and ports,
        its cache empty: `p` holds the new process, its log goes on."""
        await self.stop(p, "kill")
        await self.spawn(p.name, p.url, p.args, p.env, log_mode="ab")
        p.process = self.procs.pop().process  # the spawned Proc's, in p's place
        await wait_healthy(p, "/health", 60.0)
        return p

    async def start(self, name: str, args: list[str], port: int, health: str, *,
                    env: dict[str, str] | None = None, timeout: float = 30.0,
                    ready: Callable[[str], bool] | None = None) -> Proc:
        """Started, once `health` answers 200 (with a body that is `ready`)."""
        p = await self.spawn(name, f"http://127.0.0.1:{port}", args, env)
        await wait_healthy(p, health, timeout, ready)
        return p

    async def start_sim(self, name: str, *, model: str, kv_capacity: int, profile: str,
                        time_scale: float, extra: list[str] | None = None,
                        port: int | None = None, kv_events: bool = False) -> Proc:
        """One simulator; `kv_events`: it publishes its KV events as vLLM does, on two free
        ports of its own (the Proc's `events`)."""
        port = port or free_port()
        args = [sys.executable, "-m", "engine_sim", "--host", "127.0.0.1", "--port", str(port),
                "--model", model, "--kv-capacity-tokens", str(kv_capacity), "--profile", profile,
                "--time-scale", str(time_scale), "--replica-id", name, *(extra or [])]
        if kv_events:
            pub, replay = (f"tcp://127.0.0.1:{free_port()}" for _ in range(2))
            args += ["--kv-events-config", json.dumps({
                "enable_kv_cache_events": True, "publisher": "zmq", "endpoint": pub,
                "replay_endpoint": replay})]
        p = await self.start(name, args, port, "/health")
        if kv_events:
            p.events = f"{pub},{replay}"
        return p

    async def start_router(self, name: str, backends: list[str] | Path, *, policy: str,
                           kv_capacity: int, extra: list[str] | None = None,
                           env: dict[str, str] | None = None) -> Proc:
        """Our router on `backends`: a list, or a file it re-reads (file discovery, so engines
        can come and go)."""
        port, metrics = free_port(), free_port()
        where = (["--discovery", "file", "--backends-file", str(backends)]
                 if isinstance(backends, Path) else ["--backend", ",".join(backends)])
        args = [sys.executable, "-m", "prefix_router", "--host", "127.0.0.1", "--port", str(port),
                "--metrics-port", str(metrics),
                "--policy", policy, "--kv-capacity-tokens", str(kv_capacity),
                *where, "--log-level", "warning", *(extra or [])]
        p = await self.start(name, args, port, "/readyz", env=env)
        p.metrics = f"http://127.0.0.1:{metrics}/metrics"
        return p

    async def start_redis(self, name: str = "redis", port: int | None = None) -> str:
        """A throw-away redis-server (no persistence) in `procs` as `name`; returns its URL."""
        if (exe := shutil.which("redis-server")) is None:
            raise RuntimeError("redis-server is not installed (apt-get install redis-server)")
        port = port or free_port()
        await self.spawn(name, f"redis://127.0.0.1:{port}", [
            exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
        for _ in range(100):
            with contextlib.suppress(OSError):
                _, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.close()
                return f"redis://127.0.0.1:{port}/0"
            await asyncio.sleep(0.05)
        raise RuntimeError("redis-server did not start")

    async def stop(self, p: Proc, sig: str = "term") -> None:
        """SIGTERM (or SIGKILL), then SIGKILL if it has not exited in 10 s."""
        for send, wait in ((p.process.kill if sig == "kill" else p.process.terminate, 10),
                           (p.process.kill, None)):
            if p.process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    send()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(p.process.wait(), wait)

    def proc(self, name: str) -> Proc:
        return next(p for p in self.procs if p.name == name)

    async def close(self) -> None:
        await asyncio.gather(*(self.stop(p) for p in self.procs), return_exceptions=True)
        self.procs.clear()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


async def wait_healthy(p: Proc, path: str, timeout: float,
                       ready: Callable[[str], bool] | None = None) -> None:
    deadline, body = time.monotonic() + timeout, ""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as s:
        while time.monotonic() < deadline and p.process.returncode is None:
            with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError, ValueError):
                async with s.get(p.url + path) as r:
                    body = await r.text()
                    if r.status == 200 and (ready is None or ready(body)):
                        return
            await asyncio.sleep(0.1)
    why = (f"exited with {p.process.returncode}" if p.process.returncode is not None
           else f"not ready at {p.url}{path} in {timeout}s (it said {body[:300]!r})")
    raise RuntimeError(f"{p.name} {why}: {p.log_path.read_text()[-2000:]}")


def parse_status(text: str) -> dict[str, int]:
    """The `Vm*` lines of /proc/<pid>/status, in kB."""
    pairs = (line.partition(":")[::2] for line in text.splitlines())
    return {k: int(v.split()[0]) for k, v in pairs if k.startswith("Vm") and v.endswith("kB")}


def memory_of(pid: int) -> dict[str, float]:
    """VmRSS and VmHWM (peak RSS) in MB of the process tree at `pid` (a launcher that forked
    would hide the router's memory), the sum of peaks an upper bound; and its process count."""
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        with contextlib.suppress(OSError, ValueError):  # not a process, or gone
            children.setdefault(int(_stat(int(d.name))[1]), []).append(int(d.name))
    vms, todo = [], [pid]
    while todo:
        p = todo.pop()
        todo += children.get(p, [])
        with contextlib.suppress(OSError):  # exited meanwhile
            vms.append(parse_status(Path(f"/proc/{p}/status").read_text()))
    return {"rss_mb": round(sum(v.get("VmRSS", 0) for v in vms) / 1024, 1),
            "peak_rss_mb": round(sum(v.get("VmHWM", 0) for v in vms) / 1024, 1),
            "processes": len(vms)}
