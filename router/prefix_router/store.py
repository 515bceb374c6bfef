"""Where the router's shared state lives: the prefix index, the other router replicas, and
the figures published for the autoscaler. Local (this process alone) or Redis (every replica
of a model); the request path is the same for both."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .config import RouterSettings
from .index import PrefixIndex
from .index.events import EventsIndex
from .index.local import LocalIndex
from .index.pending import PeerHolds
from .load import LoadTracker


@dataclass(slots=True)
class StoreStats:
    """What /metrics shows of the store."""

    degraded: bool = False
    round_trips: int = 0  # lookups and write-back flushes: the traffic requests cause
    timer_round_trips: int = 0  # load and figures exchanges: a fixed rate per router
    slow_lookups: int = 0  # lookups routed on local state: the store over its budget
    budget_s: float = 0.0  # the lookup budget now
    working_set_tokens: float | None = None  # the model's working set; None while unknown


class Store:
    """This router alone: a local index, no peers, nothing published."""

    def __init__(self, index: PrefixIndex) -> None:
        self.index = index

    # (prompt tokens, predicted cached tokens) of each request served, for the figures
    observe: Callable[[float, float], None] | None = None
    # where the other routers see this one's requests sent and not yet answered
    holds: PeerHolds | None = None

    def requested(self, model: str, hashes: list[int]) -> None:
        """A request asked for this chain (the working set the autoscaler reads)."""

    def stats(self) -> StoreStats:
        return StoreStats()

    async def start(self) -> None:
        await self.index.start()

    async def close(self) -> None:
        await self.index.close()


def local_index(s: RouterSettings) -> LocalIndex:
    if s.index == "events":
        return EventsIndex(
            s.block_size, s.max_table_entries, s.max_owners, tier_costs=s.events.tier_costs
        )
    return LocalIndex(
        s.block_size, s.kv_capacity_tokens, s.ttl_seconds, s.max_table_entries, s.max_owners
    )


def make_store(s: RouterSettings, load: LoadTracker) -> Store:
    if s.store.mode == "redis":
        from .redis import SharedStore  # only imported where a shared store is configured

        return SharedStore(s, load)
    return Store(local_index(s))
