"""CPU work on a large request runs in a worker thread, one request at a time, so the event
loop keeps answering probes and passing streams on meanwhile.

Parsing and hashing an 8 MiB body takes tens of milliseconds; six at once on the loop kept
`/healthz` waiting for seconds (a liveness probe allows 2). Below the threshold the work is
cheaper than the hop to a thread and runs inline. In the thread the GIL is still shared, but
the loop gets it back every switch interval (5 ms) instead of after the whole job.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

THRESHOLD_BYTES = 256 * 1024


class Offload:
    def __init__(self, threshold: int = THRESHOLD_BYTES) -> None:
        self.threshold = threshold
        self._one = asyncio.Semaphore(1)

    async def run(self, size: int, fn: Callable[..., T], *args: object) -> T:
        if size < self.threshold:
            return fn(*args)
        async with self._one:
            return await asyncio.to_thread(fn, *args)
