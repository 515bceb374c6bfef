"""The one place that reads `settings.index`: it builds the prefix index that mode names.

A new mode is one module with a builder (`Parts` -> `PrefixIndex`) and one line in MODES.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ..backends import BackendSet
from ..config import RouterSettings
from ..metrics import RouterMetrics
from ..sizing import Sizing
from ..store import Store
from . import PrefixIndex, decisions, events


@dataclass(slots=True)
class Parts:
    """What a mode's builder may wire its index to."""

    settings: RouterSettings
    store: Store  # where a table shared by router replicas lives (local: none)
    backends: BackendSet  # engines joining and leaving
    metrics: RouterMetrics
    sizing: Sizing  # the capacity models follow the learned block size
    clock: Callable[[], float] = field(default=time.monotonic)

    def model_of(self, backend: str) -> str | None:
        """The model a backend serves, when that is one model (its KV events do not say)."""
        if self.settings.models:
            return self.settings.models[0]
        b = self.backends.get(backend)
        served = b.models if b is not None else frozenset()
        return next(iter(served)) if len(served) == 1 else None


MODES: dict[str, Callable[[Parts], PrefixIndex]] = {
    "approx": decisions.build_approx,
    "corrected": decisions.build_corrected,
    "events": events.build,
}


def build_index(parts: Parts) -> PrefixIndex:
    return MODES[parts.settings.index](parts)
