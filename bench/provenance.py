"""Where, when and with what a benchmark ran: the same code measures differently on the hosts
these sessions ran on (Intel Xeon, AMD EPYC) and on a busy host, so every result names them."""

from __future__ import annotations

import json
import os
import platform
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# The code a result can depend on: a change here not yet committed makes the commit alone
# an incomplete name for what ran. Committed results themselves do not count.
CODE = ("router", "sim", "operator", "bench", "e2e", "charts", "crds", "pyproject.toml",
        ":(exclude)bench/results")


def machine() -> str:
    """CPU model, core count and Python version of this host."""
    cpu = re.search(r"^model name\s*:\s*(.+)$", Path("/proc/cpuinfo").read_text(), re.M)
    return (f"{cpu[1].strip() if cpu else 'unknown cpu'}, {len(os.sched_getaffinity(0))} cores, "
            f"Python {platform.python_version()}")


def now_utc() -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())


def git(*args: str) -> str:
    return subprocess.run(["git", *args], capture_output=True, text=True).stdout.strip()


def stamp(command: str) -> dict[str, Any]:
    """What every result of one invocation carries, written once: the command, the host, the
    commit, and whether the code measured differs from it (`dirty`: a tracked file changed or
    an untracked one added). tests/bench/test_results_provenance.py holds every committed
    result to these fields."""
    commit = git("rev-parse", "--short", "HEAD")
    dirty = bool(git("status", "--porcelain", "--", *CODE))
    return {"command": command, "machine": machine(), "commit": commit, "dirty": dirty,
            "version": commit + (" (modified)" if dirty else "")}


def publish(module: str, argv: list[str] | None, figures: Callable[[], dict[str, Any]],
            path: Path | None) -> dict[str, Any]:
    """A script's result: the command that re-runs it and its provenance, then `figures()`
    (the run), printed and written to `path` when given."""
    command = f"python -m {module} " + shlex.join(sys.argv[1:] if argv is None else argv)
    result = {**stamp(command), "date_utc": now_utc(), **figures()}
    print(json.dumps(result, indent=1))
    if path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=1) + "\n")
    return result
