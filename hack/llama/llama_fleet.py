"""Start and stop real `llama-server` processes on loopback ports, for tests and benchmarks.

    binary = ensure_binary()                      # builds once (hack/llama/ensure.sh), cached
    model = make_gguf.ensure_model(tokenizer_dir) # tiny random-weight GGUF, cached
    async with LlamaFleet(log_dir) as fleet:
        servers = await fleet.start(3, binary, model, ServerConfig(slots=2, cache_ram_mib=8))
        ... servers[i].url ...

Each server is ready when its `/health` answers 200 (it answers 503 while the model loads);
a server that exits before that is reported with the tail of its log. Stopping is by PID:
SIGTERM, then SIGKILL after a grace period.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

HERE = Path(__file__).resolve().parent
ENSURE_SCRIPT = HERE / "ensure.sh"


def ensure_binary() -> Path:
    """The cached llama-server, built first if missing (that takes minutes: see ensure.sh).

    LLAMA_SERVER=/path/to/llama-server skips the build and uses that binary."""
    if override := os.environ.get("LLAMA_SERVER"):
        return Path(override)
    # ensure.sh downloads the source with pip: this interpreter's pip, so a venv's works.
    env = {**os.environ, "PYTHON": os.environ.get("PYTHON", sys.executable)}
    out = subprocess.run(
        ["bash", str(ENSURE_SCRIPT)], check=True, stdout=subprocess.PIPE, text=True, env=env
    ).stdout
    return Path(out.strip().splitlines()[-1])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass(frozen=True)
class ServerConfig:
    """How one llama-server is started. Its prompt cache has two tiers (docs/real-engine.md):
    `slots` sequences live in the KV cache, each up to `ctx_per_slot` tokens; a slot's prompt is
    saved to a host-RAM prompt cache of `cache_ram_mib` MiB (oldest entry evicted first) when the
    slot is taken for another prompt, and restored from there when a later prompt shares it."""

    slots: int = 1
    ctx_per_slot: int = 4096
    cache_ram_mib: int = 8
    # Reuse of shifted KV chunks of at least this many tokens (0 = off: only a common prefix).
    cache_reuse: int = 0
    # A request goes to the slot whose prompt it matches by at least this fraction, if any.
    slot_prompt_similarity: float = 0.1
    threads: int = 1
    alias: str = "tiny-llama"
    metrics: bool = True
    extra_args: tuple[str, ...] = ()

    def args(self, binary: Path, model: Path, port: int) -> list[str]:
        a = [
            str(binary),
            "--model", str(model),
            "--alias", self.alias,
            "--host", "127.0.0.1",
            "--port", str(port),
            "--parallel", str(self.slots),
            "--ctx-size", str(self.slots * self.ctx_per_slot),
            "--cache-ram", str(self.cache_ram_mib),
            "--cache-reuse", str(self.cache_reuse),
            "--slot-prompt-similarity", str(self.slot_prompt_similarity),
            "--threads", str(self.threads),
            "--threads-batch", str(self.threads),
            "--jinja",
            "--no-webui",
            "--slots",
        ]  # fmt: skip
        if self.metrics:
            a.append("--metrics")
        return [*a, *self.extra_args]


@dataclass
class LlamaServer:
    name: str
    port: int
    process: asyncio.subprocess.Process
    log_path: Path
    config: ServerConfig

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.process.pid

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


class ServerFailed(RuntimeError):
    """A llama-server exited, or was not ready in time; the message holds its log's tail."""


async def wait_ready(server: LlamaServer, timeout: float) -> None:
    """Poll `/health` until it answers 200, the process exits, or `timeout` seconds pass."""
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as http:
        while True:
            if server.process.returncode is not None:
                raise ServerFailed(
                    f"{server.name} exited with {server.process.returncode} before it was ready:"
                    f"\n{server.log_tail()}"
                )
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async with http.get(server.url + "/health") as r:
                    if r.status == 200:
                        return
            if time.monotonic() > deadline:
                raise ServerFailed(
                    f"{server.name} not ready after {timeout:.0f} s:\n{server.log_tail()}"
                )
            await asyncio.sleep(0.1)


@dataclass
class LlamaFleet:
    """The llama-servers this fleet started; `close()` stops every one of them by PID."""

    log_dir: Path
    servers: list[LlamaServer] = field(default_factory=list)

    async def start_one(
        self,
        name: str,
        binary: Path,
        model: Path,
        config: ServerConfig,
        *,
        timeout: float = 180.0,
    ) -> LlamaServer:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        # A free port can be taken between our probe and the server's bind: try a few.
        for attempt in range(3):
            port = free_port()
            log_path = self.log_dir / f"{name}.log"
            with log_path.open("wb") as log:
                proc = await asyncio.create_subprocess_exec(
                    *config.args(binary, model, port),
                    stdout=log,
                    stderr=asyncio.subprocess.STDOUT,
                    stdin=asyncio.subprocess.DEVNULL,
                    start_new_session=True,
                )
            server = LlamaServer(name, port, proc, log_path, config)
            self.servers.append(server)
            try:
                await wait_ready(server, timeout)
                return server
            except ServerFailed:
                await self.stop(server)
                self.servers.remove(server)
                bind_failed = "couldn't bind" in server.log_tail(200).lower()
                if not bind_failed or attempt == 2:
                    raise
        raise AssertionError("unreachable")

    async def start(
        self,
        n: int,
        binary: Path,
        model: Path,
        config: ServerConfig | None = None,
        *,
        prefix: str = "llama",
        timeout: float = 180.0,
    ) -> list[LlamaServer]:
        """Start `n` servers side by side and wait until all are ready."""
        config = config or ServerConfig()
        first = len(self.servers)
        return list(
            await asyncio.gather(
                *(
                    self.start_one(f"{prefix}-{first + i}", binary, model, config, timeout=timeout)
                    for i in range(n)
                )
            )
        )

    async def stop(self, server: LlamaServer, grace: float = 10.0) -> None:
        proc = server.process
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), grace)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()

    async def close(self) -> None:
        await asyncio.gather(*(self.stop(s) for s in self.servers), return_exceptions=True)
        self.servers.clear()

    async def __aenter__(self) -> LlamaFleet:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
