"""Chains this router has sent and whose engines have not yet answered, shown to the others.

The index records a prompt only once its engine answers (attempt.py); until then each router
holds the chain locally (index/pending.py), so requests right behind it follow it. Another
router does not see that hold, and for a long prompt the window is a whole prefill: on
`customers` at 5-10 req/s three routers sent a request after another router's same-prefix
request to a different backend, and prefilled it twice (bench/results/compare/NOTES.md). So
a hold of a chain new to its backend (not a hit: a hit's new blocks are its own question) is
also written to Redis under the chain's first block, and every lookup merges the holds of
that block: the depth a backend will hold once its prefill ends.

A hold goes out with the send (the load's kick); its release rides on the next write. A hold
whose release was lost (Redis away, the router gone) stops counting after `max_age_s`, and
the next lookup of its block deletes it. Holds are not the index: a failed request's hold
goes and the index is as before.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..contract import StoreKeys
from .scripts import block_hex, chain_hex


class SharedHolds:
    __slots__ = ("_count", "_keys", "_ops", "_up", "_wall", "max_age_s", "router_id")

    def __init__(
        self, keys: StoreKeys, router_id: str, max_age_s: float, wall: Callable[[], float],
        up: Callable[[], bool],
    ) -> None:
        self._keys = keys
        # Written whether or not other routers are known to be live: routers that start
        # together learn of each other a heartbeat later, and the holds of their first
        # requests (the first placement of every hot prefix, a whole prefill long) went
        # unseen, so each placed the same prompts on other engines.
        self._up = up
        self.router_id = router_id
        self.max_age_s = max_age_s
        self._wall = wall
        # (key, field) -> holds of this router behind it; the field is written once
        self._count: dict[tuple[str, str], int] = {}
        # (key, field) -> value to write, or None to delete: the last word per field
        self._ops: dict[tuple[str, str], str | None] = {}

    def _slot(self, model: str, hashes: Sequence[int], backend: str) -> tuple[str, str]:
        key = self._keys.holds_prefix(model) + block_hex(hashes[0])
        return key, f"{self.router_id} {backend} {block_hex(hashes[-1])} {len(hashes)}"

    def hold(self, model: str, hashes: Sequence[int], backend: str) -> None:
        if not self._up():
            return
        slot = self._slot(model, hashes, backend)
        n = self._count.get(slot, 0)
        self._count[slot] = n + 1
        if n == 0:
            self._ops[slot] = f"{self._wall():.3f} {backend} {chain_hex(hashes)}"

    def release(self, model: str, hashes: Sequence[int], backend: str) -> None:
        slot = self._slot(model, hashes, backend)
        n = self._count.get(slot, 0) - 1
        if n < 0:  # held while Redis was away: never written
            return
        if n > 0:
            self._count[slot] = n
            return
        self._count.pop(slot, None)
        self._ops[slot] = None

    def pending(self) -> bool:
        return bool(self._ops)

    def stage(self, pipe: Any) -> None:
        """Queue the writes on `pipe`. A write that fails is not retried: at worst a hold
        counts until `max_age_s`."""
        ops, self._ops = self._ops, {}
        ttl = max(1, round(self.max_age_s))
        for (key, field), value in ops.items():
            if value is None:
                pipe.hdel(key, field)
            else:
                pipe.hset(key, field, value)
                pipe.expire(key, ttl)

    def oldest(self) -> float:
        """Holds written before this (unix s) no longer count."""
        return self._wall() - self.max_age_s
