"""A model's figures from what its routers publish (contract.RouterFigures): pure aggregation.

Each router replica publishes one hash over the working-set window. The operator turns them
into status.routing (hit rate, cache pressure, load) on a timer; the metrics adapter serves
their totals (working set, in flight) to the HPA. Both read them through totals(), so the two
can never disagree on which routers count or how their figures add up.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from prefix_router.contract import WORKING_SET_WINDOW_S, EngineValues, RouterFigures

# A router silent for a whole working-set window has nothing to say about that window: it is
# gone (stopped, or cut off from the store).
STALE_AFTER_SECONDS = float(WORKING_SET_WINDOW_S)


@dataclass(frozen=True)
class Totals:
    """One model's fleet-wide figures from its fresh routers."""

    routers: int
    prompt_tokens: float
    cached_tokens: float
    working_set_tokens: float
    in_flight: float
    updated_at: float  # the newest publication, unix seconds
    # the engines and how the index knows them, as the router that knows least says: a
    # router that knows an engine only by estimate is the one a request may meet
    engines: int = 0
    exact: int = 0
    degraded: int = 0
    queued: float = 0.0  # requests waiting in the routers' dispatch queues
    oldest_wait_s: float = 0.0  # the longest any of them has waited

    @property
    def demand(self) -> float:
        """In flight plus waiting: the load an autoscaler must serve."""
        return self.in_flight + self.queued


def totals(published: Sequence[RouterFigures], *, now: float,
           stale_after: float = STALE_AFTER_SECONDS) -> Totals | None:
    """None when no router of the model published within `stale_after` seconds."""
    fresh = [f for f in published if now - f.updated_at <= stale_after]
    if not fresh:
        return None
    return Totals(
        routers=len(fresh),
        prompt_tokens=sum(f.prompt_tokens for f in fresh),
        cached_tokens=sum(f.cached_tokens for f in fresh),
        # The routers share one ownership table, so each one's working set is model-wide: the
        # largest is the most complete view, and a sum would count shared prefixes twice.
        working_set_tokens=max(f.working_set_tokens for f in fresh),
        # Each router counts only the requests passing through itself: these add up.
        in_flight=sum(f.in_flight for f in fresh),
        updated_at=max(f.updated_at for f in fresh),
        engines=int(max(f.engines for f in fresh)),
        exact=int(min(f.engines_exact for f in fresh)),
        degraded=int(max(f.engines_degraded for f in fresh)),
        queued=sum(f.queued for f in fresh),
        oldest_wait_s=max(f.oldest_wait_s for f in fresh),
    )


@dataclass(frozen=True)
class IndexStates:
    """How much of the fleet the routers' index knows exactly (index/__init__.py states)."""

    engines: int
    exact: int
    degraded: int

    def as_status(self) -> dict[str, object]:
        return {
            "engines": self.engines,
            "exactEngines": self.exact,
            "estimatedEngines": max(self.engines - self.exact - self.degraded, 0),
            "degradedEngines": self.degraded,
            "indexExact": f"{self.exact}/{self.engines}",  # the printer column
        }


@dataclass(frozen=True)
class Figures:
    """status.routing: what `kubectl get prm` shows."""

    routers: int
    hit_rate: float | None
    cache_pressure: float | None
    load: float | None
    index: IndexStates | None = None
    queued: float | None = None
    oldest_wait_s: float | None = None

    def as_status(self, updated_at: str) -> dict[str, object]:
        out: dict[str, object] = {"routers": self.routers, "updatedAt": updated_at}
        if self.index is not None:
            out.update(self.index.as_status())
        if self.hit_rate is not None:
            out["hitRate"] = self.hit_rate
        if self.cache_pressure is not None:
            out["cachePressure"] = self.cache_pressure
        if self.load is not None:
            out["load"] = self.load
        if self.queued is not None:
            out["queued"] = self.queued
        if self.oldest_wait_s is not None:
            out["oldestWaitSeconds"] = self.oldest_wait_s
        return out


def aggregate(published: Sequence[RouterFigures], *, now: float, ready_replicas: int,
              kv_capacity_tokens: int, stale_after: float = STALE_AFTER_SECONDS) -> Figures:
    """Hit rate, cache pressure (working set / fleet KV capacity) and load (in flight per
    ready model-server replica); None where the inputs cannot say."""
    t = totals(published, now=now, stale_after=stale_after)
    if t is None:
        return Figures(0, None, None, None)
    capacity = ready_replicas * kv_capacity_tokens
    return Figures(
        routers=t.routers,
        hit_rate=round(t.cached_tokens / t.prompt_tokens, 3) if t.prompt_tokens > 0 else None,
        cache_pressure=round(t.working_set_tokens / capacity, 3) if capacity > 0 else None,
        load=round(t.in_flight / ready_replicas, 3) if ready_replicas > 0 else None,
        index=IndexStates(t.engines, t.exact, t.degraded) if t.engines > 0 else None,
        queued=t.queued,
        oldest_wait_s=round(t.oldest_wait_s, 3),
    )


def engine_values(published: Sequence[EngineValues], *, now: float,
                  stale_after: float = STALE_AFTER_SECONDS) -> dict[str, float]:
    """Per engine URL, the prefill tokens a second only it saves, fleet-wide: each router
    counts the requests through itself, so the fresh routers' values add up."""
    out: dict[str, float] = {}
    for p in published:
        if now - p.updated_at > stale_after:
            continue
        for url, value in p.values.items():
            out[url] = out.get(url, 0.0) + value
    return out
