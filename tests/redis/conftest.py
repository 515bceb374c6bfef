"""A real redis-server per test on a free port (installed by `make test` when absent)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from bench.harness.fleet import free_port as _free_port


@dataclass
class RedisServer:
    port: int
    dir: Path
    password: str | None = None
    proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        exe = shutil.which("redis-server")
        if exe is None:
            pytest.fail(
                "redis-server is not installed: run `make test` (it installs it) or "
                "apt-get install redis-server",
                pytrace=False,
            )
        args = [
            exe,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(self.dir),
        ]
        if self.password:
            args += ["--requirepass", self.password]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), 0.2) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(64):
                        return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("redis-server did not start")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    srv = RedisServer(_free_port(), tmp_path)
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture
def make_redis(tmp_path: Path) -> Iterator:
    """Start extra servers (e.g. with a password); all stopped at the end."""
    started: list[RedisServer] = []

    def make(password: str | None = None) -> RedisServer:
        d = tmp_path / f"r{len(started)}"
        d.mkdir()
        srv = RedisServer(_free_port(), d, password)
        srv.start()
        started.append(srv)
        return srv

    yield make
    for srv in started:
        srv.stop()
