"""Each engine's index state, and the engines found emptied behind their address.

The health loop hands over each engine's /metrics page, attempts each answer's cached-token
evidence; the restart detector (restarts.py) reads them, and an engine it finds emptied has
its entries dropped at once (`PrefixIndex.drop_backend`: with a shared store, for every router
replica). An engine's state is the index's (EXACT, ESTIMATED, DEGRADED), or DEGRADED while the
detector suspects it (asleep, a shortfall streak under way). /metrics and the figures the
operator reads show it per engine.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from .index import DEGRADED, EXACT, PrefixIndex
from .restarts import RestartDetector, read_vitals

log = logging.getLogger("prefix_router.engine_states")


class EngineStates:
    def __init__(
        self,
        index: PrefixIndex,
        detector: RestartDetector,
        members: Callable[[], list[str]],
        on_drop: Callable[[str, str], None] = lambda backend, why: None,
    ) -> None:
        self._index = index
        self._detector = detector
        self._members = members  # the engines the router knows now
        self._on_drop = on_drop  # (backend, reason): counted in /metrics
        self.dropped: list[tuple[str, str]] = []  # (backend, reason), the latest last

    def scraped(self, backend: str, page: bytes) -> None:
        """An engine's /metrics page, as the health loop scraped it."""
        why = self._detector.scraped(backend, read_vitals(page))
        if why is not None:
            self._drop(backend, why)

    def answered(self, backend: str, prefix: int, predicted: int, held: int) -> None:
        """An answer's evidence in blocks: held of the predicted leading blocks of the prefix
        (its first block's hash). Not taken
        where the engine's KV events say what it holds (EXACT): they are better evidence,
        and a shortfall there is the router's own speculative entry, not a lost cache."""
        if self._index.state(backend) == EXACT:
            return
        why = self._detector.answered(backend, prefix, predicted, held)
        if why is not None:
            self._drop(backend, why)

    def _drop(self, backend: str, why: str) -> None:
        log.warning("%s came back empty (%s): its index entries dropped", backend, why)
        self._index.drop_backend(backend)
        self.dropped = [*self.dropped[-99:], (backend, why)]
        self._on_drop(backend, why)

    def forget(self, backend: str) -> None:
        self._detector.forget(backend)

    def state(self, backend: str) -> str:
        if self._detector.suspected(backend):
            return DEGRADED
        return self._index.state(backend)

    def states(self) -> dict[str, str]:
        return {b: self.state(b) for b in self._members()}

    def counts(self) -> tuple[int, int, int]:
        """(engines, EXACT, DEGRADED): the figures the operator shows (the rest ESTIMATED)."""
        states = list(self.states().values())
        return len(states), states.count(EXACT), states.count(DEGRADED)
