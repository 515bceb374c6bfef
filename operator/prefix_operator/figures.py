"""Live routing figures of one model (hit rate, cache pressure, load): pure aggregation.

Each router replica publishes one Redis hash, `prefixrouter:<namespace>/<name>:router:<id>`,
over a recent window (fields below, numbers as strings). The operator reads them on a timer
and writes the aggregate to status.routing; the metrics adapter reads the same hashes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

ROUTER_KEY_INFIX = "router:"
PROMPT_TOKENS = "prompt_tokens"  # prompt tokens routed in the window
CACHED_TOKENS = "cached_tokens"  # of which predicted to hit a cached prefix
WORKING_SET_TOKENS = "working_set_tokens"  # model-wide working set seen from the shared table
IN_FLIGHT = "in_flight"  # requests in flight through this router now
UPDATED_AT = "updated_at"  # unix seconds of the publication
STALE_AFTER_SECONDS = 60.0


@dataclass(frozen=True)
class Figures:
    routers: int
    hit_rate: float | None
    cache_pressure: float | None
    load: float | None

    def as_status(self, updated_at: str) -> dict[str, object]:
        out: dict[str, object] = {"routers": self.routers, "updatedAt": updated_at}
        if self.hit_rate is not None:
            out["hitRate"] = self.hit_rate
        if self.cache_pressure is not None:
            out["cachePressure"] = self.cache_pressure
        if self.load is not None:
            out["load"] = self.load
        return out


def _num(h: Mapping[str, str], key: str) -> float:
    try:
        return float(h.get(key, 0) or 0)
    except (TypeError, ValueError):
        return 0.0


def aggregate(published: Sequence[Mapping[str, str]], *, now: float, ready_replicas: int,
              kv_capacity_tokens: int, stale_after: float = STALE_AFTER_SECONDS) -> Figures:
    """Combine the routers' publications; a router silent for `stale_after` is gone."""
    fresh = [h for h in published if now - _num(h, UPDATED_AT) <= stale_after]
    if not fresh:
        return Figures(0, None, None, None)
    prompt = sum(_num(h, PROMPT_TOKENS) for h in fresh)
    cached = sum(_num(h, CACHED_TOKENS) for h in fresh)
    hit_rate = round(cached / prompt, 3) if prompt > 0 else None
    # Routers share one ownership table, so each one's working-set figure is model-wide:
    # the largest is the most complete, and summing would count shared prefixes twice.
    working_set = max(_num(h, WORKING_SET_TOKENS) for h in fresh)
    capacity = ready_replicas * kv_capacity_tokens
    pressure = round(working_set / capacity, 3) if capacity > 0 else None
    in_flight = sum(_num(h, IN_FLIGHT) for h in fresh)
    load = round(in_flight / ready_replicas, 3) if ready_replicas > 0 else None
    return Figures(len(fresh), hit_rate, pressure, load)
