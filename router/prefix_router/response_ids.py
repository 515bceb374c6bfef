"""Which engine holds each stored Responses API response (vLLM keeps a stored response in the
memory of the one server that produced it): a follow-up naming it, and GET, DELETE or cancel
by its id, can only be answered there. `ResponseIds` is this router's map (pure: bounded,
oldest out first, entries expire); `Holders` puts the store behind it, so every router
replica knows every response."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING

import xxhash

if TYPE_CHECKING:
    from .store import Store


def id_key(response_id: str) -> int:
    """Ids are client-visible strings of any length: the map keeps a 64-bit hash of each."""
    return xxhash.xxh3_64_intdigest(response_id.encode())


class ResponseIds:
    __slots__ = ("_clock", "_held", "_max", "_ttl")

    def __init__(
        self, max_ids: int, ttl_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._max = max_ids
        self._ttl = ttl_s
        self._clock = clock
        self._held: OrderedDict[int, tuple[str, float]] = OrderedDict()  # oldest first

    def remember(self, response_id: str, backend: str) -> None:
        held = self._held
        key = id_key(response_id)
        held[key] = (backend, self._clock() + self._ttl)
        held.move_to_end(key)
        while len(held) > self._max:
            held.popitem(last=False)

    def holder(self, response_id: str) -> str | None:
        got = self._held.get(id_key(response_id))
        if got is None:
            return None
        if got[1] <= self._clock():
            del self._held[id_key(response_id)]
            return None
        return got[0]

    def forget(self, response_id: str) -> None:
        self._held.pop(id_key(response_id), None)

    def __len__(self) -> int:
        return len(self._held)


class Holders:
    """This router's map, and the store's for ids another router saw stored."""

    __slots__ = ("ids", "store", "ttl_s")

    def __init__(self, ids: ResponseIds, store: Store, ttl_s: float) -> None:
        self.ids = ids
        self.store = store
        self.ttl_s = ttl_s

    async def remember(self, response_id: str, backend: str) -> None:
        """Known here at once, and to the other routers once the store has it: the caller
        awaits it before the client can see the id, so no follow-up can outrun it."""
        self.ids.remember(response_id, backend)
        await self.store.remember_response(id_key(response_id), backend, self.ttl_s)

    async def holder(self, response_id: str) -> str | None:
        holder = self.ids.holder(response_id)
        if holder is None:
            holder = await self.store.response_holder(id_key(response_id))
            if holder is not None:
                self.ids.remember(response_id, holder)
        return holder
