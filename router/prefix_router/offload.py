"""CPU work on a large request runs off the event loop, so the loop keeps answering probes and
passing streams on meanwhile.

Parsing and hashing an 8 MiB body takes tens of milliseconds; six at once on the loop kept
`/healthz` waiting for seconds (a liveness probe allows 2). Below `threshold` the work is
cheaper than a hop and runs inline. Above it, it runs in a worker thread, one request at a
time; the loop gets the GIL back every switch interval, except while the thread is inside one
long C call (decoding a multi-megabyte JSON body is one). So work that is safe to run apart
(a module-level function of picklable arguments) and above `process_threshold` goes to one
worker process instead: it shares no GIL with the loop at all.
"""

from __future__ import annotations

import asyncio
import multiprocessing
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from typing import TypeVar

T = TypeVar("T")

THRESHOLD_BYTES = 256 * 1024
PROCESS_THRESHOLD_BYTES = 1024 * 1024


class Offload:
    def __init__(
        self, threshold: int = THRESHOLD_BYTES, process_threshold: int = PROCESS_THRESHOLD_BYTES
    ) -> None:
        self.threshold = threshold
        self.process_threshold = process_threshold
        self._one = asyncio.Semaphore(1)
        self._pool: ProcessPoolExecutor | None = None

    async def run(self, size: int, fn: Callable[..., T], *args: object,
                  apart: bool = False) -> T:  # fmt: skip
        """`apart`: `fn` and its arguments may run in another process."""
        if size < self.threshold:
            return fn(*args)
        if apart and size >= self.process_threshold:
            return await asyncio.get_running_loop().run_in_executor(self._process(), fn, *args)
        async with self._one:
            return await asyncio.to_thread(fn, *args)

    def _process(self) -> ProcessPoolExecutor:
        if self._pool is None:
            # Started by the first large body, not with the router: it costs ~30 MB that a
            # router which never sees one should not carry (bench/results/overhead/).
            # Spawned, not forked: this process has threads (the loop's, ZMQ's).
            ctx = multiprocessing.get_context("spawn")
            self._pool = ProcessPoolExecutor(max_workers=1, mp_context=ctx)
        return self._pool

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
