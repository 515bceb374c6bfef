"""From a request's prefix key to a routing decision: the scheduler's one job.

Order of work for one request: one index lookup for the whole chain (holds of chains in
flight merged in by the index) -> candidates (the backends serving the model, with their load
as it is after the lookup) -> the policy's profile (filters, scorers, picker).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Mapping, Sequence

import xxhash

from ..backends import Backend
from ..config import RouterSettings
from ..index import PrefixIndex
from ..keying import Key
from ..load import LoadTracker
from ..metrics import RouterMetrics
from .candidate import Ask, Candidate, Decision
from .profiles import PROFILES
from .scorers import Signals

log = logging.getLogger("prefix_router.decisions")


class Scheduler:
    def __init__(
        self,
        settings: RouterSettings,
        index: PrefixIndex,
        load: LoadTracker,
        metrics: RouterMetrics,
        signals: Signals,
        requested: Callable[[str, list[int]], None] | None = None,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.monotonic,
        matched: Callable[[str, Sequence[int], Mapping[str, int]], None] | None = None,
    ) -> None:
        self._policy = settings.policy
        # each lookup's answer, for what only one engine holds (fleet_value.py)
        self._matched = matched
        self._log = settings.log_decisions
        self._index = index
        self._load = load
        self._metrics = metrics
        # a request asked for this chain: the working set a shared store publishes
        self._requested = requested
        self._clock = clock
        self._rng = rng or random.Random()
        self.profile = PROFILES[settings.policy](settings, signals, self._rng)

    async def route(
        self, model: str, key: Key, backends: Sequence[Backend], canonical: bytes = b"",
        session: int | None = None,
    ) -> Decision:
        """The backend for a request with this key, among `backends` (those serving its
        model), and the order of the others for retries. `canonical`: the prompt's bytes,
        for the profiles that hash them instead of reading the index; `session`: the
        client's named session (sessions.py)."""
        hashes = key.hashes
        profile = self.profile
        matches = await self._lookup(model, hashes) if profile.uses_index else None
        if matches is not None and self._matched is not None:
            self._matched(model, hashes, matches)
        # The load is read after the lookup, never across its await: the round trip brings
        # the other routers' load, and this router's own requests routed meanwhile count too.
        # Read before it, three routers on Redis each missed the others' latest sends and
        # piled onto the same backend (bench/results/compare/redis-3x-ab/).
        load = self._load
        cands = [
            Candidate(b.url, load.inflight(b.url), load.pending_prefill(b.url)) for b in backends
        ]
        if matches is not None:
            ask = self._ask(model, hashes, matches, cands)
            ask.session = session
        elif profile.key_bytes:
            ask = Ask(xxhash.xxh3_64_intdigest(canonical[: profile.key_bytes]))
        else:
            ask = Ask(0)
        decision = profile.choose(cands, ask)
        self._metrics.count_decision(self._policy, decision.reason)
        if self._log:
            log.info(
                "route model=%s head=%016x blocks=%d backend=%s reason=%s matched=%d loads=%s",
                model,
                hashes[0] if hashes else 0,
                len(hashes),
                decision.backend,
                decision.reason,
                decision.matched_blocks,
                ",".join(f"{c.name}:{c.in_flight:.0f}/{c.matched_blocks}" for c in cands),
            )
        return decision

    async def owners(self, model: str, key: Key) -> list[str]:
        """The engines holding the longest cached prefix of the chain (none when no engine
        holds a block of it, or the policy reads no index)."""
        if not self.profile.uses_index or not key.hashes:
            return []
        matches = await self._index.lookup(model, key.hashes)
        best = max(matches.values(), default=0)
        return [b for b, m in matches.items() if m == best] if best else []

    async def _lookup(self, model: str, hashes: list[int]) -> dict[str, int]:
        """Each backend's leading blocks of the chain, holds included."""
        if self._requested is not None and hashes:
            self._requested(model, hashes)
        return await self._index.lookup(model, hashes) if hashes else {}

    def _ask(
        self, model: str, hashes: list[int], matches: dict[str, int], cands: list[Candidate]
    ) -> Ask:
        """Fill each candidate's match and cache state; the request as scored."""
        index = self._index
        best = 0
        lower = index.lower_tiers(model, hashes, matches, [c.name for c in cands])
        for c in cands:
            m = c.matched_blocks = matches.get(c.name, 0)
            c.tier_blocks = lower.get(c.name, 0.0)
            best = max(best, m)
            c.occupancy = index.occupancy(model, c.name)
            c.tail_age = index.tail_age(model, c.name)
        key = hashes[0] if hashes else self._rng.getrandbits(64)
        return Ask(key, len(hashes), best, self._clock())
