"""How long a test may wait, in one place, and waits on conditions instead of sleeps.

Every timeout is a figure that holds on an idle machine times one factor, scale():
$PREFIXROUTER_TEST_TIMEOUT_SCALE when set, else the machine's load (the one-minute load
average per core), never below 1 nor, unless set, above MAX_AUTO_SCALE. A timeout only bounds
the wait for something that does happen; it never decides what passes, so a larger factor
costs nothing on a good run and spares a false failure on a busy machine (a deletion that takes
21 s alone took over 30 s beside other jobs).

    wait_until(lambda: obj_is_ready(), 60, "the model Ready")   # 60 s x scale()
    await until(router_sees_two_backends, 30, "two backends")    # the same, async
"""

from __future__ import annotations

import asyncio
import inspect
import math
import os
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

SCALE_ENV = "PREFIXROUTER_TEST_TIMEOUT_SCALE"
MAX_AUTO_SCALE = 4.0

T = TypeVar("T")


class WaitTimeout(AssertionError):
    """A condition did not hold within its (scaled) timeout."""


def scale() -> float:
    raw = os.environ.get(SCALE_ENV, "").strip()
    if raw:
        return max(1.0, float(raw))
    try:
        per_core = os.getloadavg()[0] / (os.cpu_count() or 1)
    except OSError:  # no load average on this platform
        per_core = 1.0
    return min(MAX_AUTO_SCALE, max(1.0, per_core))


def scaled(seconds: float) -> float:
    return seconds * scale()


def kubectl_timeout(seconds: float) -> str:
    """kubectl's and helm's --timeout value for a wait of `seconds` (scaled)."""
    return f"{math.ceil(scaled(seconds))}s"


class _Wait:
    """One wait's deadline, and what the predicate last said, for the message on timeout."""

    def __init__(self, timeout: float, what: str) -> None:
        self.limit = scaled(timeout)
        self.deadline = time.monotonic() + self.limit
        self.what = what
        self.last: object = None
        self.error: Exception | None = None

    def saw(self, value: object) -> bool:
        self.last, self.error = value, None
        return bool(value)

    def failed(self, error: Exception) -> None:
        # An AssertionError is a definite failure (a process that exited, say), not "not yet".
        if isinstance(error, AssertionError):
            raise error
        self.error = error

    def check(self) -> None:
        if time.monotonic() > self.deadline:
            detail = f"last error: {self.error!r}" if self.error else f"last value: {self.last!r}"
            raise WaitTimeout(f"timed out after {self.limit:.0f}s waiting for {self.what} "
                              f"({detail})")


def wait_until(predicate: Callable[[], T], timeout: float, what: str,
               interval: float = 0.2) -> T:
    """Poll `predicate` until it returns something truthy and return that. An AssertionError
    from it ends the wait at once; other exceptions count as "not yet" (the last one is
    reported on timeout)."""
    wait = _Wait(timeout, what)
    while True:
        try:
            value = predicate()
            if wait.saw(value):
                return value
        except Exception as e:
            wait.failed(e)
        wait.check()
        time.sleep(interval)


async def until(predicate: Callable[[], T | Awaitable[T]], timeout: float, what: str,
                interval: float = 0.2) -> T:
    """wait_until for the event loop: `predicate` may be a plain or an async function."""
    wait = _Wait(timeout, what)
    while True:
        try:
            value = predicate()
            if inspect.isawaitable(value):
                value = await value
            if wait.saw(value):
                return value  # type: ignore[return-value]
        except Exception as e:
            wait.failed(e)
        wait.check()
        await asyncio.sleep(interval)
