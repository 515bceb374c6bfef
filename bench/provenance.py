"""Where, when and with what a benchmark ran: every committed result names its host, its time
and the code's version (each run its host's load average too), because the same code measured
differently on the hosts these sessions ran on (Intel Xeon, AMD EPYC) and on a busy host."""

from __future__ import annotations

import contextlib
import os
import platform
import subprocess
import time
from pathlib import Path


def machine() -> str:
    """CPU model, core count and Python version of this host."""
    cpu = "unknown cpu"
    with contextlib.suppress(OSError):
        cpu = next((line.split(":", 1)[1].strip() for line in
                    Path("/proc/cpuinfo").read_text().splitlines()
                    if line.startswith("model name")), cpu)
    return f"{cpu}, {len(os.sched_getaffinity(0))} cores, Python {platform.python_version()}"


def now_utc() -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())


def version() -> str:
    """This tree's commit, and whether the code measured differs from it."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], capture_output=True, text=True).stdout.strip()

    dirty = git("status", "--porcelain", "router", "sim", "bench/harness", "bench/runner.py")
    return git("rev-parse", "--short", "HEAD") + (" (modified)" if dirty else "")


def stamp(command: str) -> dict[str, str]:
    """What every result of one invocation carries, written once."""
    return {"command": command, "machine": machine(), "version": version()}
