"""The router's parts, built once from the settings: the composition root.

Each module is handed exactly the parts it needs (the scheduler its index, load and signals;
an attempt its `Ledger`); only this module and app.py see them all. `RouterCore.route` is the
request's way from parsed to routed: eligible backends (scheduling/filters.py) -> prefix key
(keying.py) -> decision (scheduling/scheduler.py).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from .attempt import Ledger, Route
from .backends import BackendSet
from .config import RouterSettings
from .index import PrefixIndex
from .index.factory import Parts, build_index
from .keying import Keyer
from .load import LoadTracker
from .metrics import RouterMetrics
from .offload import Offload
from .parsing import ParsedRequest
from .scheduling import Scheduler
from .scheduling.bands import Classifier
from .scheduling.filters import eligible
from .scheduling.queue import DispatchQueue
from .scheduling.saturation import Saturation
from .scheduling.scorers import Signals
from .sizing import Sizing
from .store import Store, make_store

_NO_HEADERS: Mapping[str, str] = {}


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
    dispatch: DispatchQueue

    async def route(
        self, parsed: ParsedRequest, headers: Mapping[str, str] = _NO_HEADERS, size: int = 0
    ) -> Route:
        """Route a request, once an engine for it has room (the dispatch queue: it may wait,
        or be refused with 429). It is scored and bound only then (late binding); its
        Attempt must start in the same step as this returns (proxy.forward does)."""
        arrived = time.perf_counter()
        models = frozenset(self.settings.models)
        backends = eligible(self.backends, models, parsed.model)

        def candidates() -> list[str]:
            return [b.url for b in eligible(self.backends, models, parsed.model)]

        tokens = self.keyer.sizing.prompt_tokens(len(parsed.canonical))
        ticket = await self.dispatch.admit(candidates, headers, tokens, parsed.body, size,
                                           [b.url for b in backends])
        try:
            started = time.perf_counter()
            if ticket.waited:
                self.metrics.queue_wait.observe(ticket.waited)
                backends = eligible(self.backends, models, parsed.model)  # as they are now
            # never to a saturated engine while another has room (all: none saturated)
            backends = self.dispatch.with_room(backends)
            key = await self.keyer.key(parsed, backends)
            decision = await self.scheduler.route(parsed.model, key, backends, parsed.canonical)
            self.metrics.overhead.observe(time.perf_counter() - started)
        finally:
            ticket.bound()
        # TTFT as the client sees it: from arrival, the queue's wait included
        return Route(parsed, key, decision, arrived)

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
    scheduler = Scheduler(s, index, load, metrics, signals, store.requested, rng, clock)
    ledger = Ledger(
        s, backends, load, index, metrics, signals.steps, keyer,
        holds=scheduler.profile.uses_index, observe=store.observe, clock=clock,
    )
    backends.on_gone(index.drop_backend)
    backends.on_gone(load.forget)
    backends.on_gone(signals.steps.forget)  # what was learned of its rhythm goes with it
    dispatch = build_dispatch(s, load, metrics, clock)
    backends.on_gone(dispatch.saturation.forget)
    backends.on_join(lambda _url: dispatch.pump())
    store.show_demand(dispatch.demand)
    return RouterCore(
        s, backends, load, metrics, store, index, keyer, scheduler, ledger, offload, dispatch
    )


def build_dispatch(
    s: RouterSettings, load: LoadTracker, metrics: RouterMetrics, clock: Callable[[], float]
) -> DispatchQueue:
    """The dispatch queue, released by every fall of load (scheduling/queue.py)."""
    names = [b.name for b in s.queue.bands]

    def report(decision: str, reason: str, band: int) -> None:
        metrics.count_queue(decision, reason, names[band])

    saturation = Saturation(s.queue)
    q = DispatchQueue(s.queue, Classifier(s.queue, s.salt_header), saturation, load.inflight,
                      report, clock)  # fmt: skip
    load.on_release = q.pump
    saturation.on_change = q.pump
    metrics.watch_queue(q.demand)
    return q
