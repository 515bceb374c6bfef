"""Continuous batching, as pure logic: which sequences run in the next step and for how long.

No clock and no I/O here: `schedule()` plans a step and says how long it takes in simulated
seconds, `complete(step)` applies it and returns the tokens it produced. The asyncio engine
sleeps in between; tests drive the two calls directly and add up durations exactly.

Policy (vLLM V1's, simplified):
- at most `max_num_seqs` sequences run; the rest wait in FIFO order, head-of-line blocking
  (a waiting request that does not fit stops admission, as vLLM's scheduler does);
- a request is admitted when a slot is free and the KV cache can reserve blocks for its whole
  prompt + max_tokens (reserving up front means no preemption is ever needed);
- each step has a token budget: one token for every sequence in decode, then prompt chunks of
  sequences in prefill, oldest first, then newly admitted ones (chunked prefill);
- a sequence whose prefill completes in a step samples its first token in that step;
- full blocks are committed to the prefix cache as their KV is computed, output blocks too, so
  a follow-up turn that carries the answer hits it.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from .generation import OutputStream
from .kvcache import Allocation, PrefixCache, block_hashes
from .profiles import Profile


@dataclass(eq=False)
class Sequence:
    request_id: str
    prompt_ids: list[int]
    max_tokens: int
    output: OutputStream
    prompt_hashes: list[int] = field(default_factory=list)
    alloc: Allocation | None = None
    num_cached: int = 0
    # Prompt tokens whose KV has been computed (cached ones included).
    num_computed: int = 0
    output_ids: list[int] = field(default_factory=list)
    # Chained hashes of the sequence's full blocks, as far as computed (prompt, then output).
    hashes: list[int] = field(default_factory=list)
    # Blocks already committed to (or found in) the cache.
    num_committed: int = 0
    finished: bool = False
    aborted: bool = False

    @property
    def num_prompt(self) -> int:
        return len(self.prompt_ids)

    @property
    def in_prefill(self) -> bool:
        return self.num_computed < len(self.prompt_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)


@dataclass
class Step:
    decode: list[Sequence]
    prefill: list[tuple[Sequence, int]]
    admitted: list[Sequence]
    duration: float
    context_tokens: int = 0

    @property
    def prefill_tokens(self) -> int:
        return sum(n for _, n in self.prefill)


@dataclass(frozen=True)
class TokenEvent:
    seq: Sequence
    token_id: int
    text: str
    finished: bool


class Scheduler:
    def __init__(self, cache: PrefixCache, profile: Profile, max_num_seqs: int) -> None:
        if max_num_seqs < 1:
            raise ValueError("max_num_seqs must be >= 1")
        self.cache = cache
        self.profile = profile
        self.max_num_seqs = max_num_seqs
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []

    def blocks_needed(self, num_prompt: int, max_tokens: int) -> int:
        return -(-(num_prompt + max_tokens) // self.cache.block_size)

    def fits_ever(self, num_prompt: int, max_tokens: int) -> bool:
        """False when the request is larger than the whole cache: it could never be admitted."""
        return self.blocks_needed(num_prompt, max_tokens) <= self.cache.capacity_blocks

    def add(self, seq: Sequence) -> None:
        if not seq.prompt_hashes:
            seq.prompt_hashes = block_hashes(seq.prompt_ids, self.cache.block_size)
        self.waiting.append(seq)

    def abort(self, seq: Sequence) -> None:
        """Drop a sequence wherever it is; its computed blocks stay cached (as in vLLM)."""
        if seq.finished or seq.aborted:
            return
        seq.aborted = True
        if seq.alloc is None:
            try:
                self.waiting.remove(seq)
            except ValueError:
                pass
            return
        self._commit_blocks(seq)
        self.cache.free(seq.alloc)
        self.running.remove(seq)

    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    def _admit(self, seq: Sequence) -> bool:
        alloc = self.cache.allocate(
            seq.prompt_hashes, seq.num_prompt, seq.num_prompt + seq.max_tokens
        )
        if alloc is None:
            return False
        seq.alloc = alloc
        seq.num_cached = seq.num_computed = alloc.cached_tokens
        seq.hashes = list(seq.prompt_hashes)
        seq.num_committed = alloc.cached_tokens // self.cache.block_size
        return True

    def schedule(self) -> Step | None:
        """Plan the next step; None when nothing can run (idle, or all waiting cannot fit)."""
        budget = self.profile.max_num_batched_tokens
        decode = [s for s in self.running if not s.in_prefill]
        budget -= len(decode)
        prefill: list[tuple[Sequence, int]] = []
        for s in self.running:
            if s.in_prefill and budget > 0:
                n = min(s.num_prompt - s.num_computed, budget)
                prefill.append((s, n))
                budget -= n
        admitted: list[Sequence] = []
        while self.waiting and len(self.running) < self.max_num_seqs and budget > 0:
            s = self.waiting[0]
            if not self._admit(s):
                break
            self.waiting.popleft()
            self.running.append(s)
            admitted.append(s)
            n = min(s.num_prompt - s.num_computed, budget)
            prefill.append((s, n))
            budget -= n
        if not decode and not prefill:
            return None
        context = sum(s.num_tokens for s in decode)
        duration = self.profile.step_time(len(decode), context, sum(n for _, n in prefill))
        return Step(decode, prefill, admitted, duration, context)

    def complete(self, step: Step) -> list[TokenEvent]:
        """Apply a planned step: advance prefills, sample tokens, retire finished sequences."""
        events: list[TokenEvent] = []
        sampling = []
        for s, n in step.prefill:
            if s.aborted:
                continue
            s.num_computed += n
            if not s.in_prefill:
                sampling.append(s)
        sampling.extend(s for s in step.decode if not s.aborted)
        for s in sampling:
            tid, text = s.output.next()
            s.output_ids.append(tid)
            done = len(s.output_ids) >= s.max_tokens
            self._commit_blocks(s)
            if done:
                s.finished = True
                assert s.alloc is not None
                self.cache.free(s.alloc)
                self.running.remove(s)
            events.append(TokenEvent(s, tid, text, done))
        for s, _ in step.prefill:
            if not s.aborted and s.in_prefill:
                self._commit_blocks(s)
        return events

    def _commit_blocks(self, s: Sequence) -> None:
        """Commit every block whose KV is computed: the prompt so far, and all output tokens
        but the last (its KV would be written by the next step, which never comes for it)."""
        if s.alloc is None:
            return
        bs = self.cache.block_size
        kv = s.num_computed + max(0, len(s.output_ids) - 1)
        full = kv // bs
        if full <= s.num_committed:
            return
        if full > len(s.hashes):
            tokens = s.prompt_ids + s.output_ids
            parent = s.hashes[-1] if s.hashes else None
            more = (
                block_hashes(tokens[: full * bs], bs, parent, len(s.hashes))
                if parent is not None
                else block_hashes(tokens[: full * bs], bs)
            )
            s.hashes.extend(more)
        for i in range(s.num_committed, full):
            self.cache.commit(s.alloc, i, s.hashes[i])
        s.num_committed = full
