"""Index mode `events`: the engines' KV events (events/feed.py) say what each engine holds,
kept until it says a block is gone, with no configured capacity and no TTL. Pure; the
subscriber that feeds it (events/subscriber.py) is attached by `build`.

The router's own decisions only bridge the time until the events come: a chain sent is held
as pending while in flight, and once its engine answered, the blocks the index did not have
there are a speculative entry, until the engine's events settle them or for
`events.speculative_s` if they never do. Reported cached tokens are not evidence here: the
events are better.

What the events do not say is how full an engine is, and the eviction scorer needs it (a full
backend's coldest block is what a new prefix there would push out). An engine evicts only
when its KV pool is full, and its cached blocks leave only by eviction, so once it has evicted
it stays full: from then on a new prefix there costs its coldest block. Its capacity (for
occupancy) is the most blocks it has held since: learned per engine, a fleet of mixed sizes
included, without being told (a pool that evicted while running sequences took part of it
holds more cached blocks once they end). A block's last use is its store, refreshed by each
request the router sends there that matched it (`touch`), so the tail is what the engine's
own LRU would evict next.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING

from . import DEGRADED
from .local import LocalIndex
from .pending import PendingIndex

if TYPE_CHECKING:
    from .factory import Parts


def build(p: Parts) -> EventsIndex:
    """The index, and the subscriber that feeds it from every engine that joins."""
    from ..events.subscriber import EventSubscriber  # pyzmq: only where events are read

    s = p.settings
    index = EventsIndex(
        s.block_size, s.max_table_entries, s.max_owners, p.clock, s.events.speculative_s
    )
    events = EventSubscriber(
        s.events, index, s.block_size, lambda backend, lora: lora or p.model_of(backend),
        index.forget, index.settle,
    )
    p.sizing.watch(index.resize)
    p.metrics.watch_events(events.stats)
    p.backends.on_join(events.join)
    p.backends.on_gone(lambda backend: asyncio.ensure_future(events.leave(backend)))
    index.on_close = events.close
    index.stream_state, index.streams_warm = events.state, events.warm
    return index


class EventsIndex(LocalIndex):
    def __init__(
        self,
        block_tokens: int,
        max_entries: int,
        max_owners: int = 0,
        clock: Callable[[], float] = time.monotonic,
        speculative_s: float = 10.0,
    ) -> None:
        super().__init__(block_tokens, 0, float("inf"), max_entries, max_owners, clock)
        self._full_at: dict[str, int] = {}  # backend -> the most blocks held since it evicted
        self.pending = PendingIndex()  # chains sent, not yet answered
        self.speculative = PendingIndex()  # chains answered whose events have not come yet
        self._speculative_s = speculative_s
        self.on_close: Callable[[], Awaitable[None]] | None = None  # the subscriber's
        # the subscriber's view of each engine's stream (EXACT or DEGRADED), and whether
        # every engine's replay was read
        self.stream_state: Callable[[str], str] = lambda backend: DEGRADED
        self.streams_warm: Callable[[], bool] = lambda: True

    # -- routing and attempts (PrefixIndex) -------------------------------------------------
    async def lookup(self, model: str, hashes: Sequence[int]) -> dict[str, int]:
        if not hashes:
            return {}
        self.speculative.expire(self._clock())
        matches = self.pending.merge(model, hashes, self.match(model, hashes))
        return self.speculative.merge(model, hashes, matches)

    def hold(self, model: str, hashes: Sequence[int], backend: str, news: bool) -> None:
        self.pending.hold(model, hashes, backend)

    def release(self, model: str, hashes: Sequence[int], backend: str, news: bool) -> None:
        self.pending.release(model, hashes, backend)

    def own(
        self, model: str, hashes: Sequence[int], backend: str, *, known: int = 0,
        news: bool = False,
    ) -> None:
        """Only the blocks the index does not have there become speculative: the rest it
        knows from the engine's events already, and their use is touched."""
        start = known or self.match(model, hashes).get(backend, 0)
        self.touch(model, hashes[:start], backend)
        until = self._clock() + self._speculative_s
        self.speculative.hold_until(model, hashes[start:], backend, until)

    def correct(self, model: str, backend: str, predicted: int, held: int) -> bool:
        return False

    def state(self, backend: str) -> str:
        return self.stream_state(backend)

    def warm(self) -> bool:
        return self.streams_warm()

    def settle(self, backend: str, model: str, keys: list[int]) -> None:
        """The engine's events said what became of these blocks: no speculative entry of
        them stands any longer."""
        self.speculative.settle(model, keys, backend)

    def forget(self, backend: str) -> None:
        """The engine's cache was emptied (a restart, an unrecoverable gap)."""
        self.speculative.drop_backend(backend)

    async def close(self) -> None:
        if self.on_close is not None:
            await self.on_close()

    # -- what the events say of each engine --------------------------------------------------

    def held(self, backend: str) -> int:
        """Blocks the engine holds, over every model (its LoRAs share one pool)."""
        return sum(t.owned_blocks(backend) for t in self._tables.values())

    def full_at(self, backend: str) -> int:
        """The most blocks the engine has held since it first evicted (0: it has not)."""
        return self._full_at.get(backend, 0)

    def record(
        self, model: str, hashes: Sequence[int], backend: str, *, news: bool = False,
        known: int = 0,
    ) -> None:
        super().record(model, hashes, backend)
        full = self._full_at.get(backend)
        if full is not None:
            # a pool that evicted while running sequences held some of it holds more cached
            # blocks once they end: its capacity is the most it has held
            self._full_at[backend] = max(full, self.held(backend))

    def evicting(self, backend: str) -> None:
        """The engine is evicting: it is full holding what the index has of it now."""
        self._full_at[backend] = max(self.held(backend), self._full_at.get(backend, 0))

    def occupancy(self, model: str, backend: str) -> float:
        cap = self._full_at.get(backend)
        return min(self.held(backend) / cap, 1.0) if cap else 0.0

    def tail_age(self, model: str, backend: str) -> float:
        t = self._tables.get(model)
        if backend not in self._full_at or t is None:
            return float("inf")
        coldest = t.coldest(backend)
        return float("inf") if coldest is None else max(self._clock() - coldest, 0.0)

    def drop_backend(self, backend: str) -> None:
        self._full_at.pop(backend, None)  # a restarted engine may be another size
        self.speculative.drop_backend(backend)
        super().drop_backend(backend)
