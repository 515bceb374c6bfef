"""The prefix index: which backends hold which prefix blocks, as far as the router can tell.

Routing and attempts see one interface, `PrefixIndex`, whatever feeds it; factory.py builds
the implementation the settings name, once. Each mode is one module:
  decisions.py  `approx`: the router's own decisions, modelled as an LRU of each engine's
                capacity; `corrected`: the same, corrected by the cached tokens engines report
  events.py     `events`: the engines' KV events (events/), decisions speculative until the
                engine's events confirm them
Underneath, an `Ownership` table holds the blocks: this process's (`LocalIndex`, local.py) or
the one every router replica shares through Redis (redis/index.py). A chain is a list of
chained block hashes (prefix.py); a backend's holding of a chain is its leading blocks, so a
lookup answers, per backend, how many leading blocks it holds.

Each engine's entries are in one of three states, by how the index knows them:
  EXACT      the engine's KV events, in sequence
  ESTIMATED  the router's decisions (corrected by reported cached tokens where they are)
  DEGRADED   less than that: an events gap not yet replayed, a stream not yet joined, a
             restart suspected (engine_states.py), a shared store unreachable
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final, Protocol

EXACT: Final = "EXACT"
ESTIMATED: Final = "ESTIMATED"
DEGRADED: Final = "DEGRADED"
STATES: Final = (EXACT, ESTIMATED, DEGRADED)


class PrefixIndex(Protocol):
    """What routing (scheduling/) and a request's attempts (attempt.py) ask of the index."""

    async def lookup(self, model: str, hashes: Sequence[int]) -> dict[str, int]:
        """Per backend holding any of it, how many leading blocks of the chain it holds,
        chains sent and not yet answered included."""
        ...

    def hold(self, model: str, hashes: Sequence[int], backend: str, news: bool) -> None:
        """A request with this chain was sent to `backend`: requests right behind it follow
        it there until `release`. `news`: the backend did not hold it all (other router
        replicas are shown the hold)."""
        ...

    def release(self, model: str, hashes: Sequence[int], backend: str, news: bool) -> None: ...

    def own(
        self, model: str, hashes: Sequence[int], backend: str, *, known: int = 0,
        news: bool = False,
    ) -> None:
        """`backend`'s engine computed the chain: it holds it now. `known`: its first blocks
        were just owned there (the answer's blocks follow the prompt's); `news`: it did not
        hold the prompt before."""
        ...

    def correct(self, model: str, backend: str, predicted: int, held: int) -> bool:
        """The engine reported holding `held` of the `predicted` leading blocks. True when
        this index takes that as evidence (index/learning.py)."""
        ...

    def lower_tiers(
        self, model: str, hashes: Sequence[int], matched: Mapping[str, int],
        backends: Sequence[str],
    ) -> dict[str, float]:
        """Per backend, the prefill its lower KV tiers (CPU, disk) save after its `matched`
        blocks, in GPU-hit blocks (index/tiers.py); empty where the index knows no tiers."""
        ...

    def occupancy(self, model: str, backend: str) -> float:
        """The share of the backend's KV capacity the index thinks in use (0..1)."""
        ...

    def tail_age(self, model: str, backend: str) -> float:
        """Seconds since a full backend's coldest block was used (infinity: it has room)."""
        ...

    def drop_backend(self, backend: str) -> None: ...
    def expire(self) -> int: ...
    def entries(self) -> int: ...

    @property
    def degraded(self) -> bool:
        """Routing on less than the index should know (a shared store unreachable)."""
        ...

    def state(self, backend: str) -> str:
        """How the index knows `backend`'s entries: EXACT, ESTIMATED or DEGRADED."""
        ...

    def warm(self) -> bool:
        """Whether the index holds what it can learn of every engine joined before routing
        (events: each engine's replay read; the others have nothing to wait for)."""
        ...

    async def start(self) -> None: ...
    async def close(self) -> None: ...


class Ownership(Protocol):
    """A table of which backend holds which blocks: local (local.py) or shared (redis/)."""

    async def lookup(self, model: str, hashes: Sequence[int]) -> dict[str, int]: ...

    def record(
        self, model: str, hashes: Sequence[int], backend: str, *, news: bool = False,
        known: int = 0,
    ) -> None:
        """`backend` holds the whole chain. `news`: it did not before (other routers should
        hear at once); `known`: its first blocks were just recorded (a store may skip them)."""
        ...

    def learn(self, model: str, backend: str, predicted: int, held: int) -> bool:
        """An engine's answer says it held `held` of the `predicted` leading blocks
        (index/learning.py)."""
        ...

    def resize(self, block_tokens: float) -> None:
        """A block holds this many engine tokens (sizing.py learned it)."""
        ...

    def occupancy(self, model: str, backend: str) -> float: ...
    def tail_age(self, model: str, backend: str) -> float: ...
    def drop_backend(self, backend: str) -> None: ...
    def expire(self) -> int: ...
    def entries(self) -> int: ...

    @property
    def degraded(self) -> bool: ...

    async def start(self) -> None: ...
    async def close(self) -> None: ...
