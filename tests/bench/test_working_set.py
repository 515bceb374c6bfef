"""The benchmark's capacity rule (bench/harness/capacity.py): one replica holds a quarter or
less of a workload's working set and the fleet all of it, so routing matters. Pure: the working
set is computed over the built workload and the load generator's schedule, nothing started."""

from __future__ import annotations

import functools

import pytest

from bench.harness.capacity import (
    capacity_warning,
    kv_capacity,
    measured_working_set,
    persona_tokens,
    run_count,
    run_working_set,
    turn_tokens,
    working_set,
)
from bench.harness.loadgen import Result
from bench.harness.workloads import WORKLOADS, Session, Turn, Workload, build
from bench.scenarios import SCENARIOS

RATE, SECONDS = SCENARIOS["routing"].rates[0], SCENARIOS["routing"].seconds  # type: ignore[index]
SWEEP_RATES = SCENARIOS["sweep"].rates or ()

REPLICAS = 8  # the suite's fleet


@functools.cache
def built(name: str, rate: float, seconds: float) -> Workload:
    return build(name, run_count(rate, seconds))


def assert_rule(name: str, rate: float, seconds: float) -> None:
    wl = built(name, rate, seconds)
    ws = run_working_set(wl, rate, seconds)
    kv = kv_capacity(wl, ws)
    assert capacity_warning(kv, ws, REPLICAS) is None
    if ws:  # unique shares nothing: no capacity makes routing raise its hit rate
        assert 4 * kv <= ws <= REPLICAS * kv, (name, rate, seconds, kv, ws)
    else:
        assert name == "unique"


@pytest.mark.parametrize("name", WORKLOADS)
def test_every_workload_keeps_the_rule_at_the_suites_settings(name: str) -> None:
    assert_rule(name, RATE, SECONDS)


# The sweep runs 60 s a rate (scenarios.py); multi-turn's working set grows with the rate and,
# until its conversations overlap in a steady state, with the seconds: its corners too.
@pytest.mark.parametrize(
    ("rate", "seconds"),
    [(r, 60.0) for r in SWEEP_RATES] + [(8.0, 30.0), (8.0, 90.0), (32.0, 30.0), (32.0, 90.0)],
)
def test_multi_turn_keeps_the_rule_from_8_to_32_requests_a_second(
    rate: float, seconds: float
) -> None:
    assert_rule("multi-turn", rate, seconds)


def test_the_old_fixed_multi_turn_capacity_broke_the_rule_at_the_suites_settings() -> None:
    # 48k a replica held 0.43 of the live histories at 24 req/s: routing barely had to matter
    ws = run_working_set(built("multi-turn", RATE, SECONDS), RATE, SECONDS)
    assert 4 * 48_000 > ws
    assert "(> 0.25)" in (capacity_warning(48_000, ws, REPLICAS) or "")


def conversation(persona: str, users: list[int]) -> Session:
    return Session(persona, [Turn("u" * (4 * n), 100) for n in users])


def test_multi_turn_working_set_counts_only_conversations_live_at_once() -> None:
    a = conversation("P" * 400, [50, 60])
    b = conversation("P" * 400, [70, 80])
    wl = Workload("mt", [a, b], 100)
    ta, tb = turn_tokens(a), turn_tokens(b)
    shared = persona_tokens(a)
    # a turn lasts 100 tokens x 0.01 s = 1 s: a's turns at 0 and 1, b's at 0.5 and 1.5
    overlapping = working_set(wl, [0.0, 0.5], 0.01)
    # at 1.0 a sends its last turn while b is on its first; the persona counts once
    assert overlapping == max(shared + (ta[1] - shared) + (tb[0] - shared), tb[1])
    # b starts after a's last turn: never both live, whatever their final histories add up to
    apart = working_set(wl, [0.0, 5.0], 0.01)
    assert apart == max(ta[1], tb[1]) < ta[1] + tb[1]
    # sessions the schedule never starts are not counted
    assert working_set(wl, [0.0], 0.01) == ta[1]


def test_single_turn_working_set_is_the_workloads_shared_material() -> None:
    wl = build("system-prompts", 50)
    assert working_set(wl, [0.0, 1.0], 0.015) == 64 * 2000


def test_measured_working_set_follows_the_real_send_times() -> None:
    a = conversation("P" * 400, [50, 60])
    wl = Workload("mt", [a, conversation("Q" * 400, [70])], 100)

    def sent(session: int, turn: int, at: float, prompt: int | None) -> Result:
        return Result(session, turn, at, 0.01, 1.0, prompt is not None, 100, prompt)

    t = turn_tokens(a)
    results = [sent(0, 0, 0.0, t[0] - 100), sent(0, 1, 3.0, t[1] - 100)]
    assert measured_working_set(wl, results) == t[1]
    # a failed turn ends its conversation: it holds nothing after it
    assert measured_working_set(wl, [*results[:1], sent(0, 1, 3.0, None)]) == t[0]
    assert measured_working_set(build("unique", 5), []) is None


def test_capacity_warning_names_what_breaks() -> None:
    assert capacity_warning(24_000, 128_000, 8) is None
    too_few = capacity_warning(24_000, 128_000, 4)
    assert too_few and "4 replicas hold 0.75 of it (< 1)" in too_few
    too_big = capacity_warning(48_000, 111_280, 8)
    assert too_big and "one replica holds 0.43 of it (> 0.25)" in too_big
    assert capacity_warning(32_000, 0, 8) is None  # nothing to share
