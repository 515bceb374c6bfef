"""Benchmark workloads: deterministic request sequences with known prefix sharing. Text is
seeded pseudo-words, so every run sends the same bytes; sizes are in 4-byte tokens."""

import base64
import bisect
import itertools
import json
import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from .shapes import Shape

BYTES_PER_TOKEN = 4
_SYLLABLES = [a + b for a in "bcdfghjklmnprstvwz" for b in "aeiou"]
# The simulators' tiny tokenizer makes 1.342 ids of every 4-byte token of this text
TINY_IDS_PER_TOKEN = 1.342


def text(rng: random.Random, tokens: int) -> str:
    """About `tokens` tokens of pseudo-words."""
    target = tokens * BYTES_PER_TOKEN
    words, size = [], 0
    while size < target:
        words.append("".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(1, 4))))
        size += len(words[-1]) + 1
    return " ".join(words)[:target]


@dataclass(slots=True)
class Turn:
    user: str | list[dict[str, Any]]  # text, or chat content parts (an image and a question)
    max_tokens: int
    # the user message as content parts (then `user` is only its first text)
    parts: tuple[dict[str, object], ...] = ()
    # after the user message: the agent's tool calls and their results, before it answers
    calls: tuple[dict[str, object], ...] = ()
    # seconds the client takes before sending this turn (its tools running): none for a first
    think_s: float = 0.0


@dataclass(slots=True)
class Session:
    system: str | None
    turns: list[Turn]  # each carries the whole history (the load generator adds the answers)
    group: str = ""  # the distinct prefix it belongs to
    tools: list[dict[str, object]] | None = None  # sent with every turn


@dataclass(slots=True)
class Workload:
    name: str
    sessions: list[Session]
    # Tokens of distinct shared prefix material, held whatever the timing (multi-turn
    # histories come on top: capacity.working_set())
    working_set_tokens: int


def _zipf(n: int, rng: random.Random) -> Callable[[], int]:
    weights = [1.0 / (k**1.1) for k in range(1, n + 1)]
    total = sum(weights)
    cum = list(itertools.accumulate(w / total for w in weights))
    return lambda: min(bisect.bisect(cum, rng.random()), n - 1)


def _turn(rng: random.Random, lo: int = 50, hi: int = 300) -> Turn:
    return Turn(text(rng, rng.randint(lo, hi)), rng.randint(64, 256))


def system_prompts(count: int, seed: int = 1) -> Workload:
    """64 system prompts of ~2,000 tokens, Zipf(1.1) popularity."""
    rng = random.Random(seed)
    prompts = [f"[system prompt {i}] " + text(rng, 2000) for i in range(64)]
    pick = _zipf(64, rng)
    sessions = [Session(prompts[i], [_turn(rng)], f"p{i}") for i in (pick() for _ in range(count))]
    return Workload("system-prompts", sessions, 64 * 2000)


def customers(count: int, seed: int = 2, context: int = 6000, query: int = 1200,
              name: str = "customers") -> Workload:
    """150 customers with a context each, 5 users (queries) per customer: the shape of llm-d's
    shared-prefix benchmark (llm-d.ai/blog/kvcache-wins-you-can-see, appendix A.2)."""
    rng = random.Random(seed)
    contexts = [f"[customer {i} context] " + text(rng, context) for i in range(150)]
    queries = [[text(rng, query) for _ in range(5)] for _ in range(150)]
    sessions = [Session(contexts[c], [Turn(queries[c][u], rng.randint(64, 256))], f"c{c}")
                for c, u in ((rng.randrange(150), rng.randrange(5)) for _ in range(count))]
    return Workload(name, sessions, 150 * context + 750 * query)


def multi_turn(count: int, seed: int = 3) -> Workload:
    """Conversations of 3-10 turns of 100-300 tokens on 8 personas of ~500 tokens. Only the
    personas are shared whatever the timing: the histories are capacity.working_set()'s."""
    rng = random.Random(seed)
    systems = [f"[assistant persona {i}] " + text(rng, 500) for i in range(8)]
    sessions = []
    for k in range(max(1, math.ceil(count / 6.5))):  # 6.5 turns a conversation on average
        turns = [_turn(rng, 100, 300) for _ in range(rng.randint(3, 10))]
        sessions.append(Session(systems[rng.randrange(8)], turns, f"conv{k}"))
    return Workload("multi-turn", sessions, 8 * 500)


def hotspot(count: int, seed: int = 4) -> Workload:
    """One ~2,000-token prefix takes half of all traffic, 63 others share the rest evenly."""
    rng = random.Random(seed)
    prompts = [f"[prefix {i}] " + text(rng, 2000) for i in range(64)]
    sessions = [Session(prompts[i], [_turn(rng)], f"h{i}")
                for i in (0 if rng.random() < 0.5 else rng.randint(1, 63) for _ in range(count))]
    return Workload("hotspot", sessions, 64 * 2000)


def unique(count: int, seed: int = 5) -> Workload:
    """No sharing at all: every prompt is new (1,000-2,000 tokens)."""
    rng = random.Random(seed)
    sessions = [Session(None, [Turn(f"[unique {k}] " + text(rng, rng.randint(1000, 2000)),
                                    rng.randint(64, 256))], f"u{k}") for k in range(count)]
    return Workload("unique", sessions, 0)


def few_prompts(count: int, seed: int = 6) -> Workload:
    """system-prompts for 3 llama-servers that hold ~4 prompts each (docs/real-engine.md): 8
    prompts of ~2,000 tiny-tokenizer tokens, short answers so prefill takes the CPU."""
    rng = random.Random(seed)
    prompts = [f"[system prompt {i}] " + text(rng, 1500) for i in range(8)]
    pick = _zipf(8, rng)
    sessions = [Session(prompts[i], [Turn(text(rng, rng.randint(40, 120)), rng.randint(16, 64))],
                        f"p{i}") for i in (pick() for _ in range(count))]
    return Workload("few-prompts", sessions, 8 * 1500)


def image_url(rng: random.Random, size: int = 2250) -> str:
    """A data URL of `size` seeded bytes (3,000 base64 characters by default: ~750 tokens by
    the router's 4-bytes estimate, what a vision model spends on a small image). Nothing
    decodes it: the simulators take a content part as its JSON text."""
    return "data:image/png;base64," + base64.b64encode(rng.randbytes(size)).decode()


QUESTIONS = ("Describe this image.", "What is in this picture?", "Read the text in this image.",
             "Is anything wrong with this product?", "Write alt text for this image.")  # fmt: skip


def multimodal(count: int, seed: int = 8) -> Workload:
    """Chat with images: one of 8 system prompts (~500 tokens), then an image from a pool of
    200 (Zipf(1.1): some are asked about often) and one of 5 stock questions. The same
    question about another image shares the text, not the prefix."""
    rng = random.Random(seed)
    systems = [f"[vision assistant {i}] " + text(rng, 500) for i in range(8)]
    images = [image_url(rng) for _ in range(200)]
    pick = _zipf(200, rng)
    sessions = []
    for _ in range(count):
        i, q = pick(), rng.randrange(len(QUESTIONS))
        parts = [{"type": "image_url", "image_url": {"url": images[i]}},
                 {"type": "text", "text": QUESTIONS[q]}]
        sessions.append(Session(systems[rng.randrange(8)], [Turn(parts, rng.randint(32, 128))],
                                f"img{i}"))
    return Workload("multimodal", sessions, 8 * 500 + 200 * 750)


_AGENTS = ("coding agent", "support agent", "data analyst", "browser agent", "sre on call",
           "travel planner")
_TOOL_VERBS = ("read", "search", "run", "open", "list", "query", "write", "fetch")
_TOOL_NOUNS = ("file", "tests", "logs", "ticket", "page", "table", "calendar", "metrics")


def _tools(rng: random.Random, count: int) -> list[dict[str, object]]:
    names = rng.sample([f"{v}_{n}" for v in _TOOL_VERBS for n in _TOOL_NOUNS], count)
    return [{"type": "function", "function": {
        "name": name, "description": text(rng, rng.randint(15, 40)),
        "parameters": {"type": "object", "properties": {
            arg: {"type": "string", "description": text(rng, rng.randint(5, 15))}
            for arg in ("target", "query")[:rng.randint(1, 2)]}, "required": ["target"]}}}
        for name in names]  # fmt: skip


def _agent_turn(rng: random.Random, tools: list[dict[str, object]], tag: str) -> Turn:
    """A user message of content parts (a pasted log now and then, a screenshot now and then),
    one or two tool calls with JSON-string arguments, their results as content parts."""
    ask = text(rng, rng.randint(30, 120))
    parts: list[dict[str, object]] = [{"type": "text", "text": ask}]
    if rng.random() < 0.4:
        parts.append({"type": "text", "text": text(rng, rng.randint(50, 200))})
    if rng.random() < 0.3:
        parts.append({"type": "image_url",
                      "image_url": {"url": f"https://198.18.0.1/screens/{tag}.png"}})
    calls: list[dict[str, object]] = []
    for j in range(rng.randint(1, 2)):
        fn = rng.choice(tools)["function"]
        cid = f"call_{tag}_{j}"
        args = {"target": text(rng, rng.randint(3, 10)), "query": text(rng, rng.randint(3, 12))}
        calls.append({"role": "assistant", "content": None, "tool_calls": [{
            "id": cid, "type": "function",
            "function": {"name": fn["name"], "arguments": json.dumps(args)}}]})  # type: ignore[index]
        calls.append({"role": "tool", "tool_call_id": cid, "content": [
            {"type": "text", "text": text(rng, rng.randint(100, 400))}]})
    # the tools' time before the turn is sent: quick ones (a file read) or a build, a test run
    think = rng.uniform(0.5, 3.0) if rng.random() < 0.5 else rng.uniform(10.0, 40.0)
    return Turn(ask, rng.randint(64, 192), tuple(parts), tuple(calls), think)


def agentic(count: int, seed: int = 8) -> Workload:
    """Agent sessions: 6 agent kinds, each with its own ~1,500-token system prompt and 4 tools
    (Zipf(1.1) popularity); 3-8 turns a session, each a user message of content parts (text,
    a pasted log 40% of the time, a screenshot 30%), one or two tool calls with their results
    (100-400 tokens each), then the agent's answer: the history grows turn by turn. Between
    turns the tools run: 0.5-3 s half the time, 10-40 s the other half. Only the agents'
    preambles are shared whatever the timing."""
    rng = random.Random(seed)
    kinds = [(f"[{name}] " + text(rng, 1500), _tools(rng, 4)) for name in _AGENTS]
    pick = _zipf(len(kinds), rng)
    sessions = []
    for k in range(max(1, math.ceil(count / 5.5))):  # 5.5 turns a session on average
        system, tools = kinds[pick()]
        turns = [_agent_turn(rng, tools, f"{k}-{t}") for t in range(rng.randint(3, 8))]
        sessions.append(Session(system, turns, f"agent{k}", tools))
    return Workload("agentic", sessions, len(kinds) * 1800)


@dataclass(frozen=True)
class Spec:
    make: Callable[..., Workload]
    kv_capacity: int | None  # tokens a simulated replica holds; None: capacity.kv_capacity
    rates: tuple[float, ...] = (8.0, 16.0, 24.0, 32.0)
    compared: bool = True  # in `bench compare`'s workloads


# A replica holds ~0.19 of the working set, 8 all of it. customers' ~7,200-token prompts
# saturate sooner: its staircase stops at 20. unique has nothing to share.
WORKLOADS: dict[str, Spec] = {
    "system-prompts": Spec(system_prompts, 24_000),
    "customers": Spec(customers, 340_000, (5.0, 10.0, 15.0, 20.0)),
    "multi-turn": Spec(multi_turn, None),
    "hotspot": Spec(hotspot, 24_000),
    "unique": Spec(unique, 32_000),
    # agent sessions: tools, tool calls and results, content parts and images (bench agentic)
    "agentic": Spec(agentic, None, compared=False),
    # customers as llm-d ran it, in the tiny tokenizer's tokens (engines in tokenizer mode see
    # its 6,000-token contexts, 1,200-token queries, 307,328 tokens of KV an instance exactly)
    "llm-d": Spec(partial(customers, context=round(6000 / TINY_IDS_PER_TOKEN),
                          query=round(1200 / TINY_IDS_PER_TOKEN), name="llm-d"),
                  round(307_328 / TINY_IDS_PER_TOKEN), (5.0, 10.0, 15.0, 20.0), False),
    # a replica holds ~0.19 of its 154,000-token working set, as the others
    "multimodal": Spec(multimodal, 30_000, (8.0, 16.0, 24.0), False),
}
# few-prompts is the real-engine scenario's only (bench/harness/llama.py)
SCENARIO_WORKLOADS: dict[str, Spec] = {"few-prompts": Spec(few_prompts, None)}


def build(name: str, count: int, seed: int | None = None) -> Workload:
    spec = WORKLOADS.get(name) or SCENARIO_WORKLOADS.get(name)
    if spec is None:
        raise ValueError(f"unknown workload {name!r}; choose from {', '.join(WORKLOADS)}")
    return spec.make(count) if seed is None else spec.make(count, seed)


def messages_for(session: Session, turn: int, answers: list[str]) -> list[dict[str, Any]]:
    """The chat messages of turn `turn`, given the answers to the earlier turns."""
    msgs: list[dict[str, Any]] = (
        [{"role": "system", "content": session.system}] if session.system is not None else [])
    for t, answer in zip(session.turns[:turn], answers, strict=False):
        msgs += [_user(t), *t.calls, {"role": "assistant", "content": answer}]
    now = session.turns[turn]
    msgs += [_user(now), *now.calls]
    return msgs


def _user(t: Turn) -> dict[str, Any]:
    return {"role": "user", "content": list(t.parts) if t.parts else t.user}


def session_starts(workload: Workload, rate: float, seconds: float, seed: int = 7,
                   shape: Shape | None = None) -> list[float]:
    """Session start times: Poisson at `rate` requests/s over the mean turns a session, thinned
    to the `shape`, cut at `seconds`; run_load and capacity.working_set() both read them."""
    rng = random.Random(seed)
    avg_turns = sum(len(s.turns) for s in workload.sessions) / max(1, len(workload.sessions))
    peak = shape.peak if shape else 1.0
    starts: list[float] = []
    at = 0.0
    while len(starts) < len(workload.sessions):
        at += rng.expovariate(rate / avg_turns * peak)
        if at >= seconds:
            break
        if shape is None or rng.random() * peak < shape.multiple(at, seconds):
            starts.append(at)
    return starts

