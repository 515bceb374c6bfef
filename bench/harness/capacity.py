"""The working set a fleet must hold to serve a workload's reuse, and the capacity rule: one
simulated replica holds at most a quarter of it and the fleet all of it, so routing matters."""

import math
from collections import Counter
from collections.abc import Iterable, Sequence

from engine_sim.chat import GENERATION_PROMPT, render_chat, render_message
from engine_sim.hf_tokenizer import ChatTokenizer
from engine_sim.profiles import PROFILES
from engine_sim.tokenizer import count_tokens

from .loadgen import Result
from .shapes import Shape
from .workloads import BYTES_PER_TOKEN, WORKLOADS, Session, Workload, messages_for, session_starts

PROFILE = "llama-3.1-70b-h100"
# A replica's share of multi-turn's modelled working set (a lower bound: measured turns took
# 1.2-1.5x as long): under a quarter of the real one.
MULTI_TURN_KV_SHARE = 0.22
# A turn sent: (when, conversation, its persona, the persona's tokens, the conversation's other
# tokens from then on, whether it is the conversation's last turn).
LiveTurn = tuple[float, int, str, int, int, bool]


def turn_tokens(session: Session) -> list[int]:
    """Tokens a simulator holds after each turn: its templated prompt and max_tokens answer."""
    answers: list[str] = []
    out = []
    for turn in session.turns:
        prompt = render_chat(messages_for(session, len(answers), answers), session.tools).encode()
        out.append(-(-len(prompt) // BYTES_PER_TOKEN) + turn.max_tokens)
        answers.append("x" * (BYTES_PER_TOKEN * turn.max_tokens))
    return out


def persona_tokens(session: Session) -> int:
    """Tokens of the session's system message (and tools) as the chat template renders them
    (0 if none)."""
    if session.system is None:
        return 0
    if session.tools:
        shared = render_chat([{"role": "system", "content": session.system}], session.tools)
        return (len(shared.encode()) - len(GENERATION_PROMPT)) // BYTES_PER_TOKEN
    message = render_message({"role": "system", "content": session.system})
    return len(message.encode()) // BYTES_PER_TOKEN


def live_peak(turns: Iterable[LiveTurn]) -> int:
    """The peak of the distinct tokens of the conversations live at once (first turn's send to
    last's), each persona counted once."""
    live: dict[int, int] = {}  # conversation -> its own tokens now
    personas: Counter[str] = Counter()  # persona -> live conversations using it
    total = peak = 0
    # stable: a conversation's turns stay in order on a tie
    for _at, k, persona, shared, tokens, is_last in sorted(turns, key=lambda e: e[0]):
        if k not in live:
            live[k] = 0
            personas[persona] += 1
            total += shared if personas[persona] == 1 else 0
        total += tokens - live[k]
        live[k] = tokens
        peak = max(peak, total)
        if is_last:
            total -= live.pop(k)
            personas[persona] -= 1
            total -= 0 if personas[persona] else shared
    return peak


def working_set(workload: Workload, starts: list[float], seconds_per_token: float) -> int:
    """Tokens a fleet must hold at once to serve every reuse, sessions starting at `starts`.
    Single-turn: the shared prefix material. Multi-turn: live_peak() of the conversations, a
    turn lasting max_tokens x `seconds_per_token` (a lower bound: no queueing, no prefill)."""
    if all(len(s.turns) <= 1 for s in workload.sessions):
        return workload.working_set_tokens
    events: list[LiveTurn] = []
    for k, (s, at) in enumerate(zip(workload.sessions, starts, strict=False)):
        shared = persona_tokens(s)
        for i, (turn, tokens) in enumerate(zip(s.turns, turn_tokens(s), strict=True)):
            at += turn.think_s if i else 0.0  # the client's time before it
            events.append((at, k, s.system or "", shared, tokens - shared, i == len(s.turns) - 1))
            at += turn.max_tokens * seconds_per_token
    return live_peak(events)


def run_count(rate: float, seconds: float) -> int:
    """Sessions a run builds: 20% over what `rate` for `seconds` sends, and 50 more."""
    return int(rate * seconds * 1.2) + 50


def run_working_set(wl: Workload, rate: float, seconds: float, profile: str = PROFILE,
                    time_scale: float = 1.0, seed: int = 7, shape: Shape | None = None) -> int:
    """The working set of `wl` as run_load sends it, turns lasting the profile's decode step."""
    step = PROFILES[profile].step_base_s * time_scale
    return working_set(wl, session_starts(wl, rate, seconds, seed, shape), step)


def token_ratio(wl: Workload, tokenizer: ChatTokenizer, sample: int = 64) -> float:
    """Token ids `tokenizer` makes of the first templated prompts per 4-byte token: simulators in
    tokenizer mode get their capacity times this, to hold the same share of the working set."""
    msgs = [(messages_for(s, 0, []), s.tools) for s in wl.sessions[:sample]]
    ids = sum(len(tokenizer.chat_ids(m, tools)) for m, tools in msgs)
    return ids / max(1, sum(count_tokens(render_chat(m, tools).encode()) for m, tools in msgs))


def kv_capacity(wl: Workload, working_set_tokens: int, block_size: int = 16) -> int:
    """Per-replica KV capacity (tokens): a replica's memory is what it is, whatever the fleet."""
    spec = WORKLOADS.get(wl.name)
    if spec is not None and spec.kv_capacity is not None:
        return spec.kv_capacity
    # at least the largest request with its answer: the simulator refuses one it cannot hold
    largest = max((turn_tokens(s)[-1] for s in wl.sessions if s.turns), default=0)
    kv = max(round(MULTI_TURN_KV_SHARE * working_set_tokens), largest)
    return -(-kv // block_size) * block_size


def measured_working_set(wl: Workload, results: Sequence[Result]) -> int | None:
    """A multi-turn run's working set as it was sent: the tokens its engines reported at the
    turns' real send times (the check on run_working_set). None for single-turn sessions."""
    if all(len(s.turns) <= 1 for s in wl.sessions):
        return None
    last = {r.session: r.turn for r in sorted(results, key=lambda r: r.turn)}
    turns: list[LiveTurn] = []
    for r in results:
        s = wl.sessions[r.session]
        shared = persona_tokens(s)
        # a failed turn reported nothing: its blocks were freed and its conversation ends
        tokens = 0 if r.prompt_tokens is None else r.prompt_tokens + r.output_tokens - shared
        turns.append((r.sent_at, r.session, s.system or "", shared, tokens,
                      r.turn == last[r.session]))
    return live_peak(turns)


def capacity_warning(kv: int, working_set_tokens: int, replicas: int) -> str | None:
    """Why a run breaks the capacity rule; None if it keeps it (or has nothing to share)."""
    ws = working_set_tokens
    problems = []
    if ws and 4 * kv > ws:
        problems.append(f"one replica holds {kv / ws:.2f} of it (> 0.25)")
    if ws and kv * replicas < ws:
        problems.append(f"{replicas} replicas hold {kv * replicas / ws:.2f} of it (< 1)")
    if not problems:
        return None
    return (f"KV capacity {kv:,} tokens per replica, working set {ws:,} tokens: "
            + " and ".join(problems) + "; routing may not matter as the benchmark intends")


def slices(avg_turns: float, rates: Sequence[float], seconds: float) -> list[tuple[int, int]]:
    """(first session, sessions) of each step of a staircase, one after the other: 1.5x the
    sessions the step's arrivals need on average, plus 5."""
    counts = [math.ceil(rate * seconds * 1.5 / max(avg_turns, 1.0)) + 5 for rate in rates]
    return [(sum(counts[:k]), n) for k, n in enumerate(counts)]
