"""Which engine holds each stored Responses API response (vLLM keeps a stored response in the
memory of the one server that produced it): a follow-up naming it, and GET, DELETE or cancel
by its id, can only be answered there. Pure: a bounded map, oldest out first, entries expire;
the store shares it between router replicas (redis/ids.py)."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

import xxhash


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
