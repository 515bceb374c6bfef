"""From a parsed request to a routing decision.

Order of work for one request: prefix key (chained block hashes) -> one index lookup for the
whole chain, merged with the chains still pending -> candidates (healthy backends serving the
model, with their load as it is after the lookup) -> the policy's profile (filters, scorers,
picker).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import xxhash

from ..backends import Backend, BackendSet
from ..config import RouterSettings
from ..errors import RequestError
from ..index import PrefixIndex
from ..index.pending import PendingIndex
from ..load import LoadTracker
from ..metrics import RouterMetrics
from ..offload import Offload
from ..parsing import ParsedRequest, next_turn_canonical
from ..prefix import block_hashes, chain_seed
from ..prompt import Prompt, PromptError
from ..sizing import Sizing
from .candidate import Ask, Candidate, Decision
from .filters import serving
from .profiles import PROFILES
from .scorers import Signals

if TYPE_CHECKING:
    from ..prompt import Renderer

log = logging.getLogger("prefix_router.decisions")


@dataclass(slots=True)
class Route:
    """A request with its decision: what the proxy forwards and the attempts record."""

    parsed: ParsedRequest
    prompt: Prompt  # what the engine runs: its key's bytes, its next turn
    seed: int
    hashes: list[int]
    prompt_tokens: float
    decision: Decision
    started: float  # time.perf_counter() when routing began


class Scheduler:
    def __init__(
        self,
        settings: RouterSettings,
        backends: BackendSet,
        index: PrefixIndex,
        load: LoadTracker,
        metrics: RouterMetrics,
        observe: Callable[[float, float], None] | None = None,
        requested: Callable[[str, list[int]], None] | None = None,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.backends = backends
        self.index = index
        self.load = load
        self.metrics = metrics
        # (prompt tokens, predicted cached tokens) of each request served: the figures a
        # shared store publishes for the autoscaler (none without one)
        self.observe = observe
        self.requested = requested
        self._models = frozenset(settings.models)
        self.clock = clock
        self.pending = PendingIndex()  # chains sent, not yet answered
        # with the engines' events: chains answered whose events have not come yet
        self.speculative = PendingIndex()
        self.signals = Signals()
        self._rng = rng or random.Random()
        self.profile = PROFILES[settings.policy](settings, self.signals, self._rng)
        self.offload = Offload()
        self.tokenizer: Renderer | None = None
        if settings.tokenizer:
            from ..prompt import Renderer  # tokenizers, jinja2: only where configured

            self.tokenizer = Renderer(settings.tokenizer)
        self.sizing = Sizing(
            settings.block_size, settings.block_bytes, settings.bytes_per_token,
            exact=self.tokenizer is not None,
        )
        self._block_bytes = self.sizing.block_bytes
        index.resize(self.sizing.block_tokens)

    def check_model(self, model: str) -> None:
        served = self._models or self.backends.served_models()
        if served and model not in served:
            raise RequestError(
                404, f"The model `{model}` does not exist.", param="model", code="model_not_found"
            )

    async def route(self, parsed: ParsedRequest) -> Route:
        started = time.perf_counter()
        self.check_model(parsed.model)
        healthy = self.backends.healthy()
        if not healthy:
            raise RequestError(503, "no healthy backend is available", retry_after=1)
        s = self.settings
        model = parsed.model
        backends = serving(healthy, model)
        seed = chain_seed(model, parsed.cache_salt)
        prompt, hashes = await self.offload.run(
            len(parsed.canonical), self._key, parsed, seed, backends)
        canonical = prompt.canonical
        profile = self.profile
        matches = await self._lookup(model, hashes) if profile.uses_index else None
        # The load is read after the lookup, never across its await: the round trip brings
        # the other routers' load, and this router's own requests routed meanwhile count too.
        # Read before it, three routers on Redis each missed the others' latest sends and
        # piled onto the same backend (bench/results/compare/redis-3x-ab/).
        load = self.load
        cands = [
            Candidate(b.url, load.inflight(b.url), load.pending_prefill(b.url)) for b in backends
        ]
        if matches is not None:
            ask = self._ask(model, hashes, matches, cands)
        elif profile.key_bytes:
            ask = Ask(xxhash.xxh3_64_intdigest(canonical[: profile.key_bytes]))
        else:
            ask = Ask(0)
        decision = profile.choose(cands, ask)
        self.metrics.count_decision(s.policy, decision.reason)
        self.metrics.overhead.observe(time.perf_counter() - started)
        if s.log_decisions:
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
        prompt_tokens = self.sizing.prompt_tokens(len(canonical))
        return Route(parsed, prompt, seed, hashes, prompt_tokens, decision, started)

    def prompt(self, parsed: ParsedRequest) -> Prompt:
        """The prompt the engine will run: rendered and tokenized as vLLM does (prompt.py)
        with a tokenizer, else the request's canonical bytes."""
        if self.tokenizer is not None:
            try:
                return self.tokenizer.request(parsed.kind, parsed.body)
            except PromptError as exc:  # what the engine would answer too
                raise RequestError(400, str(exc), param=exc.param) from None
        return Prompt(parsed.canonical, exact=False,
                      continuation=lambda answer: Prompt(next_turn_canonical(parsed, answer),
                                                         exact=False))

    def _key(self, parsed: ParsedRequest, seed: int,
             backends: list[Backend]) -> tuple[Prompt, list[int]]:
        """The prompt and its chain of block hashes, once it is known to fit: a prompt
        longer than the engines take is refused before any work on the index. Pure CPU:
        large prompts run in a worker thread (offload.py)."""
        prompt = self.prompt(parsed)
        limit = min(
            (b.max_model_len for b in backends if b.max_model_len),
            default=self.settings.max_prompt_tokens,
        )
        tokens = self.sizing.prompt_tokens(len(prompt.canonical))
        # with byte blocks the count is an estimate: only what is far over is refused here
        if tokens > limit * (1.0 if self.sizing.exact else 2.0):
            what = "tokens" if self.sizing.exact else "tokens, estimated"
            raise RequestError(
                400,
                f"the prompt ({tokens:.0f} {what}) is longer than the model's context of "
                f"{limit} tokens",
                param="messages" if parsed.kind == "chat" else "prompt",
                code="context_length_exceeded",
            )
        return prompt, block_hashes(prompt.canonical, self._block_bytes, seed)

    async def _lookup(self, model: str, hashes: list[int]) -> dict[str, int]:
        """Each backend's leading blocks of the chain: the index's, merged with the chains
        still pending."""
        if self.requested is not None and hashes:
            self.requested(model, hashes)
        matches = await self.index.lookup(model, hashes) if hashes else {}
        self.speculative.expire(self.clock())
        matches = self.pending.merge(model, hashes, matches)
        return self.speculative.merge(model, hashes, matches)

    def _ask(
        self, model: str, hashes: list[int], matches: dict[str, int], cands: list[Candidate]
    ) -> Ask:
        """Fill each candidate's match and cache state; the request as scored."""
        index = self.index
        now = self.clock()
        best = 0
        for c in cands:
            m = c.matched_blocks = matches.get(c.name, 0)
            best = max(best, m)
            c.occupancy = index.occupancy(model, c.name)
            c.tail_age = index.tail_age(model, c.name)
        key = hashes[0] if hashes else self._rng.getrandbits(64)
        return Ask(key, len(hashes), best, now)

    def model_of(self, backend: str) -> str | None:
        """The model a backend serves, when that is one model (its KV events do not say)."""
        if self.settings.models:
            return self.settings.models[0]
        b = self.backends.get(backend)
        served = b.models if b is not None else frozenset()
        return next(iter(served)) if len(served) == 1 else None

    def left(self, backend: str) -> None:
        """A backend left or was ejected: what was learned of its rhythm goes with it."""
        self.signals.steps.forget(backend)
        self.speculative.drop_backend(backend)
