"""The router's parts, built once from the settings: the composition root.

Each module is handed exactly the parts it needs (the scheduler its index, load and signals;
an attempt its `Ledger`); only this module and app.py see them all. `RouterCore.route` is the
request's way from parsed to routed: eligible backends (scheduling/filters.py) -> prefix key
(keying.py) -> decision (scheduling/scheduler.py).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass

from .attempt import Ledger, Route
from .backends import BackendSet
from .config import RouterSettings
from .fleet_value import FleetValue
from .index import PrefixIndex
from .index.factory import Parts, build_index
from .keying import Keyer
from .load import LoadTracker
from .metrics import RouterMetrics
from .offload import Offload
from .parsing import ParsedRequest
from .scheduling import Scheduler
from .scheduling.filters import eligible, serving, staying
from .scheduling.scorers import Signals
from .sizing import Sizing
from .store import Store, make_store


@dataclass(slots=True)
class RouterCore:
    settings: RouterSettings
    backends: BackendSet
    load: LoadTracker
    metrics: RouterMetrics
    store: Store
    index: PrefixIndex
    keyer: Keyer
    scheduler: Scheduler
    ledger: Ledger
    offload: Offload
    fleet: FleetValue | None = None  # what only each engine holds, and who inherits it

    async def route(self, parsed: ParsedRequest) -> Route:
        started = time.perf_counter()
        models = frozenset(self.settings.models)
        backends = eligible(self.backends, models, parsed.model)
        key = await self.keyer.key(parsed, backends)
        decision = await self.scheduler.route(parsed.model, key, backends, parsed.canonical)
        self.metrics.overhead.observe(time.perf_counter() - started)
        return Route(parsed, key, decision, started)

    async def start(self) -> None:
        await self.store.start()
        await self.index.start()

    async def close(self) -> None:
        await self.index.close()
        await self.store.close()
        self.offload.close()


def build_core(
    settings: RouterSettings,
    backends: BackendSet | None = None,
    store: Store | None = None,
    load: LoadTracker | None = None,
    rng: random.Random | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> RouterCore:
    """Every part, wired. `store` and `load` given: a store built on that load (tests)."""
    s = settings
    if backends is None:
        backends = BackendSet(s.health.eject_after_failures, s.health.readmit_after_s)
    load = load or LoadTracker()
    if store is None:
        store = make_store(s, load)
    metrics = RouterMetrics()
    tokenizer = None
    if s.tokenizer:
        from .tokens import ChatTokenizer  # tokenizers, jinja2: only where configured

        tokenizer = ChatTokenizer(s.tokenizer)
    sizing = Sizing(s.block_size, s.block_bytes, s.bytes_per_token, exact=tokenizer is not None)
    offload = Offload()
    keyer = Keyer(sizing, offload, s.max_prompt_tokens, tokenizer)
    index = build_index(Parts(s, store, backends, metrics, sizing, clock))
    signals = Signals(sizing=sizing)
    fleet = FleetValue(sizing.blocks_tokens, clock=clock)
    store.engine_values = fleet.values
    scheduler = Scheduler(
        s, index, load, metrics, signals, store.requested, rng, clock, matched=fleet.observe
    )
    ledger = Ledger(
        s, backends, load, index, metrics, signals.steps, keyer,
        holds=scheduler.profile.uses_index, observe=store.observe, clock=clock,
    )
    backends.on_leaving(lambda url: hand_off(fleet, index, backends, url))
    backends.on_gone(fleet.forget)
    backends.on_gone(index.drop_backend)
    backends.on_gone(load.forget)
    backends.on_gone(signals.steps.forget)  # what was learned of its rhythm goes with it
    return RouterCore(
        s, backends, load, metrics, store, index, keyer, scheduler, ledger, offload, fleet
    )


def hand_off(fleet: FleetValue, index: PrefixIndex, backends: BackendSet, url: str) -> None:
    """`url` is leaving: each prefix only it held goes to its successor in the index, so its
    followers meet there (the first of them computes it) instead of scattering."""

    def remaining(model: str) -> list[str]:
        return [b.url for b in staying(serving(backends.healthy(), model)) if not b.leaving]

    for h in fleet.handoff(url, remaining):
        index.own(h.model, h.chain, h.successor, news=True)
    fleet.forget(url)
