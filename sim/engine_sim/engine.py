"""One simulated engine: continuous batching over a paged prefix cache, on asyncio.

Requests wait in FIFO order; the head is admitted when a running slot (max_num_seqs) and its KV
blocks are free (no skipping ahead, as vLLM's FCFS policy). Each step the scheduler prefills up
to max_batched_tokens of UNCACHED prompt tokens and decodes one token for every sequence past
prefill, then sleeps for the profile's step time. Token delivery goes to per-request queues.

A sequence that needs one more block when none is free either over-commits the cache briefly
(`preemption="off"`, the default with the byte tokenizer) or preempts, as vLLM v1 does with
recompute (`"recompute"`): the newest running request loses its blocks (they stay cached,
unreferenced, so LRU may evict them) and goes back to the head of the queue, to be prefilled
again over its prompt and what it had generated. With a KV-event publisher, every block that
enters the cache, every eviction and every reset is published once a step (kvevents.py).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .kvcache import PrefixCache
from .profiles import Profile, step_time
from .sequences import ByteSequences, LoRA, TokenSequences, extra_keys
from .tokenizer import BYTES_PER_TOKEN, count_tokens

if TYPE_CHECKING:
    from .kvevents import KVEventPublisher

PREEMPTION = ("off", "recompute")


@dataclass(eq=False)
class Request:
    prompt: bytes
    max_tokens: int
    seed: int
    ids: list[int] | None = None  # the prompt's token ids, with a real tokenizer
    lora: LoRA | None = None
    salt: str | None = None
    prompt_tokens: int = 0
    hashes: list[int] = field(default_factory=list)
    total_blocks: int = 0
    cached_tokens: int = 0
    prefill_left: int = 0
    generated: int = 0
    preemptions: int = 0
    arrived: float = 0.0
    first_token_at: float | None = None
    out: asyncio.Queue[str | None] = field(default_factory=asyncio.Queue)
    done: bool = False
    cancelled: bool = False
    admitted: bool = False
    text: list[str] = field(default_factory=list)
    out_ids: list[int] = field(default_factory=list)


@dataclass
class Counters:
    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    generation_tokens: int = 0
    preemptions: int = 0
    # Steps that only decoded, and their wall time in all: the engine's own step rhythm, which
    # what a router reads from the streams (its steps.py) is checked against.
    decode_steps: int = 0
    decode_step_seconds: float = 0.0
    # what the profile asked those steps to take: against the wall time, how far a busy
    # host's event loop lags the model
    decode_step_model_seconds: float = 0.0
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
        *,
        sequences: ByteSequences | TokenSequences | None = None,
        preemption: str = "off",
        events: KVEventPublisher | None = None,
    ) -> None:
        if preemption not in PREEMPTION:
            raise ValueError(f"preemption must be one of {PREEMPTION}")
        self.profile = profile
        self.block_size = block_size
        self.max_num_seqs = max_num_seqs
        self.time_scale = time_scale
        self.seqs = sequences or ByteSequences(block_size)
        if self.seqs.block_size != block_size:
            raise ValueError("the sequences' block size differs from the engine's")
        self.preemption = preemption
        self.events = events
        self.cache = PrefixCache(kv_capacity_tokens, block_size)
        if events is not None:
            self.cache.on_evict = events.removed
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.counters = Counters()
        self.cache_resets = 0  # times the whole cache was emptied (not reset with counters)
        self.sleep_level = 0  # vLLM's sleep mode: 0 awake, 1 weights offloaded, 2 discarded
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._on_first_token = on_first_token
        self._on_finish = on_finish
        self.on_preempt = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="engine")

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()

    def reset(self) -> None:
        """Counters back to zero and, when idle, an empty cache (between benchmark runs)."""
        self.counters = Counters()
        if not self.running and not self.waiting:
            self._clear_cache()
            self._flush()

    def reset_prefix_cache(self) -> int:
        """vLLM's reset_prefix_cache with running requests reset too: every running request is
        preempted (recomputed later), then every cached block is dropped. Returns the number
        of requests preempted."""
        n = 0
        while self.running:
            self._preempt(self.running[-1])
            n += 1
        self._clear_cache()
        self._flush()
        self._wake.set()
        return n

    def sleep(self, level: int) -> None:
        """vLLM's sleep mode: both levels discard the KV cache (level 1 offloads the weights,
        level 2 discards them too); what was running is recomputed after wake_up."""
        if level not in (1, 2):
            raise ValueError("level must be 1 or 2")
        if not self.sleep_level:
            self.reset_prefix_cache()
        self.sleep_level = level

    def wake_up(self) -> None:
        self.sleep_level = 0

    def _clear_cache(self) -> None:
        self.cache_resets += 1
        self.cache.clear()
        if self.events is not None:
            self.events.cleared()

    def fits(self, prompt_tokens: int, max_tokens: int) -> bool:
        return -(-(prompt_tokens + max_tokens) // self.block_size) <= self.cache.capacity_blocks

    def submit(
        self,
        prompt: bytes,
        max_tokens: int,
        seed: int,
        *,
        ids: list[int] | None = None,
        lora: LoRA | None = None,
        salt: str | None = None,
    ) -> Request:
        r = Request(prompt=prompt, max_tokens=max_tokens, seed=seed, ids=ids, lora=lora, salt=salt)
        r.prompt_tokens = len(ids) if ids is not None else count_tokens(prompt)
        r.hashes = self.seqs.prompt_hashes(r)
        # Blocks held now: the prompt and room for the first output token. Decode blocks are
        # added one at a time as the sequence grows, as vLLM allocates them (not up front).
        r.total_blocks = -(-(r.prompt_tokens + 1) // self.block_size)
        r.arrived = time.perf_counter()
        if self.profile.step_base_s == 0 and self.profile.prefill_per_token_s == 0:
            self._run_instantly(r)
            self._flush()
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
        self._flush()

    # -- the cache, with events ------------------------------------------------------------
    def _stored(self, r: Request, hashes: list[int], new: list[int]) -> None:
        """Publish the blocks at indices `new` of `hashes` (r's chain) as stored: one
        BlockStored for each run of consecutive blocks, as vLLM stores a run at a time."""
        ev = self.events
        i = 0
        while i < len(new):
            j = i
            while j + 1 < len(new) and new[j + 1] == new[j] + 1:
                j += 1
            first, last = new[i], new[j] + 1
            ev.stored(
                hashes[first:last],
                hashes[first - 1] if first else None,
                self.seqs.block_ids(r, first, last),
                lora_id=r.lora.id if r.lora else None,
                lora_name=r.lora.name if r.lora else None,
                extra_keys=extra_keys(r, first, last),
            )
            i = j + 1

    def _flush(self) -> None:
        if self.events is not None:
            self.events.flush()

    def _admit(self, r: Request) -> None:
        resumed = r.preemptions > 0
        seq_tokens = r.prompt_tokens + r.generated
        hit = self.cache.match(r.hashes, seq_tokens)
        new: list[int] | None = [] if self.events is not None else None
        self.cache.allocate(r.hashes, r.total_blocks, new)
        if new:
            self._stored(r, r.hashes, new)
        r.prefill_left = seq_tokens - hit * self.block_size
        r.admitted = True
        self.running.append(r)
        if resumed:
            return  # usage and prefix-cache figures count a request's first admission only
        r.cached_tokens = hit * self.block_size
        c = self.counters
        c.requests += 1
        c.prompt_tokens += r.prompt_tokens
        c.cached_tokens += r.cached_tokens

    def _release(self, r: Request, cache_output: bool) -> None:
        final = self.seqs.final_hashes(r) if cache_output and r.generated else None
        new: list[int] | None = [] if self.events is not None and final else None
        self.cache.release(r.hashes, r.total_blocks, final, new)
        if new:
            self._stored(r, final, new)

    def _preempt(self, r: Request) -> None:
        """vLLM v1's preemption by recompute: free the blocks (what was computed stays cached,
        unreferenced) and requeue at the head, to prefill prompt + output again."""
        self.running.remove(r)
        self._release(r, cache_output=True)
        r.admitted = False
        r.hashes = self.seqs.resume_hashes(r)
        r.total_blocks = -(-(r.prompt_tokens + r.generated + 1) // self.block_size)
        r.preemptions += 1
        self.counters.preemptions += 1
        self.waiting.appendleft(r)
        if self.on_preempt is not None:
            self.on_preempt(r)

    def _make_room_for(self, r: Request) -> None:
        """r needs one more block and none is free: preempt the newest running requests
        until one is (possibly r itself, which then waits at the head of the queue)."""
        while not self.cache.can_grow(1) and self.running:
            victim = self.running[-1]
            self._preempt(victim)
            if victim is r:
                return

    # -- scheduling ------------------------------------------------------------------------
    def _run_instantly(self, r: Request) -> None:
        self._admit(r)
        r.prefill_left = 0
        r.first_token_at = time.perf_counter()
        if self._on_first_token:
            self._on_first_token(r)
        piece = self.seqs.piece
        for i in range(r.max_tokens):
            text = piece(r, i)
            r.text.append(text)
            r.out.put_nowait(text)
        r.generated = r.max_tokens
        self.counters.generation_tokens += r.max_tokens
        self._finish(r, cache_output=True)

    def _finish(self, r: Request, cache_output: bool) -> None:
        r.done = True
        if r in self.running:
            self.running.remove(r)
        self._release(r, cache_output)
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
                self._flush()
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
            began = time.perf_counter()
            modelled = step_time(p, prefill_tokens, context, self.time_scale)
            await asyncio.sleep(modelled)
            now = time.perf_counter()
            if not prefill_now:
                self.counters.decode_steps += 1
                self.counters.decode_step_seconds += now - began
                self.counters.decode_step_model_seconds += modelled
            for r, n in prefill_now:
                if r.done or not r.admitted:
                    continue
                r.prefill_left -= n
                if r.prefill_left == 0:
                    self._emit(r, now)  # the prefill step produces the first token
            for r in decoding:
                if not r.done and r.admitted:
                    self._emit(r, now)
            self._flush()

    def _emit(self, r: Request, now: float) -> None:
        if r.first_token_at is None:
            r.first_token_at = now
            if self._on_first_token:
                self._on_first_token(r)
        piece = self.seqs.piece(r, r.generated)
        r.text.append(piece)
        r.generated += 1
        self.counters.generation_tokens += 1
        if r.prompt_tokens + r.generated + 1 > r.total_blocks * self.block_size:
            if self.preemption == "off":
                r.total_blocks += 1
                self.cache.grow(1)  # over-commits briefly when nothing can be evicted
            elif r.generated < r.max_tokens:  # the last token is never fed back: no block
                if not self.cache.can_grow(1):
                    self._make_room_for(r)
                if r.admitted:
                    r.total_blocks += 1
                    self.cache.grow(1)
        r.out.put_nowait(piece)
        if r.generated >= r.max_tokens:
            self._finish(r, cache_output=True)


__all__ = ["BYTES_PER_TOKEN", "Engine", "Request"]
