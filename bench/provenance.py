"""Where, when and with what a benchmark ran: the same code measures differently on the hosts
these sessions ran on (Intel Xeon, AMD EPYC) and on a busy host, so every result names them."""

from __future__ import annotations

import os
import platform
import re
import subprocess
import time
from pathlib import Path


def machine() -> str:
    """CPU model, core count and Python version of this host."""
    cpu = re.search(r"^model name\s*:\s*(.+)$", Path("/proc/cpuinfo").read_text(), re.M)
    return (f"{cpu[1].strip() if cpu else 'unknown cpu'}, {len(os.sched_getaffinity(0))} cores, "
            f"Python {platform.python_version()}")


def now_utc() -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())


def git(*args: str) -> str:
    return subprocess.run(["git", *args], capture_output=True, text=True).stdout.strip()


def stamp(command: str) -> dict[str, str]:
    """What every result of one invocation carries, written once: the commit, and whether the
    code measured differs from it."""
    dirty = git("status", "--porcelain", "router", "sim", "bench/harness", "bench/runner.py")
    return {"command": command, "machine": machine(),
            "version": git("rev-parse", "--short", "HEAD") + (" (modified)" if dirty else "")}
