"""Benchmark workloads: deterministic request sequences with known prefix sharing.

Text is made of pseudo-words from a seeded generator, so every run of a workload sends the
same bytes. Lengths are given in tokens of the simulator's tokenizer (4 bytes of UTF-8 per
token), so "~2,000 tokens" is ~8,000 characters.

A workload is a list of sessions; each session is one or more turns. Sessions start as a
Poisson process; the turns of a session are sent one after the other, each carrying the whole
history (the answer received is appended by the load generator).
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from engine_sim.chat import render_chat, render_message

BYTES_PER_TOKEN = 4
WORKLOADS = ("system-prompts", "customers", "multi-turn", "hotspot", "unique")

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
    description: str = ""
    extra: dict[str, float] = field(default_factory=dict)


def zipf_sampler(n: int, s: float, rng: random.Random) -> Callable[[], int]:
    weights = [1.0 / (k**s) for k in range(1, n + 1)]
    total = sum(weights)
    cum = []
    acc = 0.0
    for w in weights:
        acc += w / total
        cum.append(acc)

    def sample() -> int:
        import bisect

        return min(bisect.bisect(cum, rng.random()), n - 1)

    return sample


def system_prompts(count: int, seed: int = 1) -> Workload:
    """64 system prompts of ~2,000 tokens, Zipf(1.1) popularity, user turns 50-300 tokens,
    outputs 64-256 tokens."""
    rng = random.Random(seed)
    prompts = [f"[system prompt {i}] " + text(rng, 2000) for i in range(64)]
    pick = zipf_sampler(64, 1.1, rng)
    sessions = []
    for _ in range(count):
        i = pick()
        sessions.append(
            Session(
                prompts[i], [Turn(text(rng, rng.randint(50, 300)), rng.randint(64, 256))], f"p{i}"
            )
        )
    return Workload(
        "system-prompts", sessions, 64 * 2000, "64 x 2k-token system prompts, Zipf(1.1)"
    )


def customers(count: int, seed: int = 2) -> Workload:
    """150 customers with a ~6,000-token context each, 5 users per customer, ~1,200-token
    queries (the shape of llm-d's published shared-prefix benchmark)."""
    rng = random.Random(seed)
    contexts = [f"[customer {i} context] " + text(rng, 6000) for i in range(150)]
    queries = [[text(rng, 1200) for _ in range(5)] for _ in range(150)]
    sessions = []
    for _ in range(count):
        c = rng.randrange(150)
        u = rng.randrange(5)
        sessions.append(Session(contexts[c], [Turn(queries[c][u], rng.randint(64, 256))], f"c{c}"))
    return Workload("customers", sessions, 150 * 6000 + 750 * 1200, "150 customers x 6k context")


def multi_turn(count: int, seed: int = 3) -> Workload:
    """Conversations of 3-10 turns; each turn carries the whole history. A few shared system
    prompts (8 of ~500 tokens), user turns 100-300 tokens, answers 64-256 tokens."""
    rng = random.Random(seed)
    systems = [f"[assistant persona {i}] " + text(rng, 500) for i in range(8)]
    sessions = []
    avg_turns = 6.5
    n_conv = max(1, math.ceil(count / avg_turns))
    for k in range(n_conv):
        turns = [
            Turn(text(rng, rng.randint(100, 300)), rng.randint(64, 256))
            for _ in range(rng.randint(3, 10))
        ]
        sessions.append(Session(systems[rng.randrange(8)], turns, f"conv{k}"))
    # Only the personas are shared whatever the timing. A history is reused by its own
    # conversation's next turn only, and a finished conversation never comes back, so the
    # histories a fleet must hold are those of the conversations live at once: working_set().
    return Workload("multi-turn", sessions, 8 * 500, "3-10 turn conversations carrying history")


def hotspot(count: int, seed: int = 4) -> Workload:
    """One ~2,000-token prefix takes half of all traffic; the rest is spread uniformly over 63
    other prefixes."""
    rng = random.Random(seed)
    prompts = [f"[prefix {i}] " + text(rng, 2000) for i in range(64)]
    sessions = []
    for _ in range(count):
        i = 0 if rng.random() < 0.5 else rng.randint(1, 63)
        sessions.append(
            Session(
                prompts[i], [Turn(text(rng, rng.randint(50, 300)), rng.randint(64, 256))], f"h{i}"
            )
        )
    return Workload("hotspot", sessions, 64 * 2000, "one prefix = 50% of traffic")


def unique(count: int, seed: int = 5) -> Workload:
    """No sharing at all: every prompt is new (1,000-2,000 tokens)."""
    rng = random.Random(seed)
    sessions = [
        Session(
            None,
            [Turn(f"[unique {k}] " + text(rng, rng.randint(1000, 2000)), rng.randint(64, 256))],
            f"u{k}",
        )
        for k in range(count)
    ]
    return Workload("unique", sessions, 0, "no shared prefixes")


def build(name: str, count: int, seed: int | None = None) -> Workload:
    makers = {
        "system-prompts": system_prompts,
        "customers": customers,
        "multi-turn": multi_turn,
        "hotspot": hotspot,
        "unique": unique,
    }
    if name not in makers:
        raise ValueError(f"unknown workload {name!r}; choose from {', '.join(WORKLOADS)}")
    maker = makers[name]
    return maker(count) if seed is None else maker(count, seed)


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


def session_starts(workload: Workload, rate: float, seconds: float, seed: int = 7) -> list[float]:
    """When the load generator starts each session, in seconds from the start of the load: a
    Poisson process at `rate` requests/s over the workload's mean turns per session, cut at
    `seconds`. The load generator sends by it and working_set() is computed over it, so both
    see one schedule."""
    rng = random.Random(seed)
    avg_turns = sum(len(s.turns) for s in workload.sessions) / max(1, len(workload.sessions))
    session_rate = rate / avg_turns
    starts: list[float] = []
    at = 0.0
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
    """Tokens a fleet must hold at once to serve every reuse the workload offers, when its
    sessions start at `starts` (session_starts()).

    Single-turn sessions: the workload's shared prefix material, whatever the timing (any
    prefix may come back at any time). Multi-turn: the peak, over the schedule, of the distinct
    tokens of the conversations live at once (from their first turn's send to their last's):
    each one's history so far with the answer its latest turn generates (what its next turn
    reuses), and the personas they use, once each. A finished conversation never comes back,
    so counting every conversation's final history would grow with the run's length, not with
    what is ever reused at once.

    A turn is taken to last max_tokens x `seconds_per_token` (the engine's decode step):
    queueing and prefill make real turns longer and overlap more conversations, so this is a
    lower bound on the working set of a real run.
    """
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
