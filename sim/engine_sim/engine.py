"""The engine: one asyncio task that runs the scheduler's steps in (scaled) simulated time.

Requests come in through `submit`, their tokens go out through a per-request queue. The loop
sleeps while idle (no CPU burnt), and sleeps each step's duration x time_scale while busy,
against a running deadline so the loop's own latency does not stretch simulated time.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from .generation import OutputStream
from .kvcache import PrefixCache
from .profiles import Profile
from .scheduler import Scheduler, Sequence, Step

log = logging.getLogger("engine_sim.engine")

# How far behind its deadline the loop may fall before it stops trying to catch up (a burst
# of zero-length sleeps would be worse than a little drift).
_MAX_LAG_S = 0.05


class EngineError(ValueError):
    """A request the engine cannot take (reported to the client as a 400)."""


@dataclass
class Stats:
    """Counters behind GET /stats; reset by POST /reset."""

    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    generation_tokens: int = 0
    aborted: int = 0

    def reset(self) -> None:
        self.requests = self.prompt_tokens = self.cached_tokens = 0
        self.generation_tokens = self.aborted = 0


@dataclass(eq=False)
class Request:
    seq: Sequence
    arrival: float
    queue: asyncio.Queue[str | None] = field(default_factory=asyncio.Queue)
    admitted_at: float | None = None
    first_token_at: float | None = None
    finished_at: float | None = None

    @property
    def prompt_tokens(self) -> int:
        return self.seq.num_prompt

    @property
    def cached_tokens(self) -> int:
        return self.seq.num_cached

    @property
    def completion_tokens(self) -> int:
        return len(self.seq.output_ids)

    @property
    def done(self) -> bool:
        return self.seq.finished or self.seq.aborted


class EngineObserver:
    """Hooks for metrics; the default does nothing."""

    def on_admitted(self, req: Request) -> None: ...
    def on_first_token(self, req: Request) -> None: ...
    def on_finished(self, req: Request) -> None: ...
    def on_step(self, step: Step) -> None: ...
    def on_tokens(self, count: int) -> None: ...


class Engine:
    def __init__(
        self,
        profile: Profile,
        cache: PrefixCache,
        max_num_seqs: int,
        *,
        time_scale: float = 1.0,
        observer: EngineObserver | None = None,
    ) -> None:
        if time_scale < 0:
            raise ValueError("time_scale must be >= 0")
        self.profile = profile
        self.cache = cache
        self.scheduler = Scheduler(cache, profile, max_num_seqs)
        self.time_scale = time_scale
        self.observer = observer or EngineObserver()
        self.stats = Stats()
        self._requests: dict[Sequence, Request] = {}
        self._ids = itertools.count()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    # ---- lifecycle --------------------------------------------------------------------

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="engine")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None

    # ---- state ------------------------------------------------------------------------

    @property
    def num_running(self) -> int:
        return len(self.scheduler.running)

    @property
    def num_waiting(self) -> int:
        return len(self.scheduler.waiting)

    def reset(self) -> None:
        """Zero the /stats counters and drop every cached block not in use."""
        self.stats.reset()
        self.cache.reset()

    # ---- requests ---------------------------------------------------------------------

    def submit(self, prompt_ids: list[int], max_tokens: int, seed: int | None = None) -> Request:
        if not prompt_ids:
            raise EngineError("The prompt cannot be empty.")
        if max_tokens < 1:
            raise EngineError(f"max_tokens must be at least 1, got {max_tokens}.")
        if not self.scheduler.fits_ever(len(prompt_ids), max_tokens):
            raise EngineError(
                f"The request needs {len(prompt_ids) + max_tokens} tokens of KV cache, more "
                f"than this engine's whole capacity of {self.cache.capacity_tokens} tokens."
            )
        seq = Sequence(
            request_id=f"req-{next(self._ids)}",
            prompt_ids=prompt_ids,
            max_tokens=max_tokens,
            output=OutputStream(prompt_ids, seed),
        )
        req = Request(seq, arrival=time.monotonic())
        self._requests[seq] = req
        self.scheduler.add(seq)
        self._wake.set()
        return req

    def abort(self, req: Request) -> None:
        if req.done:
            return
        self.scheduler.abort(req.seq)
        self._requests.pop(req.seq, None)
        self.stats.aborted += 1
        self._wake.set()

    async def stream(self, req: Request) -> AsyncIterator[str]:
        """The output pieces of a submitted request; aborts it if the consumer stops early."""
        try:
            while True:
                piece = await req.queue.get()
                if piece is None:
                    return
                yield piece
        finally:
            # Reached on cancellation (client gone) and on an early close of the iterator:
            # the slot and the blocks must not outlive the consumer.
            self.abort(req)

    async def generate(
        self, prompt_ids: list[int], max_tokens: int, seed: int | None = None
    ) -> list[str]:
        """Submit and wait for the whole answer (pieces in order)."""
        req = self.submit(prompt_ids, max_tokens, seed)
        return [piece async for piece in self.stream(req)]

    # ---- the loop ---------------------------------------------------------------------

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time()
        while True:
            step = self.scheduler.schedule()
            if step is None:
                self._wake.clear()
                await self._wake.wait()
                deadline = loop.time()
                continue
            now = time.monotonic()
            for seq in step.admitted:
                req = self._requests[seq]
                req.admitted_at = now
                self.stats.requests += 1
                self.stats.prompt_tokens += seq.num_prompt
                self.stats.cached_tokens += seq.num_cached
                self.observer.on_admitted(req)
            self.observer.on_step(step)
            deadline += step.duration * self.time_scale
            now_loop = loop.time()
            if deadline < now_loop - _MAX_LAG_S:
                deadline = now_loop
            # sleep(0) still yields, so a zero-time profile lets handlers run between steps.
            await asyncio.sleep(max(0.0, deadline - now_loop))
            self._deliver(step)

    def _deliver(self, step: Step) -> None:
        now = time.monotonic()
        events = self.scheduler.complete(step)
        if events:
            self.observer.on_tokens(len(events))
        for ev in events:
            req = self._requests.get(ev.seq)
            if req is None:
                continue
            self.stats.generation_tokens += 1
            if req.first_token_at is None:
                req.first_token_at = now
                self.observer.on_first_token(req)
            req.queue.put_nowait(ev.text)
            if ev.finished:
                req.finished_at = now
                req.queue.put_nowait(None)
                del self._requests[ev.seq]
                self.observer.on_finished(req)
