"""One attempt of a routed request on one backend: the load it puts there and what the index
learns from it, owned by one object so no path can forget either.

Created just before the request is sent: its load counts at once (one more in flight, its
prefill pending) and its prompt's chain is held as pending, so requests right behind it see
both. Then, in order, as the engine answers:
  answered(status)  the status line
  first_byte()      the first byte of the body: the prefill is over (its pending load goes)
                    and, after a 2xx, the engine holds the prompt: the index records it for
                    this backend (as news when the decision was not a hit here)
  chunk()           a streamed chunk: the backend's step rhythm
  done(answer, usage)  the next turn's prefix (prompt + answer) is recorded; usage learned
  failed(outcome)   counted; against the backend when it is at fault
and close() always (the `with` block): in flight released, the pending hold released. A
failed attempt, or an answer that is not 2xx, leaves the index as it was before the request.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from .backends import BackendSet
from .config import RouterSettings
from .index import PrefixIndex
from .keying import Key, Keyer
from .load import LoadTracker
from .metrics import RouterMetrics
from .parsing import ParsedRequest
from .scheduling import Decision
from .sessions import Sessions
from .steps import StepClock

log = logging.getLogger("prefix_router.attempt")


@dataclass(slots=True)
class Route:
    """A request with its key and decision: what the proxy forwards and attempts record."""

    parsed: ParsedRequest
    key: Key
    decision: Decision
    started: float  # time.perf_counter() when routing began
    session: int | None = None  # the client's named session (sessions.py key), if any

    @property
    def hashes(self) -> list[int]:
        return self.key.hashes

    @property
    def prompt_tokens(self) -> float:
        return self.key.prompt_tokens


@dataclass(slots=True)
class Ledger:
    """Exactly what an attempt changes or reads besides its route."""

    settings: RouterSettings
    backends: BackendSet  # success and failure reports
    load: LoadTracker  # in flight and pending prefill
    index: PrefixIndex  # holds, ownership, corrections
    metrics: RouterMetrics
    steps: StepClock  # each backend's step rhythm, from streamed chunks
    sessions: Sessions  # each named session's last engine
    keyer: Keyer  # the next turn's chain; blocks -> tokens (its sizing)
    holds: bool  # whether the policy reads the index (the others hold nothing)
    # (prompt tokens, predicted cached tokens) of each request served: the figures a shared
    # store publishes for the autoscaler (none without one)
    observe: Callable[[float, float], None] | None = None
    clock: Callable[[], float] = time.monotonic
    # a stored Responses API response's id and its engine (core.py)
    remember_response: Callable[[str, str], Awaitable[None]] | None = None
    # (backend, the prompt's first block, predicted blocks, held blocks) of each answer that
    # reported its cached tokens: an engine far below prediction on prefix after prefix came
    # back empty (engine_states.py)
    evidence: Callable[[str, int, int, int], None] | None = None


class Attempt:
    __slots__ = (
        "backend",
        "closed",
        "confirmed",
        "held",
        "ledger",
        "news",
        "prefill",
        "prefilled",
        "route",
        "sent_at",
        "slow",
        "status",
        "whole",
    )

    def __init__(self, ledger: Ledger, route: Route, backend: str) -> None:
        self.ledger = led = ledger
        self.route = route
        self.backend = backend
        self.confirmed = False
        self.prefilled = False
        self.closed = False
        self.status = 0
        self.whole = False  # answered in full: done() ran
        self.prefill = max(route.prompt_tokens - self.predicted(), 0.0)
        led.load.start(backend, self.prefill)
        led.metrics.set_inflight(backend, led.load.own_inflight(backend))
        d = route.decision
        # the prompt is news here: this backend did not hold it all (the other routers are
        # shown the hold, and told of the record at once)
        self.news = backend != d.backend or d.reason != "hit"
        self.held = led.holds and bool(route.hashes)
        if self.held:
            led.index.hold(route.parsed.model, route.hashes, backend, self.news)
        self.sent_at = led.clock()
        self.slow: asyncio.TimerHandle | None = None
        if route.parsed.stream:
            self.slow = asyncio.get_running_loop().call_later(
                led.settings.first_token_budget_s, self._slow
            )

    def _slow(self) -> None:
        self.slow = None
        budget = self.ledger.settings.first_token_budget_s
        log.warning("no first token from %s within %gs", self.backend, budget)
        self.ledger.backends.report_failure(self.backend, f"no first token within {budget:g}s")

    def __enter__(self) -> Attempt:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def predicted(self) -> float:
        """Prompt tokens the decision expects this backend to hold (none for a fallback: its
        match was not looked at as closely)."""
        r = self.route
        if self.backend != r.decision.backend:
            return 0.0
        tokens = self.ledger.keyer.sizing.blocks_tokens(r.decision.matched_blocks)
        return min(tokens, r.prompt_tokens)

    def answered(self, status: int) -> None:
        self.status = status

    def _unslow(self) -> None:
        if self.slow is not None:
            self.slow.cancel()
            self.slow = None

    def first_byte(self, streamed: bool) -> None:
        if self.prefilled:
            return
        self.prefilled = True
        self._unslow()
        led, r = self.ledger, self.route
        led.load.first_byte(self.backend, self.prefill)
        if 200 <= self.status < 300:
            self.confirmed = True
            if self.held:
                self.held = False
                model = r.parsed.model
                led.index.own(model, r.hashes, self.backend, news=self.news)
                led.index.release(model, r.hashes, self.backend, self.news)
            if r.session is not None:
                led.sessions.served(r.session, self.backend)
        led.metrics.ttft.observe(time.perf_counter() - r.started)
        if streamed:
            steps = led.steps
            b = self.backend
            steps.first_token(b, self.sent_at, led.clock())
            led.metrics.set_rhythm(b, steps.step(b), steps.lead(b))

    def chunk(self) -> None:
        self.ledger.steps.beat(self.backend, self.ledger.clock())

    async def stored(self, response_id: str) -> None:
        """The engine stored a Responses API response under this id: follow-ups and GETs by
        it can only be answered there. Awaited before the client sees the id."""
        if self.ledger.remember_response is not None:
            await self.ledger.remember_response(response_id, self.backend)

    def done(self, answer: str | None, usage: tuple[int, int | None] | None) -> None:
        """The engine answered in full (2xx)."""
        self.whole = True
        led, r, backend = self.ledger, self.route, self.backend
        led.backends.report_success(backend)
        led.metrics.count_request(backend, "ok")
        predicted = self.predicted()
        led.metrics.observe_prediction(r.prompt_tokens, predicted)
        if led.observe is not None:
            led.observe(r.prompt_tokens, predicted)
        if usage is not None:
            self.learn(*usage)
        if answer and self.confirmed and r.hashes:
            nxt = led.keyer.next_turn(r.key, answer)
            if len(nxt) > len(r.hashes):
                # the prompt's blocks were owned at its first token: the answer's are new
                led.index.own(r.parsed.model, nxt, backend, known=len(r.hashes))

    def learn(self, prompt: int, cached: int | None) -> None:
        """What the engine reported: its token count teaches the router's sizing, and its
        cached tokens (when it reports them: a missing count is unknown, never zero) what it
        really held against what the index predicted."""
        led, r, backend = self.ledger, self.route, self.backend
        sizing = led.keyer.sizing
        size = len(r.key.prompt.canonical) if r.key.prompt is not None else len(r.parsed.canonical)
        sizing.learn(size, prompt)
        if cached is None and led.settings.cached_tokens_reported:
            cached = 0
        if cached is None:
            return
        predicted = self.predicted()
        led.metrics.observe_usage(predicted, prompt, cached)
        if led.settings.log_decisions:
            log.info("served backend=%s predicted_cached=%d reported_cached=%d prompt=%d",
                     backend, predicted, cached, prompt)
        d = r.decision
        if backend != d.backend:
            return
        matched, held = sizing.evidence(d.matched_blocks, prompt, cached)
        if led.evidence is not None and r.hashes:
            led.evidence(backend, r.hashes[0], matched, held)
        if held != matched and led.index.correct(r.parsed.model, backend, matched, held):
            led.metrics.count_correction("over" if held < matched else "under")

    def failed(self, outcome: str, why: str = "", at_fault: bool = True) -> None:
        """`outcome` names it in the request metrics; a failure the backend is at fault for
        (refused, hung, cut, 502/503) counts toward ejecting it."""
        self.ledger.metrics.count_request(self.backend, outcome)
        if at_fault:
            self.ledger.backends.report_failure(self.backend, why or outcome)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._unslow()
        led, backend = self.ledger, self.backend
        if not self.prefilled:
            self.prefilled = True
            led.load.first_byte(backend, self.prefill)
        led.load.finish(backend)
        led.metrics.set_inflight(backend, led.load.own_inflight(backend))
        if self.held:
            self.held = False
            r = self.route
            led.index.release(r.parsed.model, r.hashes, backend, self.news)
