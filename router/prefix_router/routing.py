"""From a parsed request to a routing decision, and what is learned once it is served.

Order of work for one request: prefix key (chained block hashes) -> candidates (healthy
backends serving the model) -> ownership lookup (one store call for the whole chain) -> policy
-> (forward, in proxy.py) -> record: ownership of the prompt once it is sent, of the next-turn
prefix (prompt + answer) after the response, and the predicted-vs-reported cached tokens.
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass

from .backends import BackendSet
from .config import RouterSettings
from .errors import RequestError
from .load import LoadTracker
from .metrics import RouterMetrics
from .parsing import ParsedRequest, next_turn_canonical
from .policy import (
    Candidate,
    Decision,
    HashRing,
    RoundRobin,
    choose_chwbl,
    choose_least_loaded,
    choose_prefix,
    choose_random,
    load_limit,
)
from .prefix import block_hashes, chain_seed, extend_hashes
from .steps import StepClock
from .store import TableStore
from .warm import HandOver, HotPrefixes, plan_hand_over

log = logging.getLogger("prefix_router.decisions")

# chwbl hashes this many leading bytes of the prompt (KubeAI's default prefix length is 100
# characters).
CHWBL_PREFIX_BYTES = 100


@dataclass(slots=True)
class Plan:
    parsed: ParsedRequest
    seed: int
    hashes: list[int]
    prompt_tokens: float
    decision: Decision
    started: float


class Router:
    def __init__(
        self,
        settings: RouterSettings,
        backends: BackendSet,
        store: TableStore,
        load: LoadTracker,
        metrics: RouterMetrics,
        rng: random.Random | None = None,
    ) -> None:
        self.settings = settings
        self.backends = backends
        self.store = store
        self.load = load
        self.metrics = metrics
        self._rng = rng or random.Random()
        self._rr = RoundRobin()
        self._ring = HashRing()
        self._block_bytes = settings.block_bytes
        self._uses_table = settings.policy == "prefix"
        self.steps = StepClock()
        self.hot = HotPrefixes()
        self.hand_over = HandOver()
        self._warm = settings.warm_start and self._uses_table

    def joined(self, urls: list[str]) -> None:
        """Replicas that just joined get the hottest prefixes' first requests (warm start)."""
        if not self._warm or not urls:
            return
        now = time.monotonic()
        plan = plan_hand_over(self.hot.top(now), urls, len(self.backends.healthy()))
        self.hand_over.add(plan, now)
        if plan:
            log.info("warm start: %d hot prefixes handed to %s", len(plan), ",".join(urls))

    def left(self, url: str) -> None:
        self.hand_over.forget(url)
        self.steps.forget(url)

    def check_model(self, model: str) -> None:
        s = self.settings
        if s.models:
            if model not in s.models:
                raise RequestError(
                    404,
                    f"The model `{model}` does not exist.",
                    param="model",
                    code="model_not_found",
                )
            return
        served = self.backends.served_models()
        if served and model not in served:
            raise RequestError(
                404, f"The model `{model}` does not exist.", param="model", code="model_not_found"
            )

    async def plan(self, parsed: ParsedRequest) -> Plan:
        started = time.perf_counter()
        self.check_model(parsed.model)
        healthy = self.backends.healthy()
        if not healthy:
            raise RequestError(503, "no healthy backend is available", retry_after=1)
        if parsed.model and any(b.models for b in healthy):
            serving = [b for b in healthy if not b.models or parsed.model in b.models]
            healthy = serving or healthy
        s = self.settings
        seed = chain_seed(parsed.model, parsed.cache_salt)
        canonical = parsed.canonical
        hashes = block_hashes(canonical, self._block_bytes, seed)
        prompt_tokens = len(canonical) / s.bytes_per_token
        load = self.load
        if self._uses_table:
            matches = await self.store.lookup(parsed.model, hashes) if hashes else {}
            store = self.store
            model = parsed.model
            cands = [
                Candidate(
                    b.url,
                    load.inflight(b.url),
                    load.pending_prefill(b.url),
                    matches.get(b.url, 0),
                    store.occupancy(model, b.url),
                    store.tail_age(model, b.url),
                )
                for b in healthy
            ]
            best = max(c.matched_blocks for c in cands)
            wait_cost = s.step_wait_tokens_per_ms * 1000.0
            if wait_cost and best:  # choose_prefix ignores it on a miss
                self._step_waits(cands)
            spread = False
            if best and (self._warm or s.replicate_rate):
                now = time.monotonic()
                hot_key = hashes[best - 1]
                self.hot.observe(hot_key, now)
                if s.replicate_rate:
                    owners = sum(1 for c in cands if c.matched_blocks >= best)
                    # the demand of the whole fleet: this router sees its share of it
                    demand = self.hot.rate(hot_key, now) * self.store.routers()
                    # max_owners caps what the table records: past it, more copies would be
                    # made and never seen, again and again
                    spread = (not s.max_owners or owners < s.max_owners) and (
                        demand > owners * s.replicate_rate
                    )
            key = hashes[0] if hashes else self._rng.getrandbits(64)
            decision = choose_prefix(
                cands,
                block_tokens=s.block_size,
                eps=s.load_bound,
                load_cost_tokens=s.load_cost_tokens,
                key=key,
                pending_weight=s.pending_weight,
                prompt_blocks=len(hashes),
                evict_weight=s.evict_weight,
                load_slack=s.load_slack,
                wait_tokens_per_s=wait_cost,
                spread=spread,
            )
            if self._warm and hashes:
                decision = self._warm_start(decision, cands, hashes, time.monotonic())
        else:
            cands = [
                Candidate(b.url, load.inflight(b.url), load.pending_prefill(b.url)) for b in healthy
            ]
            policy = s.policy
            if policy == "round-robin":
                decision = self._rr.choose(cands)
            elif policy == "random":
                decision = choose_random(cands, self._rng)
            elif policy == "least-loaded":
                decision = choose_least_loaded(cands, self._rng)
            else:
                key = chain_seed(canonical[:CHWBL_PREFIX_BYTES].decode(errors="replace"), None)
                decision = choose_chwbl(cands, self._ring, key, s.chwbl_load_bound)
        self.metrics.count_decision(s.policy, decision.reason)
        self.metrics.overhead.observe(time.perf_counter() - started)
        if s.log_decisions:
            log.info(
                "route model=%s head=%016x blocks=%d backend=%s reason=%s matched=%d loads=%s",
                parsed.model,
                hashes[0] if hashes else 0,
                len(hashes),
                decision.backend,
                decision.reason,
                decision.matched_blocks,
                ",".join(
                    f"{c.name.rsplit(':', 1)[-1]}:{c.inflight:.0f}/{c.matched_blocks}"
                    for c in cands
                ),
            )
        return Plan(parsed, seed, hashes, prompt_tokens, decision, started)

    def _step_waits(self, cands: list[Candidate]) -> None:
        """Each candidate's wait for its current step to end; a backend whose rhythm is
        unknown gets the others' mean, so not knowing neither draws nor repels requests."""
        now = time.monotonic()
        known = 0.0
        n = 0
        unknown: list[Candidate] = []
        for c in cands:
            w = self.steps.wait(c.name, now)
            if w is None:
                unknown.append(c)
            else:
                c.step_wait = w
                known += w
                n += 1
        if unknown and n:
            for c in unknown:
                c.step_wait = known / n

    def beat(self, backend: str) -> None:
        """A streamed chunk from `backend` reached the router (its step rhythm)."""
        self.steps.beat(backend, time.monotonic())

    def first_token(self, backend: str, sent: float) -> None:
        """The first chunk of a stream sent at `sent` (time.monotonic) reached the router."""
        steps = self.steps
        steps.first_token(backend, sent, time.monotonic())
        self.metrics.set_rhythm(backend, steps.step(backend), steps.lead(backend))

    def _warm_start(
        self, decision: Decision, cands: list[Candidate], hashes: list[int], now: float
    ) -> Decision:
        target = self.hand_over.take(hashes, now)
        if target is None or target == decision.backend:
            return decision
        by_name = {c.name: c for c in cands}
        c = by_name.get(target)
        if c is None or c.inflight + 1 > load_limit(cands, self.settings.load_bound):
            return decision
        order = [decision.backend] + [n for n in decision.order if n != target]
        return Decision(target, "warm", c.matched_blocks, order)

    def predicted_tokens(self, plan: Plan, backend: str) -> float:
        if backend != plan.decision.backend:
            return 0.0  # a fallback's match was not looked at as closely; predict nothing
        return min(plan.decision.matched_blocks * self.settings.block_size, plan.prompt_tokens)

    def dispatch(self, plan: Plan, backend: str) -> float:
        """Count the load now, so concurrent requests see it."""
        prefill = max(plan.prompt_tokens - self.predicted_tokens(plan, backend), 0.0)
        self.load.start(backend, prefill)
        self.metrics.set_inflight(backend, self.load.own_inflight(backend))
        return prefill

    def is_news(self, plan: Plan, backend: str) -> bool:
        """Whether sending `plan` to `backend` makes it a new owner of the prompt (a hit only
        refreshes what the table, and the other routers, already know)."""
        return backend != plan.decision.backend or plan.decision.reason != "hit"

    def own(self, plan: Plan, backend: str, news: bool) -> None:
        """Record `backend` as the owner of the prompt, before the answer, so concurrent
        requests with the same prefix follow it. `news`: is_news(plan, backend), what the
        other routers need before their next request with this prefix."""
        if self._uses_table and plan.hashes:
            self.store.record(plan.parsed.model, plan.hashes, backend, urgent=news)

    def first_byte(self, backend: str, prefill: float) -> None:
        self.load.first_byte(backend, prefill)

    def finished(self, backend: str) -> None:
        self.load.finish(backend)
        self.metrics.set_inflight(backend, self.load.own_inflight(backend))

    def learn(
        self, plan: Plan, backend: str, answer: str | None, usage: tuple[int, int] | None
    ) -> None:
        predicted = self.predicted_tokens(plan, backend)
        self.metrics.observe_prediction(plan.prompt_tokens, predicted)
        self.store.observe(plan.prompt_tokens, predicted)
        if usage is not None:
            prompt, cached = usage
            self.metrics.observe_usage(predicted, prompt, cached)
            if self.settings.log_decisions:
                log.info(
                    "served backend=%s predicted_cached=%d reported_cached=%d prompt=%d",
                    backend,
                    predicted,
                    cached,
                    prompt,
                )
        if self._uses_table and answer:
            canonical = next_turn_canonical(plan.parsed, answer)
            nxt = extend_hashes(plan.hashes, canonical, self._block_bytes, plan.seed)
            if len(nxt) > len(plan.hashes):
                # the prompt's blocks were recorded when it was sent: only the answer's are news
                self.store.record(plan.parsed.model, nxt, backend, known=len(plan.hashes))
