"""Which engine holds each stored Responses API response (vLLM keeps a stored response in the
memory of the one server that produced it): a follow-up naming it, and GET, DELETE or cancel
by its id, can only be answered there. `ResponseIds` is this router's map (pure: bounded,
oldest out first, entries expire); `Holders` puts the store behind it, so every router
replica knows every response.

Lean because it is large (half a million ids by default): an id is a dict entry from its
60-bit hash to its engine's number (a small int, shared), and the hash's place in a queue of
first-remembered order. Its TTL counts from when it was first remembered, kept per second
(a queue of [second, ids remembered in it]), so no id carries a time of its own: an id
leaves within a second past its TTL. bench/results/api/README.md has the bytes an id.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

import xxhash

if TYPE_CHECKING:
    from .store import Store


def id_key(response_id: str) -> int:
    """Ids are client-visible strings of any length: the map keeps a 64-bit hash of each."""
    return xxhash.xxh3_64_intdigest(response_id.encode())


def _local(response_id: str) -> int:
    # 60 bits: CPython keeps an int under 2**60 in two 30-bit digits (32 bytes, not 40)
    return id_key(response_id) >> 4


class ResponseIds:
    __slots__ = ("_backends", "_clock", "_held", "_max", "_number", "_order", "_seconds", "_ttl")

    def __init__(
        self, max_ids: int, ttl_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._max = max_ids
        self._ttl = ttl_s
        self._clock = clock
        self._held: dict[int, int] = {}  # key -> engine number
        self._order: deque[int] = deque()  # keys, first remembered first
        self._seconds: deque[list[int]] = deque()  # [second, keys of _order from it], oldest first
        self._backends: list[str] = []  # engine number -> URL
        self._number: dict[str, int] = {}

    def _backend(self, url: str) -> int:
        n = self._number.get(url)
        if n is None:
            n = self._number[url] = len(self._backends)
            self._backends.append(url)
        return n

    def _drop_oldest(self) -> None:
        self._held.pop(self._order.popleft(), None)
        first = self._seconds[0]
        first[1] -= 1
        if not first[1]:
            self._seconds.popleft()

    def _expire(self, now: float) -> None:
        # a second's ids all go once its end is a TTL ago
        seconds = self._seconds
        while seconds and seconds[0][0] + 1 + self._ttl <= now:
            self._drop_oldest()

    def remember(self, response_id: str, backend: str) -> None:
        now = self._clock()
        self._expire(now)
        held = self._held
        key = _local(response_id)
        if key not in held:
            self._order.append(key)
            second = int(now)
            if self._seconds and self._seconds[-1][0] == second:
                self._seconds[-1][1] += 1
            else:
                self._seconds.append([second, 1])
        held[key] = self._backend(backend)
        while len(held) > self._max:
            self._drop_oldest()

    def holder(self, response_id: str) -> str | None:
        self._expire(self._clock())
        n = self._held.get(_local(response_id))
        return None if n is None else self._backends[n]

    def forget(self, response_id: str) -> None:
        # its place in the order goes when it reaches the front
        self._held.pop(_local(response_id), None)

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
