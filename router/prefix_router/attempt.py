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

from .prefix import extend_hashes
from .scheduling import Route, Scheduler

log = logging.getLogger("prefix_router.attempt")


class Attempt:
    __slots__ = (
        "backend",
        "closed",
        "confirmed",
        "held",
        "news",
        "prefill",
        "prefilled",
        "route",
        "sched",
        "sent_at",
        "slow",
        "status",
    )

    def __init__(self, sched: Scheduler, route: Route, backend: str) -> None:
        self.sched = sched
        self.route = route
        self.backend = backend
        self.confirmed = False
        self.prefilled = False
        self.closed = False
        self.status = 0
        self.prefill = max(route.prompt_tokens - self.predicted(), 0.0)
        sched.load.start(backend, self.prefill)
        sched.metrics.set_inflight(backend, sched.load.own_inflight(backend))
        d = route.decision
        # the prompt is news here: this backend did not hold it all (the other routers are
        # shown the hold, and told of the record at once)
        self.news = backend != d.backend or d.reason != "hit"
        self.held = sched.profile.uses_index and bool(route.hashes)
        if self.held:
            sched.pending.hold(route.parsed.model, route.hashes, backend, share=self.news)
        self.sent_at = sched.clock()
        self.slow: asyncio.TimerHandle | None = None
        if route.parsed.stream:
            self.slow = asyncio.get_running_loop().call_later(
                sched.settings.first_token_budget_s, self._slow
            )

    def _slow(self) -> None:
        self.slow = None
        budget = self.sched.settings.first_token_budget_s
        log.warning("no first token from %s within %gs", self.backend, budget)
        self.sched.backends.report_failure(self.backend, f"no first token within {budget:g}s")

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
        return min(r.decision.matched_blocks * self.sched.sizing.block_tokens, r.prompt_tokens)

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
        sched, r = self.sched, self.route
        sched.load.first_byte(self.backend, self.prefill)
        if 200 <= self.status < 300:
            self.confirmed = True
            if self.held:
                self.held = False
                self._own(r.hashes)
                sched.pending.release(r.parsed.model, r.hashes, self.backend, share=self.news)
        sched.metrics.ttft.observe(time.perf_counter() - r.started)
        if streamed:
            steps = sched.signals.steps
            b = self.backend
            steps.first_token(b, self.sent_at, sched.clock())
            sched.metrics.set_rhythm(b, steps.step(b), steps.lead(b))

    def _own(self, hashes: list[int], known: int = 0) -> None:
        """The engine holds this chain now. With its KV events the index learns it from
        them: until they come (or for `events.speculative_s` if they never do) the chain is
        a speculative entry beside the index; otherwise the index records it."""
        sched, r = self.sched, self.route
        s = sched.settings
        d = r.decision
        if s.index == "events":
            # only the blocks the index did not have here: the rest it knows from the
            # engine's events already (lookups carry a hold on from the index's depth)
            start = known or (d.matched_blocks if self.backend == d.backend else 0)
            sched.index.touch(r.parsed.model, hashes[:start], self.backend)
            until = sched.clock() + s.events.speculative_s
            sched.speculative.hold_until(r.parsed.model, hashes[start:], self.backend, until)
            return
        news = not known and self.news
        sched.index.record(r.parsed.model, hashes, self.backend, news=news, known=known)

    def chunk(self) -> None:
        self.sched.signals.steps.beat(self.backend, self.sched.clock())

    def done(self, answer: str | None, usage: tuple[int, int | None] | None) -> None:
        """The engine answered in full (2xx)."""
        sched, r, backend = self.sched, self.route, self.backend
        sched.backends.report_success(backend)
        sched.metrics.count_request(backend, "ok")
        predicted = self.predicted()
        sched.metrics.observe_prediction(r.prompt_tokens, predicted)
        if sched.observe is not None:
            sched.observe(r.prompt_tokens, predicted)
        if usage is not None:
            self.learn(*usage)
        if answer and self.confirmed and r.hashes:
            canonical = r.prompt.next_turn(answer).canonical
            nxt = extend_hashes(r.hashes, canonical, sched.sizing.block_bytes, r.seed)
            if len(nxt) > len(r.hashes):
                # the prompt's blocks were recorded at its first token: the answer's are new
                self._own(nxt, known=len(r.hashes))

    def learn(self, prompt: int, cached: int | None) -> None:
        """What the engine reported: its token count teaches the router's sizing, and its
        cached tokens (when it reports them: a missing count is unknown, never zero) what it
        really held against what the index predicted."""
        sched, r, backend = self.sched, self.route, self.backend
        sizing = sched.sizing
        if sizing.learn(len(r.prompt.canonical), prompt):
            sched.index.resize(sizing.block_tokens)
        if cached is None and sched.settings.cached_tokens_reported:
            cached = 0
        if cached is None:
            return
        predicted = self.predicted()
        sched.metrics.observe_usage(predicted, prompt, cached)
        if sched.settings.log_decisions:
            log.info("served backend=%s predicted_cached=%d reported_cached=%d prompt=%d",
                     backend, predicted, cached, prompt)
        d = r.decision
        if backend != d.backend or sched.settings.index != "corrected":
            return
        held = int(cached // sizing.block_tokens)  # whole blocks: engines count to the token
        # an engine computes at least a prompt's last token (vLLM caps a hit at prompt - 1),
        # so of a prompt held whole it reports one block less: not a block it dropped
        matched = min(d.matched_blocks, max(0, (prompt - 1) // sched.settings.block_size)) \
            if sizing.exact else d.matched_blocks
        if not sizing.exact and abs(held - matched) <= 1:
            held = matched  # within the estimate's own error
        if held != matched:
            sched.metrics.count_correction("over" if held < matched else "under")
            sched.index.learn(r.parsed.model, backend, matched, held)

    def failed(self, outcome: str, why: str = "", at_fault: bool = True) -> None:
        """`outcome` names it in the request metrics; a failure the backend is at fault for
        (refused, hung, cut, 502/503) counts toward ejecting it."""
        self.sched.metrics.count_request(self.backend, outcome)
        if at_fault:
            self.sched.backends.report_failure(self.backend, why or outcome)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._unslow()
        sched, backend = self.sched, self.backend
        if not self.prefilled:
            self.prefilled = True
            sched.load.first_byte(backend, self.prefill)
        sched.load.finish(backend)
        sched.metrics.set_inflight(backend, sched.load.own_inflight(backend))
        if self.held:
            self.held = False
            r = self.route
            sched.pending.release(r.parsed.model, r.hashes, backend, share=self.news)
