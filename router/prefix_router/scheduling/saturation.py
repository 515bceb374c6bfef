"""When an engine is saturated: its requests in flight (every router's, and what its own gauges
add) reach its running capacity plus `max_waiting` queued at the engine.

Its running capacity is `max_in_flight` when set; otherwise what the engine itself shows: the
most requests it was seen running, once its own waiting queue was seen over `max_waiting`
(vLLM's num_requests_running beside num_requests_waiting). Until an
engine has shown a waiting queue its capacity is unknown and it is never saturated: an
unsaturated fleet never meets the queue. Pure: fed by the health loop's scrapes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

from ..config import QueueSettings

# Room reported for an engine of unknown capacity: more than any queue holds.
UNBOUNDED = 1 << 30


class Saturation:
    __slots__ = ("_capacity", "_fixed", "_slack", "on_change")

    def __init__(self, s: QueueSettings) -> None:
        self._fixed = s.max_in_flight
        self._slack = s.max_waiting
        self._capacity: dict[str, float] = {}
        # called when an engine's capacity grows (the queue may release more)
        self.on_change: Callable[[], None] | None = None

    def engine_report(self, backend: str, running: float, waiting: float) -> None:
        known = self._capacity.get(backend)
        if running <= 0 or (known is not None and running <= known):
            return  # never lowered: a request waiting out the step in progress beside a free
            # slot looks like a full engine, and a limit too low would keep it from ever
            # running more (a limit too high only leaves a queue at the engine, as before)
        if known is None and waiting <= self._slack:
            return  # no queue at the engine yet: nothing says it is full
        cap = running
        self._capacity[backend] = cap
        if (known is None or cap > known) and self.on_change is not None:
            self.on_change()

    def capacity(self, backend: str) -> float | None:
        if self._fixed:
            return float(self._fixed)
        return self._capacity.get(backend)

    def limit(self, backend: str) -> float | None:
        """Requests in flight at which the engine is saturated; None: unknown (never)."""
        cap = self.capacity(backend)
        return None if cap is None else cap + self._slack

    def room(self, backends: Iterable[str], inflight: Callable[[str], float]) -> int:
        """Requests the engines could take before all are saturated."""
        total = 0
        for b in backends:
            lim = self.limit(b)
            if lim is None:
                return UNBOUNDED
            free = math.floor(lim - inflight(b) + 1e-9)
            if free > 0:
                total += free
        return total

    def forget(self, backend: str) -> None:
        self._capacity.pop(backend, None)
