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
from .engine_states import EngineStates
from .errors import RequestError
from .fleet_value import FleetValue
from .index import PrefixIndex
from .index.factory import Parts, build_index
from .keying import Key, Keyer
from .load import LoadTracker
from .metrics import RouterMetrics
from .offload import Offload
from .parsing import ParsedRequest
from .prefix import chain_seed
from .response_ids import Holders, ResponseIds
from .restarts import RestartDetector
from .scheduling import Decision, Scheduler
from .scheduling.bands import Classifier
from .scheduling.filters import eligible, serving, staying
from .scheduling.queue import DispatchQueue
from .scheduling.saturation import Saturation
from .scheduling.scorers import Signals
from .sessions import Sessions, session_key
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
    responses: Holders  # which engine holds each stored Responses API response
    states: EngineStates  # each engine's index state; engines found emptied
    dispatch: DispatchQueue
    fleet: FleetValue | None = None  # what only each engine holds, and who inherits it

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

        # keyed before it may wait: a queued request waits for the engines holding its prefix
        key = await self.keyer.key(parsed, backends)
        keyed = time.perf_counter() - arrived

        async def owners() -> list[str]:
            return await self.scheduler.owners(parsed.model, key)

        ticket = await self.dispatch.admit(candidates, headers, key.prompt_tokens, parsed.body,
                                           size, [b.url for b in backends], owners)  # fmt: skip
        try:
            started = time.perf_counter() - keyed  # the router's own time: the wait left out
            if ticket.waited:
                self.metrics.queue_wait.observe(ticket.waited)
                backends = eligible(self.backends, models, parsed.model)  # as they are now
            # never to a saturated engine while another has room (all: none saturated)
            backends = self.dispatch.with_room(backends, ticket.spare)
            named = self._session(parsed, headers)
            decision = await self.scheduler.route(
                parsed.model, key, backends, parsed.canonical, named
            )
            self.metrics.overhead.observe(time.perf_counter() - started)
        finally:
            ticket.bound()
        # TTFT as the client sees it: from arrival, the queue's wait included
        return Route(parsed, key, decision, arrived, named)

    def _session(self, parsed: ParsedRequest, headers: Mapping[str, str]) -> int | None:
        """The session the client named (`session_header`), keyed with its tenant's salt."""
        header = self.settings.session_header
        session = headers.get(header) if header else None
        return session_key(session, parsed.cache_salt) if session else None

    async def pinned(self, parsed: ParsedRequest, response_id: str) -> Route:
        """A request only one engine can answer: the one holding `response_id` (a
        Responses API follow-up), whatever its load. Nothing is keyed: the history it
        continues is the engine's, not in the request."""
        started = time.perf_counter()
        holder = await self.responses.holder(response_id)
        self.check_holder(holder, response_id, "previous_response_id")
        assert holder is not None
        tokens = self.keyer.sizing.prompt_tokens(len(parsed.canonical))
        key = Key(chain_seed(parsed.model, parsed.cache_salt), [], tokens)
        self.metrics.count_decision(self.settings.policy, "pinned")
        return Route(parsed, key, Decision(holder, "pinned", 0, []), started)

    def check_holder(self, holder: str | None, response_id: str, param: str) -> None:
        """A 404 at once for an id no engine here holds (never stored, expired, or its
        engine left); a 503 while its engine is out of rotation."""
        b = self.backends.get(holder) if holder is not None else None
        if b is None:
            raise RequestError(404, f"Response with id '{response_id}' not found.",
                               param=param, code="response_not_found")  # fmt: skip
        if not b.healthy:
            raise RequestError(503, "the engine holding this response is out of rotation",
                               retry_after=1)  # fmt: skip

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
    renderer = None
    if s.tokenizer:
        from .prompt import Renderer  # tokenizers, jinja2: only where configured

        renderer = Renderer(s.tokenizer)
    sizing = Sizing(s.block_size, s.block_bytes, s.bytes_per_token, exact=renderer is not None)
    offload = Offload()
    keyer = Keyer(sizing, offload, s.max_prompt_tokens, renderer)
    index = build_index(Parts(s, store, backends, metrics, sizing, clock))
    states = EngineStates(index, RestartDetector(clock),
                          lambda: [b.url for b in backends.all()], metrics.count_drop)
    metrics.watch_states(states.states)
    store.watch_states(states.counts)
    signals = Signals(sizing=sizing, sessions=Sessions(s.max_sessions))
    fleet = FleetValue(sizing.blocks_tokens, clock=clock)
    store.engine_values = fleet.values
    scheduler = Scheduler(
        s, index, load, metrics, signals, store.requested, rng, clock, matched=fleet.observe
    )
    responses = Holders(
        ResponseIds(s.max_response_ids, s.response_ttl_s, clock), store, s.response_ttl_s
    )
    ledger = Ledger(
        s, backends, load, index, metrics, signals.steps, signals.sessions, keyer,
        holds=scheduler.profile.uses_index, observe=store.observe, clock=clock,
        remember_response=responses.remember,
        evidence=states.answered,
    )
    if s.handoff:
        backends.on_leaving(lambda url: hand_off(fleet, index, backends, url))
    backends.on_gone(fleet.forget)
    backends.on_gone(index.drop_backend)
    backends.on_gone(states.forget)  # a replacement starts a new baseline
    backends.on_gone(load.forget)
    backends.on_gone(signals.steps.forget)  # what was learned of its rhythm goes with it
    dispatch = build_dispatch(s, load, metrics, clock)
    backends.on_gone(dispatch.saturation.forget)
    backends.on_join(lambda _url: dispatch.pump())
    store.show_demand(dispatch.demand)
    return RouterCore(
        s, backends, load, metrics, store, index, keyer, scheduler, ledger, offload, responses,
        states, dispatch, fleet,
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
                      report, clock, load.pending_prefill)  # fmt: skip
    load.on_release = q.pump
    saturation.on_change = q.pump
    metrics.watch_queue(q.demand)
    return q


def hand_off(fleet: FleetValue, index: PrefixIndex, backends: BackendSet, url: str) -> None:
    """`url` is leaving: each prefix only it held goes to its successor in the index, so its
    followers meet there (the first of them computes it) instead of scattering."""

    def remaining(model: str) -> list[str]:
        return [b.url for b in staying(serving(backends.healthy(), model)) if not b.leaving]

    for h in fleet.handoff(url, remaining):
        index.own(h.model, h.chain, h.successor, news=True)
    fleet.forget(url)
