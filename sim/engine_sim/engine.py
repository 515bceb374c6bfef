"""One simulated engine: continuous batching over a paged prefix cache, on asyncio.

Requests wait in FIFO order; the head is admitted when a running slot (max_num_seqs) and its KV
blocks are free (no skipping ahead, as vLLM's FCFS policy). Each step the scheduler prefills up
to max_batched_tokens of UNCACHED prompt tokens and decodes one token for every sequence past
prefill, then sleeps for the profile's step time. Token delivery goes to per-request queues.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass, field

from .kvcache import PrefixCache, block_hashes
from .profiles import Profile, step_time
from .tokenizer import BYTES_PER_TOKEN, count_tokens

# 4-byte output pieces (one token each) so len(output bytes) == 4 x completion tokens.
_PIECES = [a + b + c + " " for a in "bdfklmnprstvz" for b in "aeiou" for c in "nrstl"]


def output_piece(seed: int, i: int) -> str:
    return _PIECES[(seed * 2654435761 + i * 40503) % len(_PIECES)]


@dataclass(eq=False)
class Request:
    prompt: bytes
    max_tokens: int
    seed: int
    prompt_tokens: int = 0
    hashes: list[int] = field(default_factory=list)
    total_blocks: int = 0
    cached_tokens: int = 0
    prefill_left: int = 0
    generated: int = 0
    arrived: float = 0.0
    first_token_at: float | None = None
    out: asyncio.Queue[str | None] = field(default_factory=asyncio.Queue)
    done: bool = False
    cancelled: bool = False
    admitted: bool = False
    text: list[str] = field(default_factory=list)


@dataclass
class Counters:
    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    generation_tokens: int = 0
    # Seconds from arrival to first token of each request since the last reset (for the
    # benchmark: the engine's own TTFT beside the client's; bounded, oldest kept).
    ttfts: list[float] = field(default_factory=list)
    # (x-request-id, received, arrived, first token, first chunk written), perf_counter seconds
    # (CLOCK_MONOTONIC, the same clock in every process here), of the streaming requests that
    # carried an x-request-id: `bench run --requests-out` splits each TTFT with them.
    timings: list[tuple[str, float, float, float, float]] = field(default_factory=list)


class Engine:
    def __init__(
        self,
        profile: Profile,
        kv_capacity_tokens: int,
        block_size: int = 16,
        max_num_seqs: int = 256,
        time_scale: float = 1.0,
        on_first_token=None,
        on_finish=None,
    ) -> None:
        self.profile = profile
        self.block_size = block_size
        self.max_num_seqs = max_num_seqs
        self.time_scale = time_scale
        self.cache = PrefixCache(kv_capacity_tokens, block_size)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.counters = Counters()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._on_first_token = on_first_token
        self._on_finish = on_finish

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="engine")

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()

    def reset(self) -> None:
        self.counters = Counters()
        if not self.running and not self.waiting:
            self.cache = PrefixCache(self.cache.capacity_blocks * self.block_size, self.block_size)

    def fits(self, prompt_tokens: int, max_tokens: int) -> bool:
        return -(-(prompt_tokens + max_tokens) // self.block_size) <= self.cache.capacity_blocks

    def submit(self, prompt: bytes, max_tokens: int, seed: int) -> Request:
        r = Request(prompt=prompt, max_tokens=max_tokens, seed=seed)
        r.prompt_tokens = count_tokens(prompt)
        r.hashes = block_hashes(prompt, self.block_size)
        # Blocks held now: the prompt and room for the first output token. Decode blocks are
        # added one at a time as the sequence grows, as vLLM allocates them (not up front).
        r.total_blocks = -(-(r.prompt_tokens + 1) // self.block_size)
        r.arrived = time.perf_counter()
        if self.profile.step_base_s == 0 and self.profile.prefill_per_token_s == 0:
            self._run_instantly(r)
        else:
            self.waiting.append(r)
            self._wake.set()
        return r

    def cancel(self, r: Request) -> None:
        if r.done:
            return
        r.cancelled = True
        if r in self.waiting:
            self.waiting.remove(r)
            r.done = True
        elif r.admitted:
            self._finish(r, cache_output=False)

    def _admit(self, r: Request) -> None:
        hit = self.cache.match(r.hashes, r.prompt_tokens)
        self.cache.allocate(r.hashes, r.total_blocks)
        r.cached_tokens = hit * self.block_size
        r.prefill_left = r.prompt_tokens - r.cached_tokens
        r.admitted = True
        c = self.counters
        c.requests += 1
        c.prompt_tokens += r.prompt_tokens
        c.cached_tokens += r.cached_tokens
        self.running.append(r)

    def _run_instantly(self, r: Request) -> None:
        self._admit(r)
        r.prefill_left = 0
        r.first_token_at = time.perf_counter()
        if self._on_first_token:
            self._on_first_token(r)
        for i in range(r.max_tokens):
            piece = output_piece(r.seed, i)
            r.text.append(piece)
            r.out.put_nowait(piece)
        r.generated = r.max_tokens
        self.counters.generation_tokens += r.max_tokens
        self._finish(r, cache_output=True)

    def _finish(self, r: Request, cache_output: bool) -> None:
        r.done = True
        if r in self.running:
            self.running.remove(r)
        final = None
        if cache_output and r.generated:
            final = block_hashes(r.prompt + "".join(r.text).encode(), self.block_size)
        self.cache.release(r.hashes, r.total_blocks, final)
        r.out.put_nowait(None)
        if self._on_finish:
            self._on_finish(r)
        self._wake.set()

    async def _loop(self) -> None:
        p = self.profile
        while True:
            while not self.running and not self.waiting:
                self._wake.clear()
                await self._wake.wait()
            # admission: FIFO head only
            while self.waiting and len(self.running) < self.max_num_seqs:
                head = self.waiting[0]
                if not self.cache.can_allocate(head.hashes, head.total_blocks):
                    break
                self.waiting.popleft()
                self._admit(head)
            if not self.running:
                # the head cannot fit even with an empty batch: wait for something to change
                self._wake.clear()
                await self._wake.wait()
                continue
            budget = p.max_batched_tokens
            prefill_now: list[tuple[Request, int]] = []
            decoding: list[Request] = []
            context = 0
            for r in self.running:
                if r.prefill_left > 0:
                    if budget > 0:
                        n = min(r.prefill_left, budget)
                        budget -= n
                        prefill_now.append((r, n))
                else:
                    decoding.append(r)
                    context += r.prompt_tokens + r.generated
            prefill_tokens = p.max_batched_tokens - budget
            await asyncio.sleep(step_time(p, prefill_tokens, context, self.time_scale))
            now = time.perf_counter()
            for r, n in prefill_now:
                if r.done:
                    continue
                r.prefill_left -= n
                if r.prefill_left == 0:
                    self._emit(r, now)  # the prefill step produces the first token
            for r in decoding:
                if not r.done:
                    self._emit(r, now)

    def _emit(self, r: Request, now: float) -> None:
        if r.first_token_at is None:
            r.first_token_at = now
            if self._on_first_token:
                self._on_first_token(r)
        piece = output_piece(r.seed, r.generated)
        r.text.append(piece)
        r.generated += 1
        self.counters.generation_tokens += 1
        if r.prompt_tokens + r.generated + 1 > r.total_blocks * self.block_size:
            r.total_blocks += 1
            self.cache.grow(1)
        r.out.put_nowait(piece)
        if r.generated >= r.max_tokens:
            self._finish(r, cache_output=True)


__all__ = ["BYTES_PER_TOKEN", "Engine", "Request"]
