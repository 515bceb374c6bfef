"""Start and stop local processes for a benchmark: simulators and routers, on 127.0.0.1."""

from __future__ import annotations

import asyncio
import contextlib
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


@dataclass
class Fleet:
    log_dir: Path
    procs: list[Proc] = field(default_factory=list)

    async def start(
        self,
        name: str,
        args: list[str],
        port: int,
        health: str,
        *,
        env: dict[str, str] | None = None,
        timeout: float = 30.0,
    ) -> Proc:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.log_dir / f"{name}.log"
        log = log_path.open("wb")
        proc = await asyncio.create_subprocess_exec(
            *args,
            stdout=log,
            stderr=asyncio.subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )
        log.close()
        p = Proc(name, f"http://127.0.0.1:{port}", proc, log_path)
        self.procs.append(p)
        await wait_healthy(p, health, timeout)
        return p

    async def start_sim(
        self,
        name: str,
        *,
        model: str,
        kv_capacity: int,
        profile: str,
        time_scale: float,
        max_num_seqs: int = 256,
        extra: list[str] | None = None,
        port: int | None = None,
    ) -> Proc:
        port = port or free_port()
        args = [
            sys.executable,
            "-m",
            "engine_sim",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--model",
            model,
            "--kv-capacity-tokens",
            str(kv_capacity),
            "--profile",
            profile,
            "--time-scale",
            str(time_scale),
            "--max-num-seqs",
            str(max_num_seqs),
            "--replica-id",
            name,
            *(extra or []),
        ]
        return await self.start(name, args, port, "/health")

    async def start_router(
        self,
        name: str,
        backends: list[str],
        *,
        policy: str,
        kv_capacity: int,
        extra: list[str] | None = None,
        env: dict[str, str] | None = None,
    ) -> Proc:
        port = free_port()
        args = [
            sys.executable,
            "-m",
            "prefix_router",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--policy",
            policy,
            "--kv-capacity-tokens",
            str(kv_capacity),
            "--backend",
            ",".join(backends),
            "--log-level",
            "warning",
            *(extra or []),
        ]
        return await self.start(name, args, port, "/readyz", env=env)

    async def start_redis(self, name: str = "redis", port: int | None = None) -> str:
        """A throw-away redis-server (no persistence) on `port` or a free one; returns its URL.

        Its Proc is in `procs` under `name` (to kill it, and start another on the same port)."""
        import shutil

        exe = shutil.which("redis-server")
        if exe is None:
            raise RuntimeError("redis-server is not installed (apt-get install redis-server)")
        port = port or free_port()
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.log_dir / f"{name}.log"
        log = log_path.open("wb")
        proc = await asyncio.create_subprocess_exec(
            exe,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            stdout=log,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        self.procs.append(Proc(name, f"redis://127.0.0.1:{port}", proc, log_path))
        for _ in range(100):
            try:
                _r, w = await asyncio.open_connection("127.0.0.1", port)
                w.close()
                return f"redis://127.0.0.1:{port}/0"
            except OSError:
                await asyncio.sleep(0.05)
        raise RuntimeError("redis-server did not start")

    async def stop(self, p: Proc, sig: str = "term") -> None:
        if p.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                if sig == "kill":
                    p.process.kill()
                else:
                    p.process.terminate()
            try:
                await asyncio.wait_for(p.process.wait(), 10)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    p.process.kill()
                await p.process.wait()

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
                raise RuntimeError(
                    f"{p.name} exited with {p.process.returncode}: {p.log_path.read_text()[-2000:]}"
                )
            with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError):
                async with s.get(p.url + path, timeout=aiohttp.ClientTimeout(total=1)) as r:
                    if r.status == 200:
                        return
            await asyncio.sleep(0.1)
    raise RuntimeError(
        f"{p.name} did not become healthy at {p.url}{path} in {timeout}s: "
        f"{p.log_path.read_text()[-2000:]}"
    )
