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

Besides the GPU blocks of the full-attention groups (the table `LocalIndex` keeps), it keeps
what a hit needs beyond them (tiers.py): the blocks each engine holds in a lower tier (CPU,
storage), which `lower_tiers` turns into prefill saved at that tier's cost, and, for a hybrid
model, the blocks of its sliding-window and Mamba groups, which cut `lookup`'s hit to where
every group holds what vLLM needs.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from . import DEGRADED
from .local import LocalIndex
from .pending import PendingIndex
from .tiers import GroupNeed, Residency, hybrid_hit, tier_run

if TYPE_CHECKING:
    from .factory import Parts


def build(p: Parts) -> EventsIndex:
    """The index, and the subscriber that feeds it from every engine that joins."""
    from ..events.subscriber import EventSubscriber  # pyzmq: only where events are read

    s = p.settings
    index = EventsIndex(
        s.block_size, s.max_table_entries, s.max_owners, p.clock, s.events.speculative_s,
        s.events.tier_costs,
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
        tier_costs: Mapping[str, float] | None = None,
    ) -> None:
        super().__init__(block_tokens, 0, float("inf"), max_entries, max_owners, clock)
        self._full_at: dict[str, int] = {}  # backend -> the most blocks held since it evicted
        self.pending = PendingIndex()  # chains sent, not yet answered
        self.speculative = PendingIndex()  # chains answered whose events have not come yet
        self._speculative_s = speculative_s
        self.on_close: Callable[[], Awaitable[None]] | None = None  # the subscriber's
        # medium -> a token's load, in prefill tokens
        self._costs = {m.upper(): c for m, c in (tier_costs or {}).items()}
        self._lower: dict[str, Residency] = {}  # medium -> what engines hold there
        self._group_res: dict[int, Residency] = {}  # KV-cache group -> its blocks (GPU)
        self._needs: dict[str, dict[int, GroupNeed]] = {}  # backend -> its other groups
        # the subscriber's view of each engine's stream (EXACT or DEGRADED), and whether
        # every engine's replay was read
        self.stream_state: Callable[[str], str] = lambda backend: DEGRADED
        self.streams_warm: Callable[[], bool] = lambda: True

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

    # -- lower tiers and other KV-cache groups (fed by events/feed.py) -----------------------
    def store_lower(self, medium: str, model: str, keys: Sequence[int], backend: str) -> None:
        self._lower.setdefault(medium, Residency()).add(model, keys, backend)

    def remove_lower(self, medium: str, model: str, keys: Sequence[int], backend: str) -> None:
        res = self._lower.get(medium)
        if res is not None:
            res.remove(model, keys, backend)

    def store_group(
        self, group: int, need: GroupNeed, model: str, keys: Sequence[int], backend: str
    ) -> None:
        self._needs.setdefault(backend, {})[group] = need
        self._group_res.setdefault(group, Residency()).add(model, keys, backend)

    def remove_group(self, group: int, model: str, keys: Sequence[int], backend: str) -> None:
        res = self._group_res.get(group)
        if res is not None:
            res.remove(model, keys, backend)

    def lower_blocks(self, medium: str, backend: str) -> int:
        res = self._lower.get(medium)
        return res.blocks(backend) if res is not None else 0

    # -- routing and attempts (PrefixIndex) -------------------------------------------------
    async def lookup(self, model: str, hashes: Sequence[int]) -> dict[str, int]:
        """Each backend's GPU hit, chains in flight and speculative entries merged in."""
        if not hashes:
            return {}
        self.speculative.expire(self._clock())
        matches = self.pending.merge(model, hashes, self.gpu_hit(model, hashes))
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

    def gpu_hit(self, model: str, hashes: Sequence[int]) -> dict[str, int]:
        """Each backend's GPU hit: its leading blocks, cut, for a hybrid model, to where every
        KV-cache group holds what the hit needs."""
        found = self.match(model, hashes)
        if not self._needs:
            return found
        out: dict[str, int] = {}
        for backend, n in found.items():
            needs = self._needs.get(backend)
            if needs:
                groups = [(need, self._group_res[g]) for g, need in needs.items()]
                n = hybrid_hit(hashes, n, groups, model, backend)
            if n:
                out[backend] = n
        return out

    def lower_tiers(
        self, model: str, hashes: Sequence[int], matched: Mapping[str, int],
        backends: Sequence[str],
    ) -> dict[str, float]:
        """Per backend, the prefill its lower tiers save after its GPU hit (`matched`), in
        GPU-hit blocks: each block loaded at its tier's cost (tiers.py). Media without a
        configured cost are not counted."""
        tiers = sorted(
            ((cost, res) for m, res in self._lower.items()
             if (cost := self._costs.get(m)) is not None and cost < 1.0),
            key=lambda t: t[0],
        )  # fmt: skip
        if not tiers or not hashes:
            return {}
        out: dict[str, float] = {}
        for b in backends:
            saved = tier_run(hashes, matched.get(b, 0), tiers, model, b)
            if saved > 0:
                out[b] = saved
        return out

    def clear_gpu(self, backend: str) -> None:
        """The engine reset its prefix cache (AllBlocksCleared): its GPU blocks are gone, what
        an offloading tier holds stays (vLLM's GPU block pool sends the event)."""
        self._full_at.pop(backend, None)
        super().drop_backend(backend)
        for res in self._group_res.values():
            res.drop_backend(backend)

    # -- the rest of PrefixIndex ------------------------------------------------------------
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
        self.speculative.drop_backend(backend)
        self.clear_gpu(backend)  # a restarted engine may be another size
        self._needs.pop(backend, None)
        for res in self._lower.values():
            res.drop_backend(backend)
