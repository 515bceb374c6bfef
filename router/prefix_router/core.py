"""The router's parts, built once from the settings: the composition root.

Each module is handed exactly the parts it needs (the scheduler its index, load and signals;
an attempt its `Ledger`); only this module and app.py see them all. `RouterCore.route` is the
request's way from parsed to routed: eligible backends (scheduling/filters.py) -> prefix key
(keying.py) -> decision (scheduling/scheduler.py).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

from .attempt import Ledger, Route
from .backends import BackendSet
from .config import RouterSettings
from .errors import RequestError
from .index import PrefixIndex
from .index.factory import Parts, build_index
from .keying import Key, Keyer
from .load import LoadTracker
from .metrics import RouterMetrics
from .offload import Offload
from .parsing import ParsedRequest
from .prefix import chain_seed
from .response_ids import ResponseIds, id_key
from .scheduling import Decision, Scheduler
from .scheduling.filters import eligible
from .scheduling.scorers import Signals
from .sessions import Sessions, session_key
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
    responses: ResponseIds  # which engine holds each stored Responses API response

    async def route(self, parsed: ParsedRequest, session: str | None = None) -> Route:
        """`session`: the id the client named its session by (`session_header`)."""
        started = time.perf_counter()
        models = frozenset(self.settings.models)
        backends = eligible(self.backends, models, parsed.model)
        key = await self.keyer.key(parsed, backends)
        named = session_key(session, parsed.cache_salt) if session else None
        decision = await self.scheduler.route(
            parsed.model, key, backends, parsed.canonical, named
        )
        self.metrics.overhead.observe(time.perf_counter() - started)
        return Route(parsed, key, decision, started, named)

    async def pinned(self, parsed: ParsedRequest, response_id: str) -> Route:
        """A request only one engine can answer: the one holding `response_id` (a
        Responses API follow-up), whatever its load. Nothing is keyed: the history it
        continues is the engine's, not in the request."""
        started = time.perf_counter()
        holder = await self.response_holder(response_id)
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

    def remember_response(self, response_id: str, backend: str) -> asyncio.Future[object] | None:
        """Remembered here and told to the other routers (the write to wait for, if any)."""
        ttl = self.settings.response_ttl_s
        self.responses.remember(response_id, backend)
        return self.store.remember_response(id_key(response_id), backend, ttl)

    async def response_holder(self, response_id: str) -> str | None:
        holder = self.responses.holder(response_id)
        if holder is None:
            holder = await self.store.response_holder(id_key(response_id))
            if holder is not None:
                self.responses.remember(response_id, holder)
        return holder

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
    signals = Signals(sizing=sizing, sessions=Sessions(s.max_sessions))
    scheduler = Scheduler(s, index, load, metrics, signals, store.requested, rng, clock)
    responses = ResponseIds(s.max_response_ids, s.response_ttl_s, clock)
    ledger = Ledger(
        s, backends, load, index, metrics, signals.steps, signals.sessions, keyer,
        holds=scheduler.profile.uses_index, observe=store.observe, clock=clock,
    )
    backends.on_gone(index.drop_backend)
    backends.on_gone(load.forget)
    backends.on_gone(signals.steps.forget)  # what was learned of its rhythm goes with it
    core = RouterCore(
        s, backends, load, metrics, store, index, keyer, scheduler, ledger, offload, responses
    )
    ledger.remember_response = core.remember_response
    return core
