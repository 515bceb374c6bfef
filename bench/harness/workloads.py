"""Benchmark workloads: deterministic request sequences with known prefix sharing, and the
working set a fleet must hold to serve their reuse.

Text is pseudo-words from a seeded generator, so every run sends the same bytes; lengths are in
tokens of the simulator's tokenizer (4 bytes each). A workload is sessions of one or more
turns; sessions start as a Poisson process, a session's turns one after the other, each
carrying the whole history (the load generator appends the answers)."""

from __future__ import annotations

import bisect
import itertools
import math
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from engine_sim.chat import render_chat, render_message

from .shapes import Shape

BYTES_PER_TOKEN = 4
_SYLLABLES = [a + b for a in "bcdfghjklmnprstvwz" for b in "aeiou"]


def text(rng: random.Random, tokens: int) -> str:
    """About `tokens` tokens (4 bytes each) of pseudo-words."""
    target = tokens * BYTES_PER_TOKEN
    words: list[str] = []
    size = 0
    while size < target:
        w = "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(1, 4)))
        words.append(w)
        size += len(w) + 1
    return " ".join(words)[:target]


@dataclass(slots=True)
class Turn:
    user: str
    max_tokens: int


@dataclass(slots=True)
class Session:
    system: str | None
    turns: list[Turn]
    # The distinct prefix this session belongs to (for reporting and working-set sizes).
    group: str = ""


@dataclass(slots=True)
class Workload:
    name: str
    sessions: list[Session]
    # Tokens of distinct shared prefix material (system prompts, contexts, queries that come
    # back): what the fleet must hold whatever the timing. A multi-turn workload's histories
    # come on top and depend on how many conversations are live at once: see working_set().
    working_set_tokens: int


def zipf_sampler(n: int, s: float, rng: random.Random) -> Callable[[], int]:
    weights = [1.0 / (k**s) for k in range(1, n + 1)]
    total = sum(weights)
    cum = list(itertools.accumulate(w / total for w in weights))
    return lambda: min(bisect.bisect(cum, rng.random()), n - 1)


def _turn(rng: random.Random, lo: int, hi: int) -> Turn:
    """A user turn of lo-hi tokens asking for 64-256 tokens."""
    return Turn(text(rng, rng.randint(lo, hi)), rng.randint(64, 256))


def system_prompts(count: int, seed: int = 1) -> Workload:
    """64 system prompts of ~2,000 tokens, Zipf(1.1) popularity, user turns 50-300 tokens,
    outputs 64-256 tokens."""
    rng = random.Random(seed)
    prompts = [f"[system prompt {i}] " + text(rng, 2000) for i in range(64)]
    pick = zipf_sampler(64, 1.1, rng)
    sessions = [Session(prompts[i], [_turn(rng, 50, 300)], f"p{i}")
                for i in (pick() for _ in range(count))]
    return Workload("system-prompts", sessions, 64 * 2000)


def customers(count: int, seed: int = 2, context: int = 6000, query: int = 1200,
              name: str = "customers") -> Workload:
    """150 customers with a ~6,000-token context each, 5 users per customer, ~1,200-token
    queries (the shape of llm-d's published shared-prefix benchmark)."""
    rng = random.Random(seed)
    contexts = [f"[customer {i} context] " + text(rng, context) for i in range(150)]
    queries = [[text(rng, query) for _ in range(5)] for _ in range(150)]
    sessions = [Session(contexts[c], [Turn(queries[c][u], rng.randint(64, 256))], f"c{c}")
                for c, u in ((rng.randrange(150), rng.randrange(5)) for _ in range(count))]
    return Workload(name, sessions, 150 * context + 750 * query)


# The simulators' tiny tokenizer (their `--tokenizer tiny`) makes 1.342 token ids of every
# 4-byte token of this pseudo-word text (20 samples of each size, 1.341-1.345).
TINY_IDS_PER_TOKEN = 1.342


def llm_d(count: int, seed: int = 2) -> Workload:
    """customers sized in the tiny tokenizer's tokens, so engines in tokenizer mode see
    llm-d's shape exactly: 150 customers x 5 users, 6,000-token contexts, 1,200-token
    queries (llm-d.ai/blog/kvcache-wins-you-can-see, appendix A.2)."""
    return customers(count, seed, round(6000 / TINY_IDS_PER_TOKEN),
                     round(1200 / TINY_IDS_PER_TOKEN), "llm-d")


def multi_turn(count: int, seed: int = 3) -> Workload:
    """Conversations of 3-10 turns; each turn carries the whole history. A few shared system
    prompts (8 of ~500 tokens), user turns 100-300 tokens, answers 64-256 tokens."""
    rng = random.Random(seed)
    systems = [f"[assistant persona {i}] " + text(rng, 500) for i in range(8)]
    sessions = []
    for k in range(max(1, math.ceil(count / 6.5))):  # 6.5 turns a conversation on average
        turns = [_turn(rng, 100, 300) for _ in range(rng.randint(3, 10))]
        sessions.append(Session(systems[rng.randrange(8)], turns, f"conv{k}"))
    # Only the personas are shared whatever the timing. A history is reused by its own
    # conversation's next turn only, and a finished conversation never comes back, so the
    # histories a fleet must hold are those of the conversations live at once: working_set().
    return Workload("multi-turn", sessions, 8 * 500)


def hotspot(count: int, seed: int = 4) -> Workload:
    """One ~2,000-token prefix takes half of all traffic; the rest is spread uniformly over 63
    other prefixes."""
    rng = random.Random(seed)
    prompts = [f"[prefix {i}] " + text(rng, 2000) for i in range(64)]
    sessions = [Session(prompts[i], [_turn(rng, 50, 300)], f"h{i}")
                for i in (0 if rng.random() < 0.5 else rng.randint(1, 63) for _ in range(count))]
    return Workload("hotspot", sessions, 64 * 2000)


def unique(count: int, seed: int = 5) -> Workload:
    """No sharing at all: every prompt is new (1,000-2,000 tokens)."""
    rng = random.Random(seed)
    sessions = [Session(None, [Turn(f"[unique {k}] " + text(rng, rng.randint(1000, 2000)),
                                    rng.randint(64, 256))], f"u{k}") for k in range(count)]
    return Workload("unique", sessions, 0)


def few_prompts(count: int, seed: int = 6) -> Workload:
    """8 system prompts of ~2,000 tokens of the repo's tiny tokenizer (6,000 bytes of
    pseudo-words: it makes ~3 bytes a token of them), Zipf(1.1) popularity as system-prompts,
    user turns of ~55-160 tokens, answers of 16-64 tokens. The system-prompts shape sized for
    3 llama-servers that hold ~4 whole prompts each (docs/real-engine.md): more prefixes than
    one holds, fewer than the fleet holds; short answers, so the engines' CPU goes mostly to
    prefill, which is what a cache hit saves."""
    rng = random.Random(seed)
    prompts = [f"[system prompt {i}] " + text(rng, 1500) for i in range(8)]
    pick = zipf_sampler(8, 1.1, rng)
    sessions = [Session(prompts[i], [Turn(text(rng, rng.randint(40, 120)), rng.randint(16, 64))],
                        f"p{i}") for i in (pick() for _ in range(count))]
    return Workload("few-prompts", sessions, 8 * 1500)


@dataclass(frozen=True)
class Spec:
    """A workload as the harness runs it. `kv_capacity`: tokens of KV cache per simulated
    replica, about 0.19 of the working set so one replica holds under a quarter of it and 8
    hold all of it (routing has to matter); None: derived from the working set the run sends
    (capacity.kv_capacity). `rates`: `bench compare`'s staircase, from light load to past the
    load balancers' saturation."""

    make: Callable[..., Workload]
    kv_capacity: int | None
    rates: tuple[float, ...] = (8.0, 16.0, 24.0, 32.0)
    compared: bool = True  # in `bench compare`'s workloads


# Adding a workload to every scenario is one line here. system-prompts / hotspot: 128k tokens
# of shared prompts -> 24k a replica (0.19; 8 hold 192k). customers: 1.8M -> 340k; its
# ~7,200-token prompts saturate sooner (prefix alone has a 3.3 s p99 at 24 req/s), so its
# staircase stops at 20. unique: nothing to share, no capacity makes routing matter -> 32k.
WORKLOADS: dict[str, Spec] = {
    "system-prompts": Spec(system_prompts, 24_000),
    "customers": Spec(customers, 340_000, (5.0, 10.0, 15.0, 20.0)),
    "multi-turn": Spec(multi_turn, None),
    "hotspot": Spec(hotspot, 24_000),
    "unique": Spec(unique, 32_000),
    # llm-d's instances held 307,328 tokens of KV each (8 of them: the working set of 1.8M
    # tokens is 73% of the fleet's); in the tiny tokenizer's tokens, for its tokenizer mode
    "llm-d": Spec(llm_d, round(307_328 / TINY_IDS_PER_TOKEN), (5.0, 10.0, 15.0, 20.0), False),
}


# Workloads of one scenario, not of every comparison: few-prompts is sized for the
# real-engine scenario's 3 llama-servers (bench/harness/llama.py).
SCENARIO_WORKLOADS: dict[str, Spec] = {"few-prompts": Spec(few_prompts, None)}


def build(name: str, count: int, seed: int | None = None) -> Workload:
    spec = WORKLOADS.get(name) or SCENARIO_WORKLOADS.get(name)
    if spec is None:
        raise ValueError(f"unknown workload {name!r}; choose from {', '.join(WORKLOADS)}")
    make = spec.make
    return make(count) if seed is None else make(count, seed)


def messages_for(session: Session, turn: int, answers: list[str]) -> list[dict[str, str]]:
    """The chat messages of turn `turn`, given the answers to the earlier turns."""
    msgs: list[dict[str, str]] = []
    if session.system is not None:
        msgs.append({"role": "system", "content": session.system})
    for i in range(turn):
        msgs.append({"role": "user", "content": session.turns[i].user})
        msgs.append({"role": "assistant", "content": answers[i]})
    msgs.append({"role": "user", "content": session.turns[turn].user})
    return msgs


def session_starts(workload: Workload, rate: float, seconds: float, seed: int = 7,
                   shape: Shape | None = None) -> list[float]:
    """When the load generator starts each session, in seconds from the start of the load: a
    Poisson process at `rate` requests/s over the workload's mean turns per session (times
    the `shape`'s multiple at each instant: shapes.py), cut at `seconds`. The load generator
    sends by it and working_set() is computed over it, so both see one schedule."""
    rng = random.Random(seed)
    avg_turns = sum(len(s.turns) for s in workload.sessions) / max(1, len(workload.sessions))
    session_rate = rate / avg_turns
    starts: list[float] = []
    at = 0.0
    if shape is not None:  # thinning of a process at the shape's peak rate
        while len(starts) < len(workload.sessions):
            at += rng.expovariate(session_rate * shape.peak)
            if at >= seconds:
                break
            if rng.random() * shape.peak < shape.multiple(at, seconds):
                starts.append(at)
        return starts
    for _ in workload.sessions:
        at += rng.expovariate(session_rate)
        if at >= seconds:
            break
        starts.append(at)
    return starts


def turn_tokens(session: Session) -> list[int]:
    """Tokens a simulator holds for each turn of `session` once it is answered: its prompt (the
    chat template over the history so far) and its answer, max_tokens long as the simulator's
    answers are."""
    answers: list[str] = []
    out = []
    for i, turn in enumerate(session.turns):
        prompt = render_chat(messages_for(session, i, answers)).encode()
        out.append(-(-len(prompt) // BYTES_PER_TOKEN) + turn.max_tokens)
        answers.append("x" * (BYTES_PER_TOKEN * turn.max_tokens))
    return out


def largest_request(workload: Workload) -> int:
    """Tokens of the workload's largest request with its answer (a session's last turn)."""
    return max((turn_tokens(s)[-1] for s in workload.sessions if s.turns), default=0)


def persona_tokens(session: Session) -> int:
    """Tokens of the session's system message as the chat template renders it (0 if none)."""
    if session.system is None:
        return 0
    message = render_message({"role": "system", "content": session.system})
    return len(message.encode()) // BYTES_PER_TOKEN


# A turn sent: (when, conversation, its persona, the persona's tokens, the conversation's other
# tokens from then on, whether it is the conversation's last turn).
LiveTurn = tuple[float, int, str, int, int, bool]


def live_peak(turns: list[LiveTurn]) -> int:
    """The peak of the distinct tokens of the conversations live at once, a conversation live
    from its first turn's send to its last's, its personas counted once however many use them.
    Pure: working_set() feeds it a modelled schedule, `bench run` the one it measured."""
    live: dict[int, int] = {}  # conversation -> its own tokens now
    personas: Counter[str] = Counter()  # persona -> live conversations using it
    total = peak = 0
    # stable: a conversation's turns stay in order on a tie
    for _at, k, persona, shared, tokens, is_last in sorted(turns, key=lambda e: e[0]):
        if k not in live:
            live[k] = 0
            personas[persona] += 1
            if personas[persona] == 1:
                total += shared
        total += tokens - live[k]
        live[k] = tokens
        peak = max(peak, total)
        if is_last:
            total -= live.pop(k)
            personas[persona] -= 1
            if not personas[persona]:
                total -= shared
    return peak


def working_set(workload: Workload, starts: list[float], seconds_per_token: float) -> int:
    """Tokens a fleet must hold at once to serve every reuse the workload offers, its
    sessions starting at `starts`. Single-turn: the shared prefix material, whatever the timing.
    Multi-turn: the peak of the distinct tokens of the conversations live at once (their
    history with the latest answer, their personas once each): a finished conversation never
    comes back. A turn lasts max_tokens x `seconds_per_token` (the decode step): queueing and
    prefill make real turns longer, so this is a lower bound on a real run's working set."""
    if all(len(s.turns) <= 1 for s in workload.sessions):
        return workload.working_set_tokens
    events: list[LiveTurn] = []
    # starts covers the sessions the run sends, a prefix of the workload's
    for k, (s, start) in enumerate(zip(workload.sessions, starts, strict=False)):
        shared = persona_tokens(s)
        at = start
        last = len(s.turns) - 1
        for i, (turn, tokens) in enumerate(zip(s.turns, turn_tokens(s), strict=True)):
            events.append((at, k, s.system or "", shared, tokens - shared, i == last))
            at += turn.max_tokens * seconds_per_token
    return live_peak(events)
