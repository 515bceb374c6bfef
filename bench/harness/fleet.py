"""Start and stop local processes for a benchmark (simulators, routers, redis-server, on
127.0.0.1), and read what they cost (CPU, memory) from /proc."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used so far (0.0 once it is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    # comm may hold spaces and parentheses; the fields after the last ")" cannot
    fields = stat.rsplit(")", 1)[1].split()
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
    # a simulator's KV events: "tcp://127.0.0.1:P,tcp://127.0.0.1:R" (publisher, replay), as
    # the router's `events.endpoints` takes them
    events: str = ""


@dataclass
class Fleet:
    log_dir: Path
    procs: list[Proc] = field(default_factory=list)

    async def spawn(self, name: str, url: str, args: list[str],
                    env: dict[str, str] | None = None) -> Proc:
        """A process of its own session (so a stop reaches its children), output to its log."""
        self.procs.append(await self._exec(name, url, args, env, "wb"))
        return self.procs[-1]

    async def _exec(self, name: str, url: str, args: list[str], env: dict[str, str] | None,
                    mode: str) -> Proc:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.log_dir / f"{name.replace('/', '_')}.log"  # a setup's name may hold a path
        with log_path.open(mode) as log:
            proc = await asyncio.create_subprocess_exec(
                *args, stdout=log, stderr=asyncio.subprocess.STDOUT,
                env={**os.environ, **(env or {})}, start_new_session=True)
        return Proc(name, url, proc, log_path, args, env)

    async def restart(self, p: Proc, health: str = "/health", timeout: float = 60.0) -> Proc:
        """`p` killed (SIGKILL, as a crashed or evicted pod) and started again with the same
        arguments, so on the same ports: a new process with an empty cache (a simulator's
        event sequence starts again at 0). It takes `p`'s place in `procs`; its log goes on."""
        await self.stop(p, "kill")
        new = await self._exec(p.name, p.url, p.args, p.env, "ab")
        new.events = p.events
        self.procs[self.procs.index(p)] = new
        await wait_healthy(new, health, timeout)
        return new

    async def start(self, name: str, args: list[str], port: int, health: str, *,
                    env: dict[str, str] | None = None, timeout: float = 30.0) -> Proc:
        p = await self.spawn(name, f"http://127.0.0.1:{port}", args, env)
        await wait_healthy(p, health, timeout)
        return p

    async def start_sim(self, name: str, *, model: str, kv_capacity: int, profile: str,
                        time_scale: float, max_num_seqs: int = 256,
                        extra: list[str] | None = None, port: int | None = None,
                        kv_events: bool = False) -> Proc:
        """One simulator; `kv_events`: publishing its KV events as vLLM does, on two free
        loopback ports of its own (the Proc's `events`)."""
        port = port or free_port()
        args = [sys.executable, "-m", "engine_sim", "--host", "127.0.0.1", "--port", str(port),
                "--model", model, "--kv-capacity-tokens", str(kv_capacity), "--profile", profile,
                "--time-scale", str(time_scale), "--max-num-seqs", str(max_num_seqs),
                "--replica-id", name, *(extra or [])]
        events = ""
        if kv_events:
            pub, replay = (f"tcp://127.0.0.1:{free_port()}" for _ in range(2))
            args += ["--kv-events-config", json.dumps({
                "enable_kv_cache_events": True, "publisher": "zmq", "endpoint": pub,
                "replay_endpoint": replay})]
            events = f"{pub},{replay}"
        p = await self.start(name, args, port, "/health")
        p.events = events
        return p

    async def start_router(self, name: str, backends: list[str], *, policy: str,
                           kv_capacity: int, extra: list[str] | None = None,
                           env: dict[str, str] | None = None) -> Proc:
        port = free_port()
        args = [sys.executable, "-m", "prefix_router", "--host", "127.0.0.1", "--port", str(port),
                "--policy", policy, "--kv-capacity-tokens", str(kv_capacity),
                "--backend", ",".join(backends), "--log-level", "warning", *(extra or [])]
        return await self.start(name, args, port, "/readyz", env=env)

    async def start_redis(self, name: str = "redis", port: int | None = None) -> str:
        """A throw-away redis-server (no persistence) on `port` or a free one; returns its URL.

        Its Proc is in `procs` under `name` (to kill it, and start another on the same port)."""
        import shutil

        exe = shutil.which("redis-server")
        if exe is None:
            raise RuntimeError("redis-server is not installed (apt-get install redis-server)")
        port = port or free_port()
        await self.spawn(name, f"redis://127.0.0.1:{port}", [
            exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
        for _ in range(100):
            try:
                _r, w = await asyncio.open_connection("127.0.0.1", port)
                w.close()
                return f"redis://127.0.0.1:{port}/0"
            except OSError:
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

    async def __aenter__(self) -> Fleet:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


async def wait_healthy(p: Proc, path: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as s:
        while time.monotonic() < deadline:
            if p.process.returncode is not None:
                raise RuntimeError(f"{p.name} exited with {p.process.returncode}: "
                                   f"{p.log_path.read_text()[-2000:]}")
            with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError):
                async with s.get(p.url + path, timeout=aiohttp.ClientTimeout(total=1)) as r:
                    if r.status == 200:
                        return
            await asyncio.sleep(0.1)
    raise RuntimeError(f"{p.name} did not become healthy at {p.url}{path} in {timeout}s: "
                       f"{p.log_path.read_text()[-2000:]}")


def process_tree(pid: int) -> list[int]:
    """`pid` and its descendants. The anchors route in their Python launcher's own process
    (the Rust router is an extension module), but a launcher that forked would hide the
    router's memory from a look at the one pid."""
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            with contextlib.suppress(OSError):
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(d.name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out


def parse_status(text: str) -> dict[str, int]:
    """The `Vm*` lines of /proc/<pid>/status, in kB."""
    pairs = (line.partition(":")[::2] for line in text.splitlines())
    return {k: int(v.split()[0]) for k, v in pairs if k.startswith("Vm") and v.endswith("kB")}


def memory_of(pid: int) -> dict[str, float]:
    """VmRSS and VmHWM (peak RSS) of the process tree at `pid`, in MB, and its process count.
    Over several processes the peak is the sum of their peaks: an upper bound of the tree's."""
    vms = []
    for p in process_tree(pid):
        with contextlib.suppress(OSError):  # exited meanwhile
            vms.append(parse_status(Path(f"/proc/{p}/status").read_text()))
    return {"rss_mb": round(sum(v.get("VmRSS", 0) for v in vms) / 1024, 1),
            "peak_rss_mb": round(sum(v.get("VmHWM", 0) for v in vms) / 1024, 1),
            "processes": len(vms)}
