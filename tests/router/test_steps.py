"""StepClock: an engine's step rhythm read from when its streamed tokens arrive."""

from __future__ import annotations

import random

import pytest

from prefix_router.steps import LEAD_PRIOR_S, STALE_S, StepClock

B = "http://e1"
STEP = 0.016


def bursts(clock: StepClock, starts: list[float], streams: int = 5) -> None:
    """Each step's end: one chunk per running stream, all within a fraction of a ms."""
    for t in starts:
        for i in range(streams):
            clock.beat(B, t + i * 0.0001)


def test_bursts_give_the_step_length() -> None:
    c = StepClock()
    bursts(c, [i * STEP for i in range(20)])
    assert c.step(B) == pytest.approx(STEP, rel=1e-6)


def test_a_long_step_is_not_the_usual_step() -> None:
    # decode steps of 16 ms with a 60 ms prefill step between them
    c = StepClock()
    starts = [i * STEP for i in range(10)]
    starts += [starts[-1] + 0.060 + i * STEP for i in range(10)]
    bursts(c, starts)
    assert c.step(B) == pytest.approx(STEP, rel=1e-6)


def test_wait_is_what_is_left_of_the_step_after_the_lead() -> None:
    c = StepClock()
    bursts(c, [0.0, STEP, 2 * STEP])
    last = 2 * STEP
    # 5 ms after the last burst, the request reaches the engine a lead (2 ms) later:
    # 7 ms into a 16 ms step, so 9 ms to wait
    assert c.wait(B, last + 0.005) == pytest.approx(STEP - 0.005 - LEAD_PRIOR_S)
    # 15 ms after it, the request would arrive 1 ms into the NEXT step: almost a whole step
    assert c.wait(B, last + 0.015) == pytest.approx(STEP - 0.001)


def test_a_step_overdue_is_half_a_step_and_silence_is_unknown() -> None:
    c = StepClock()
    assert c.wait(B, 0.0) is None  # never heard from
    bursts(c, [0.0, STEP, 2 * STEP])
    assert c.wait(B, 2 * STEP + STEP + 0.005) == pytest.approx(STEP / 2)  # a longer step
    assert c.wait(B, 2 * STEP + STALE_S + 0.1) is None  # no stream for a long time
    c.forget(B)
    assert c.wait(B, 2 * STEP + 0.001) is None


def engine_events(
    lead_to: float, lead_back: float, requests: int, seed: int = 1
) -> list[tuple[float, str, float]]:
    """Events an engine with 16 ms steps shows a router: ('beat', t) for each step's burst of
    other streams, and ('first', t, sent) for each request sent at `sent` (it reaches the
    engine lead_to later, starts at the next step end, and its first token leaves at the end
    of that step; every chunk reaches the router lead_back after it leaves)."""
    rng = random.Random(seed)
    events: list[tuple[float, str, float]] = []
    sent = 0.05
    for _ in range(requests):
        sent += rng.uniform(0.02, 0.07)
        arrive = sent + lead_to
        start = (int(arrive / STEP) + 1) * STEP
        events.append((start + STEP + lead_back, "first", sent))
    end = events[-1][0] + STEP
    events += [(i * STEP + lead_back, "beat", 0.0) for i in range(int(end / STEP) + 1)]
    events.sort(key=lambda e: (e[0], e[1] != "beat"))  # a step's burst, then the first token
    return events


@pytest.mark.parametrize("lead_to,lead_back", [(0.0011, 0.0007), (0.0035, 0.0015)])
def test_the_lead_is_learned_from_first_tokens(lead_to: float, lead_back: float) -> None:
    c = StepClock()
    events = engine_events(lead_to, lead_back, 400)
    for t, kind, sent in events:
        if kind == "beat":
            c.beat(B, t)
        else:
            c.first_token(B, sent, t)
    assert c.lead(B) == pytest.approx(lead_to + lead_back, abs=0.0005)
    # and with it, the wait predicted is the wait the engine would impose
    last = max(t for t, kind, _ in events if kind == "beat")
    now = last + 0.004
    arrive = now + lead_to
    step_end = last - lead_back + STEP
    assert c.wait(B, now) == pytest.approx(step_end - arrive, abs=0.0006)


def test_no_vote_across_a_silence() -> None:
    c = StepClock()
    bursts(c, [0.0, STEP, 2 * STEP])
    # the backend went quiet; the next stream's first token says nothing of the lead
    t = 2 * STEP + STALE_S + 1.0
    c.first_token(B, t - 0.030, t)
    assert c.lead(B) == LEAD_PRIOR_S
