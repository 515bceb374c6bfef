"""Where the router's shared state lives: the other router replicas, their load, a prefix
table shared by all (for the index modes that keep one: index/factory.py), and the figures
published for the autoscaler. Local (this process alone) or Redis (every replica of a model);
the request path is the same for both."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from .config import RouterSettings
from .index import Ownership
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
    """This router alone: a local table, no peers, nothing published."""

    # (prompt tokens, predicted cached tokens) of each request served, for the figures
    observe: Callable[[float, float], None] | None = None
    # where the other routers see this one's requests sent and not yet answered
    holds: PeerHolds | None = None
    # per engine, what only it holds (fleet_value.py): published for the operator
    engine_values: Callable[[], Mapping[str, float]] | None = None

    def table(self, local: LocalIndex) -> Ownership:
        """The prefix table the router's decisions go to (`local`: this process's own)."""
        return local

    def requested(self, model: str, hashes: list[int]) -> None:
        """A request asked for this chain (the working set the autoscaler reads)."""

    async def remember_response(self, id_hash: int, backend: str, ttl_s: float) -> None:
        """The other routers learn which engine holds this stored response."""

    async def response_holder(self, id_hash: int) -> str | None:
        """The engine another router saw store this response (None: none did)."""
        return None
    def watch_states(self, read: Callable[[], tuple[int, int, int]]) -> None:
        """(engines, EXACT, DEGRADED) of the index, read for each publication of figures."""

    def stats(self) -> StoreStats:
        return StoreStats()

    def show_demand(self, read: Callable[[], tuple[int, float]]) -> None:
        """The dispatch queue's (requests waiting, oldest wait), for the figures."""

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None


def make_store(s: RouterSettings, load: LoadTracker) -> Store:
    if s.store.mode == "redis":
        from .redis import SharedStore  # only imported where a shared store is configured

        return SharedStore(s, load)
    return Store()
