"""The table store: the ownership table behind one small interface, local or shared.

`LocalStore` keeps one OwnershipTable per model in this process. A shared store (Redis) keeps
the same interface so the request path does not change with the deployment.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Protocol

from .table import OwnershipTable


class TableStore(Protocol):
    async def lookup(self, model: str, hashes: Sequence[int]) -> dict[str, int]: ...
    # urgent: news other routers should see at once (a backend newly owning a prefix);
    # a shared store may hold other writes back to batch them
    # known: the leading blocks just recorded for this backend, which a store may skip
    def record(
        self, model: str, hashes: Sequence[int], backend: str, *, urgent: bool = False,
        known: int = 0,
    ) -> None: ...
    def drop_backend(self, backend: str) -> None: ...
    def occupancy(self, model: str, backend: str) -> float: ...
    # seconds since a full backend's coldest block was used (infinity: it has room)
    def tail_age(self, model: str, backend: str) -> float: ...
    def observe(self, prompt_tokens: float, predicted_cached: float) -> None: ...
    def expire(self) -> int: ...
    def entries(self) -> int: ...
    # live router replicas sharing this store (this one included): a Service spreads the
    # requests over them, so one router sees about 1/routers of each prefix's demand
    def routers(self) -> int: ...
    @property
    def degraded(self) -> bool: ...
    async def start(self) -> None: ...
    async def close(self) -> None: ...


class LocalStore:
    def __init__(
        self,
        block_tokens: int,
        capacity_tokens: int,
        ttl: float,
        max_entries: int,
        max_owners: int = 0,
        clock=time.monotonic,
    ) -> None:
        self._args = (block_tokens, capacity_tokens, ttl, max_entries, max_owners)
        self._tables: dict[str, OwnershipTable] = {}
        self._clock = clock

    def table(self, model: str) -> OwnershipTable:
        t = self._tables.get(model)
        if t is None:
            b, c, ttl, m, o = self._args
            t = self._tables[model] = OwnershipTable(b, c, ttl, m, o)
        return t

    async def lookup(self, model: str, hashes: Sequence[int]) -> dict[str, int]:
        t = self._tables.get(model)
        if t is None or not hashes:
            return {}
        return t.match(hashes, self._clock())

    def record(
        self, model: str, hashes: Sequence[int], backend: str, *, urgent: bool = False,
        known: int = 0,
    ) -> None:
        if hashes:
            self.table(model).record(hashes, backend, self._clock())

    def observe(self, prompt_tokens: float, predicted_cached: float) -> None:
        return None  # figures are published only through a shared store

    def occupancy(self, model: str, backend: str) -> float:
        t = self._tables.get(model)
        cap = self._args[1]
        if t is None or cap <= 0:
            return 0.0
        return t.owned_tokens(backend) / cap

    def tail_age(self, model: str, backend: str) -> float:
        t = self._tables.get(model)
        if t is None:
            return float("inf")
        return t.tail_age(backend, self._clock())

    def drop_backend(self, backend: str) -> None:
        for t in self._tables.values():
            t.drop_backend(backend)

    def expire(self) -> int:
        now = self._clock()
        return sum(t.expire(now) for t in self._tables.values())

    def entries(self) -> int:
        return sum(len(t) for t in self._tables.values())

    def routers(self) -> int:
        return 1

    @property
    def degraded(self) -> bool:
        return False

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None
