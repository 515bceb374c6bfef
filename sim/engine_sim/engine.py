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
With a CPU tier (`cpu_offload_tokens`: vLLM's CPU offloading), a block the GPU evicts moves
there; a request's blocks after its GPU hit that the CPU tier holds are loaded back, at the
profile's load time a token in the step that admits it, instead of prefilled. With a sliding
window (`window_tokens`: a hybrid model), a second KV-cache group caches the same blocks in a
pool of its own, with events of group_idx 1, and a hit needs its blocks of the window before
the hit point too (vLLM's rule for sliding-window groups).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .kvcache import CpuTier, PrefixCache
from .profiles import Profile, step_time
from .sequences import ByteSequences, LoRA, TokenSequences, extra_keys
from .tokenizer import BYTES_PER_TOKEN, count_tokens

if TYPE_CHECKING:
    from prefix_router.prompt import MultiModalPart

    from .kvevents import KVEventPublisher

PREEMPTION = ("off", "recompute")


@dataclass(eq=False)
class Request:
    prompt: bytes
    max_tokens: int
    seed: int
    ids: list[int] | None = None  # the prompt's token ids, with a real tokenizer
    mm: tuple[MultiModalPart, ...] = ()  # its media items (placeholder tokens and hash)
    lora: LoRA | None = None
    salt: str | None = None
    prompt_tokens: int = 0
    hashes: list[int] = field(default_factory=list)
    total_blocks: int = 0
    cached_tokens: int = 0
    prefill_left: int = 0
    load_left: int = 0  # tokens to load from the CPU tier before its prefill goes on
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
    cpu_cached_tokens: int = 0  # of cached_tokens, those loaded from the CPU tier
    generation_tokens: int = 0
    preemptions: int = 0
    # Steps that only decoded, and their wall time in all: the engine's own step rhythm, which
    # what a router reads from the streams (its steps.py) is checked against.
    decode_steps: int = 0
    decode_step_seconds: float = 0.0
    # what the profile asked those steps to take: against the wall time, how far a busy
    # host's event loop lags the model
    decode_step_model_seconds: float = 0.0
    # Every step and the tokens it computed (vLLM's vllm:iteration_tokens_total): a long
    # chunked prefill moves them while no token comes out yet.
    steps: int = 0
    step_tokens: int = 0
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
        cpu_offload_tokens: int = 0,
        window_tokens: int = 0,
        window_capacity_tokens: int = 0,
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
        # a hybrid model's sliding-window KV-cache group (group 1), in a pool of its own
        self.window_tokens = window_tokens
        self.window: PrefixCache | None = None
        if window_tokens > 0:
            self.window = PrefixCache(window_capacity_tokens or kv_capacity_tokens, block_size)
            if events is not None:
                self.window.on_evict = lambda h: events.removed(h, group_idx=1)
        if cpu_offload_tokens > 0:
            cpu = self.cache.cpu = CpuTier(cpu_offload_tokens, block_size)
            if events is not None:
                cpu.on_store = events.offloaded
                cpu.on_evict = events.offload_evicted
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.counters = Counters()
        self.cache_resets = 0  # times the whole cache was emptied (not reset with counters)
        self.sleep_level = 0  # vLLM's sleep mode: 0 awake, 1 weights offloaded, 2 discarded
        self._wake = asyncio.Event()
        # A fault: while cleared the engine takes requests and steps no more (its /health and
        # /metrics still answer), as a wedged GPU worker behind a live API server looks.
        self.moving = asyncio.Event()
        self.moving.set()
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
            if self.cache.cpu is not None:
                self.cache.cpu.clear()
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
        if self.window is not None:
            self.window.clear()
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
        mm: tuple[MultiModalPart, ...] = (),
    ) -> Request:
        r = Request(prompt=prompt, max_tokens=max_tokens, seed=seed, ids=ids, lora=lora, salt=salt,
                    mm=mm)
        r.prompt_tokens = len(ids) if ids is not None else count_tokens(prompt)
        r.hashes = self.seqs.prompt_hashes(r)
        # Blocks held now: the prompt and room for the first output token. Decode blocks are
        # added one at a time as the sequence grows, as vLLM allocates them (not up front).
        r.total_blocks = -(-(r.prompt_tokens + 1) // self.block_size)
        r.arrived = time.perf_counter()
        instant = self.profile.step_base_s == 0 and self.profile.prefill_per_token_s == 0
        if instant and self.moving.is_set():
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
    def _stored(self, r: Request, hashes: list[int], new: list[int], group: int = 0) -> None:
        """Publish the blocks at indices `new` of `hashes` (r's chain) as stored: one
        BlockStored for each run of consecutive blocks, as vLLM stores a run at a time; for
        each KV-cache group (1: the sliding-window one)."""
        window = {"group_idx": 1, "kind": "sliding_window", "window": self.window_tokens}
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
                extra_keys=extra_keys(r, first, last, self.block_size),
                **(window if group else {}),
            )
            i = j + 1

    def _flush(self) -> None:
        if self.events is not None:
            self.events.flush()

    def _admit(self, r: Request) -> None:
        resumed = r.preemptions > 0
        seq_tokens = r.prompt_tokens + r.generated
        hit = self.cache.match(r.hashes, seq_tokens)
        if self.window is not None:
            hit = self._window_hit(r.hashes, hit)
        # the blocks after the GPU hit that the CPU tier holds are loaded, not computed (as
        # vLLM's offloading connector looks up from where the GPU hit ends)
        cpu = self.cache.cpu
        loaded = cpu.run(r.hashes, hit, seq_tokens, self.block_size) if cpu is not None else 0
        new: list[int] | None = [] if self.events is not None else None
        self.cache.allocate(r.hashes, r.total_blocks, new)
        if new:
            self._stored(r, r.hashes, new)
        if self.window is not None:
            new = [] if self.events is not None else None
            self.window.allocate(r.hashes, r.total_blocks, new)
            if new:
                self._stored(r, r.hashes, new, group=1)
        r.prefill_left = seq_tokens - (hit + loaded) * self.block_size
        r.load_left = loaded * self.block_size
        r.admitted = True
        self.running.append(r)
        if resumed:
            return  # usage and prefix-cache figures count a request's first admission only
        r.cached_tokens = (hit + loaded) * self.block_size
        c = self.counters
        c.requests += 1
        c.prompt_tokens += r.prompt_tokens
        c.cached_tokens += r.cached_tokens
        c.cpu_cached_tokens += loaded * self.block_size

    def _release(self, r: Request, cache_output: bool) -> None:
        final = self.seqs.final_hashes(r) if cache_output and r.generated else None
        new: list[int] | None = [] if self.events is not None and final else None
        self.cache.release(r.hashes, r.total_blocks, final, new)
        if new:
            self._stored(r, final, new)
        if self.window is not None:
            new = [] if self.events is not None and final else None
            self.window.release(r.hashes, r.total_blocks, final, new)
            if new:
                self._stored(r, final, new, group=1)

    def _window_hit(self, hashes: list[int], hit: int) -> int:
        """vLLM's hit for a hybrid model: the longest n <= the full-attention hit for which the
        sliding-window group holds the blocks of the window before n, ceil((W - 1) / B) of
        them (SlidingWindowManager.find_longest_cache_hit)."""
        window = self.window
        assert window is not None
        tail = max(1, -(-(self.window_tokens - 1) // self.block_size))
        for n in range(hit, 0, -1):
            if all(window.holds(hashes[i]) for i in range(max(0, n - tail), n)):
                return n
        return 0

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
            await self.moving.wait()
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
            # what admitted requests load from the CPU tier holds up the step it is loaded in
            loading = 0
            for r in self.running:
                loading += r.load_left
                r.load_left = 0
            began = time.perf_counter()
            modelled = step_time(p, prefill_tokens, context, self.time_scale, loading)
            await asyncio.sleep(modelled)
            now = time.perf_counter()
            self.counters.steps += 1
            self.counters.step_tokens += prefill_tokens + len(decoding)
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
