"""Chains sent to a backend whose engine has not yet confirmed taking them.

A request's prompt is recorded in the index only once its engine answers 2xx (attempt.py): a
request that fails, or that the engine refuses, leaves the index as it was. Until then its
chain is held here, counted per sender, so that requests right behind it with the same
prefix follow it to the same backend; the scheduler merges this into every lookup.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import Protocol


class PeerHolds(Protocol):
    """Where the other router replicas see this router's holds (redis/holds.py)."""

    def hold(self, model: str, hashes: Sequence[int], backend: str) -> None: ...
    def release(self, model: str, hashes: Sequence[int], backend: str) -> None: ...


class PendingIndex:
    __slots__ = ("_due", "_held", "shared")

    def __init__(self) -> None:
        self.shared: PeerHolds | None = None  # set where router replicas share an index
        # (model, block hash) -> backend -> senders holding it
        self._held: dict[tuple[str, int], dict[str, int]] = {}
        # holds released at a time, not by their sender: (when, model, hashes, backend)
        self._due: list[tuple[float, str, Sequence[int], str]] = []

    def hold(
        self, model: str, hashes: Sequence[int], backend: str, share: bool = False
    ) -> None:
        """`share`: the other routers are shown it too (a chain new to the backend)."""
        if share and self.shared is not None:
            self.shared.hold(model, hashes, backend)
        held = self._held
        for h in hashes:
            owners = held.get((model, h))
            if owners is None:
                held[(model, h)] = {backend: 1}
            else:
                owners[backend] = owners.get(backend, 0) + 1

    def release(
        self, model: str, hashes: Sequence[int], backend: str, share: bool = False
    ) -> None:
        if share and self.shared is not None:
            self.shared.release(model, hashes, backend)
        held = self._held
        for h in hashes:
            owners = held.get((model, h))
            if owners is None:
                continue
            n = owners.get(backend, 0) - 1
            if n > 0:
                owners[backend] = n
            else:
                owners.pop(backend, None)
                if not owners:
                    del held[(model, h)]

    def hold_until(self, model: str, hashes: Sequence[int], backend: str, when: float) -> None:
        """Hold the chain until `when` (a speculative entry: see attempt.py)."""
        if not hashes:
            return
        self.hold(model, hashes, backend)
        heapq.heappush(self._due, (when, model, hashes, backend))

    def settle(self, model: str, hashes: Sequence[int], backend: str) -> None:
        """The engine's events said what became of these blocks on `backend` (stored, so the
        index has them; or removed): no speculative hold of them stands any longer. A hold
        made since, of the same block, may go with it: the index knows the block by then."""
        held = self._held
        for h in hashes:
            owners = held.get((model, h))
            if owners is not None and owners.pop(backend, None) is not None and not owners:
                del held[(model, h)]

    def expire(self, now: float) -> None:
        due = self._due
        while due and due[0][0] <= now:
            _when, model, hashes, backend = heapq.heappop(due)
            self.release(model, hashes, backend)

    def drop_backend(self, backend: str) -> None:
        """Forget every hold on `backend` (its engine's cache was emptied)."""
        for key in [k for k, owners in self._held.items() if backend in owners]:
            owners = self._held[key]
            del owners[backend]
            if not owners:
                del self._held[key]
        self._due = [d for d in self._due if d[3] != backend]
        heapq.heapify(self._due)

    def merge(self, model: str, hashes: Sequence[int], into: dict[str, int]) -> dict[str, int]:
        """`into` with each backend's depth raised to what is held for it here: from the
        chain's start, or on from the depth `into` gives it (a hold may cover only the blocks
        the index did not have). A copy when anything changes: `into` may be a cached answer."""
        held = self._held
        if not held or not hashes:
            return into
        first = held.get((model, hashes[0]))
        out = into
        for b in (into.keys() | first.keys()) if first else into.keys():
            depth = deeper = into.get(b, 0)
            while deeper < len(hashes) and b in held.get((model, hashes[deeper]), ()):
                deeper += 1
            if deeper > depth:
                if out is into:
                    out = dict(into)
                out[b] = deeper
        return out

    def __len__(self) -> int:
        return len(self._held)
