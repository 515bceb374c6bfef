"""The prefix index: which backends hold which prefix blocks, as far as the router can tell.

One interface, several implementations: the local table of this router process
(`LocalIndex`; `EventsIndex` when the engines' KV events feed it), the table every router
replica shares through Redis (`redis/`), and, in front of either, the chains of requests
sent and not yet confirmed by their engine (`PendingIndex`). A chain is a list of chained
block hashes (prefix.py); a backend's holding of a chain is its leading blocks, so a lookup
answers, per backend, how many leading blocks it holds.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class PrefixIndex(Protocol):
    async def lookup(self, model: str, hashes: Sequence[int]) -> dict[str, int]:
        """Per backend holding any of it, how many leading blocks of the chain it holds."""
        ...

    def record(
        self, model: str, hashes: Sequence[int], backend: str, *, news: bool = False,
        known: int = 0,
    ) -> None:
        """`backend` holds the whole chain. `news`: it did not before (other routers should
        hear at once); `known`: its first blocks were just recorded (a store may skip them)."""
        ...

    def touch(self, model: str, hashes: Sequence[int], backend: str) -> None:
        """A request `backend` served used the blocks of the chain it holds (their last use is
        now); nothing is added."""
        ...

    def truncate(self, model: str, hashes: Sequence[int], backend: str, keep: int) -> None:
        """`backend` holds only the first `keep` blocks of the chain."""
        ...

    def occupancy(self, model: str, backend: str) -> float:
        """The share of the backend's KV capacity the index thinks in use (0..1)."""
        ...

    def tail_age(self, model: str, backend: str) -> float:
        """Seconds since a full backend's coldest block was used (infinity: it has room)."""
        ...

    def learn(self, model: str, backend: str, predicted: int, held: int) -> bool:
        """An engine's answer says it held `held` of the `predicted` leading blocks
        (index/learning.py)."""
        ...

    def resize(self, block_tokens: float) -> None:
        """A block holds this many engine tokens (sizing.py learned it)."""
        ...

    def drop_backend(self, backend: str) -> None: ...
    def expire(self) -> int: ...
    def entries(self) -> int: ...

    @property
    def degraded(self) -> bool:
        """Routing on less than the index should know (a shared store unreachable)."""
        ...

    async def start(self) -> None: ...
    async def close(self) -> None: ...
