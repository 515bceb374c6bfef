"""Per-backend load as the router sees it: in-flight requests and pending prefill work.

Router-side counts are exact for this router's own traffic and instant; the engines' own gauges
(running + waiting, scraped from /metrics) add load the router did not send (other routers,
direct clients). The difference is kept as `external` and refreshed at each scrape.
"""

from __future__ import annotations

from collections.abc import Callable


class LoadTracker:
    __slots__ = (
        "_external", "_inflight", "_pending", "_remote", "_remote_pending", "on_edge", "on_release",
        "version",
    )

    def __init__(self) -> None:
        self._inflight: dict[str, int] = {}
        self._pending: dict[str, float] = {}
        self._external: dict[str, float] = {}
        # in flight and pending prefill through OTHER router replicas (shared store),
        # refreshed with every shared lookup and on a timer
        self._remote: dict[str, float] = {}
        self._remote_pending: dict[str, float] = {}
        # bumped on every change of this router's own load, so a shared store can tell
        # cheaply whether there is anything new to publish
        self.version = 0
        # called as each request is sent and as it ends: a shared store tells the other
        # routers at once (with the end goes the answer's record, for the next turn)
        self.on_edge: Callable[[], None] | None = None
        # called whenever load may have gone (a prefill over, a request ended, the others'
        # or the engine's own figures read): the dispatch queue releases what now fits
        self.on_release: Callable[[], None] | None = None

    def start(self, backend: str, prefill_tokens: float) -> None:
        self._inflight[backend] = self._inflight.get(backend, 0) + 1
        self._pending[backend] = self._pending.get(backend, 0.0) + prefill_tokens
        self.version += 1
        if self.on_edge is not None:
            self.on_edge()

    def first_byte(self, backend: str, prefill_tokens: float) -> None:
        left = self._pending.get(backend, 0.0) - prefill_tokens
        self._pending[backend] = left if left > 1e-6 else 0.0
        self.version += 1
        if self.on_release is not None:
            self.on_release()

    def finish(self, backend: str) -> None:
        n = self._inflight.get(backend, 0) - 1
        self._inflight[backend] = n if n > 0 else 0
        self.version += 1
        if self.on_edge is not None:
            self.on_edge()
        if self.on_release is not None:
            self.on_release()

    def engine_report(self, backend: str, running_plus_waiting: float) -> None:
        # what the engine runs beyond what the routers we know of sent it
        extra = (
            running_plus_waiting - self._inflight.get(backend, 0) - self._remote.get(backend, 0.0)
        )
        self._external[backend] = extra if extra > 0 else 0.0
        if self.on_release is not None:
            self.on_release()

    def set_remote(self, in_flight: dict[str, float], pending: dict[str, float]) -> None:
        self._remote = in_flight
        self._remote_pending = pending
        if self.on_release is not None:
            self.on_release()

    def own_counts(self) -> dict[str, int]:
        return {b: n for b, n in self._inflight.items() if n}

    def own_snapshot(self) -> dict[str, tuple[int, int]]:
        """This router's (in flight, pending prefill tokens) per busy backend, to publish."""
        pend = self._pending
        return {b: (n, round(pend.get(b, 0.0))) for b, n in self._inflight.items() if n}

    def inflight(self, backend: str) -> float:
        return (
            self._inflight.get(backend, 0)
            + self._remote.get(backend, 0.0)
            + self._external.get(backend, 0.0)
        )

    def own_inflight(self, backend: str) -> int:
        return self._inflight.get(backend, 0)

    def pending_prefill(self, backend: str) -> float:
        return self._pending.get(backend, 0.0) + self._remote_pending.get(backend, 0.0)

    def forget(self, backend: str) -> None:
        self._external.pop(backend, None)
        if not self._inflight.get(backend):
            self._inflight.pop(backend, None)
            self._pending.pop(backend, None)
