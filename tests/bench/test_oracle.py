"""The oracle (bench/oracle.py) is one simulator engine as large as the fleet, fed the run's
requests one after the other: it caches what the engine caches, answers included."""

from __future__ import annotations

from bench.oracle import oracle_hit_rate
from bench.workloads import build, messages_for
from engine_sim.chat import render_chat
from engine_sim.engine import Engine
from engine_sim.profiles import PROFILES


def engine_run(capacity: int) -> tuple[list[list[dict[str, str]]], list[str], float]:
    """Multi-turn conversations, their turns interleaved, through one engine that answers at
    once (profile `zero`): (requests in order, their answers, the engine's hit rate)."""
    engine = Engine(PROFILES["zero"], capacity)
    sessions = build("multi-turn", 40).sessions[:6]
    answers: list[list[str]] = [[] for _ in sessions]
    sent: list[list[dict[str, str]]] = []
    got: list[str] = []
    for turn in range(max(len(s.turns) for s in sessions)):
        for k, s in enumerate(sessions):
            if turn >= len(s.turns):
                continue
            msgs = messages_for(s, turn, answers[k])
            r = engine.submit(render_chat(msgs).encode(), s.turns[turn].max_tokens, seed=k)
            assert r.done
            answer = "".join(r.text)
            answers[k].append(answer)
            sent.append(msgs)
            got.append(answer)
    c = engine.counters
    return sent, got, c.cached_tokens / c.prompt_tokens


def test_the_oracle_is_one_engine_fed_the_same_requests_and_answers() -> None:
    for capacity in (1_000_000, 12_000):  # everything fits; LRU evictions
        sent, answers, engine_hit = engine_run(capacity)
        assert oracle_hit_rate(sent, capacity, answers=answers) == engine_hit


def test_without_the_answers_the_oracle_misses_what_the_next_turn_reuses() -> None:
    # the oracle before answers were replayed: below what one engine of its size gets
    sent, _answers, engine_hit = engine_run(1_000_000)
    assert oracle_hit_rate(sent, 1_000_000) < engine_hit - 0.05
