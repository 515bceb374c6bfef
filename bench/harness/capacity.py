"""The capacity rule: one simulated replica holds at most a quarter of a workload's working set
and the whole fleet holds all of it, so routing has to matter. A run that breaks it says so
(capacity_warning) and runs anyway."""

from __future__ import annotations

import math
from collections.abc import Sequence

from engine_sim.chat import render_chat
from engine_sim.hf_tokenizer import ChatTokenizer
from engine_sim.profiles import PROFILES
from engine_sim.tokenizer import count_tokens

from .loadgen import Result
from .shapes import Shape
from .workloads import (
    WORKLOADS,
    LiveTurn,
    Workload,
    largest_request,
    live_peak,
    messages_for,
    persona_tokens,
    session_starts,
    working_set,
)

PROFILE = "llama-3.1-70b-h100"

# multi-turn's capacity per replica as a share of its modelled working set, a lower bound
# (turns at the unloaded decode step); measured turns took 1.2-1.5x as long. 0.22 keeps one
# replica under a quarter of the real working set and 8 replicas hold 1.76x the bound.
MULTI_TURN_KV_SHARE = 0.22


def run_count(rate: float, seconds: float) -> int:
    """Sessions a run builds: 20% over what `rate` for `seconds` sends, and 50 more."""
    return int(rate * seconds * 1.2) + 50


def run_working_set(wl: Workload, rate: float, seconds: float, profile: str = PROFILE,
                    time_scale: float = 1.0, seed: int = 7, shape: Shape | None = None) -> int:
    """The working set of `wl` sent at `rate` for `seconds` as run_load sends it, its turns
    lasting the profile's decode step a token."""
    step = PROFILES[profile].step_base_s * time_scale
    return working_set(wl, session_starts(wl, rate, seconds, seed, shape), step)


def token_ratio(wl: Workload, tokenizer: ChatTokenizer, sample: int = 64) -> float:
    """Token ids a tokenizer makes of the workload's first prompts (the chat template
    applied), per token of the simulator's byte tokenizer (4 bytes a token), in which the
    workloads' sizes and capacities are written: simulators in tokenizer mode get their
    capacity times this, so they hold the same share of the working set."""
    msgs = [messages_for(s, 0, []) for s in wl.sessions[:sample]]
    ids = sum(len(tokenizer.chat_ids(m)) for m in msgs)
    return ids / max(1, sum(count_tokens(render_chat(m).encode()) for m in msgs))


def kv_capacity(wl: Workload, working_set_tokens: int, block_size: int = 16) -> int:
    """Per-replica KV capacity (tokens) for `wl`. Not a function of the replica count: a
    replica's memory is what it is, and a fleet too small to hold the working set is warned
    about (capacity_warning), not given bigger replicas."""
    fixed = WORKLOADS[wl.name].kv_capacity if wl.name in WORKLOADS else None
    if fixed is not None:
        return fixed
    # at least the largest request: the simulator refuses one it cannot hold
    kv = max(round(MULTI_TURN_KV_SHARE * working_set_tokens), largest_request(wl))
    return -(-kv // block_size) * block_size


def measured_working_set(wl: Workload, results: Sequence[Result]) -> int | None:
    """A multi-turn run's working set as it was sent (the check on run_working_set(), which
    models no queueing): live_peak() over the turns' real send times, each holding the tokens
    its engine reported. None for single-turn sessions (their working set ignores timing)."""
    if all(len(s.turns) <= 1 for s in wl.sessions):
        return None
    last: dict[int, int] = {}
    for r in results:
        last[r.session] = max(last.get(r.session, -1), r.turn)
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
    """Why a run breaks the rule that one replica holds at most a quarter of the working set
    and the fleet all of it; None if it keeps it. A workload with nothing to share (working
    set 0) keeps it trivially: no routing raises its hit rate above 0."""
    ws = working_set_tokens
    problems = [text for broken, text in (
        (4 * kv > ws, f"one replica holds {kv / max(ws, 1):.2f} of it (> 0.25)"),
        (kv * replicas < ws, f"{replicas} replicas hold {kv * replicas / max(ws, 1):.2f} of it"
                             " (< 1)"),
    ) if broken and ws > 0]
    if not problems:
        return None
    return (f"KV capacity {kv:,} tokens per replica, working set {working_set_tokens:,} tokens: "
            + " and ".join(problems) + "; routing may not matter as the benchmark intends")


def slices(avg_turns: float, rates: Sequence[float], seconds: float) -> list[tuple[int, int]]:
    """(first session, number of sessions) of each step of a staircase: 1.5x the sessions the
    step's Poisson arrivals need on average, plus 5, one after the other in the sequence."""
    out = []
    start = 0
    for rate in rates:
        n = math.ceil(rate * seconds * 1.5 / max(avg_turns, 1.0)) + 5
        out.append((start, n))
        start += n
    return out
