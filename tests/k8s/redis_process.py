"""A real redis-server on a free loopback port, for the control-plane tests' cache stores."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator

import redis
from controlplane import free_port
from waiting import wait_until


@contextlib.contextmanager
def running_redis(binary: str, password: str | None = None) -> Iterator[int]:
    """Start redis-server, wait until it answers PING, yield its port, stop it."""
    port = free_port()
    args = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
            "--appendonly", "no"]
    if password:
        args += ["--requirepass", password]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = redis.Redis(port=port, password=password)

    def answers() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"redis-server exited ({proc.returncode})")
        return bool(client.ping())

    try:
        wait_until(answers, 10, f"redis-server on port {port} to answer PING", interval=0.05)
        yield port
    finally:
        client.close()
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
