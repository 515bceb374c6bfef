"""Where and when a benchmark ran: every committed result names its host and time, because
the same code measured differently on the hosts these sessions ran on (Intel Xeon, AMD EPYC)."""

from __future__ import annotations

import os
import platform
import time
from pathlib import Path


def machine() -> str:
    """CPU model, core count and Python version of this host."""
    cpu = "unknown cpu"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{cpu}, {cores} cores, Python {platform.python_version()}"


def now_utc() -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())


def stamp() -> dict[str, str]:
    """The `machine` and `measured_at` a result JSON carries."""
    return {"machine": machine(), "measured_at": now_utc()}
