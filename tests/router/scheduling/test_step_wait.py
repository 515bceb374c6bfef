from prefix_router.scheduling import Ask, Candidate
from prefix_router.scheduling.scorers import Signals
from prefix_router.scheduling.scorers.step_wait import StepWait

from .conftest import choose


class Waits:
    """The step clock's answers, given (steps.py has tests of its own reading them)."""

    def __init__(self, **waits: float | None) -> None:
        self.waits = waits

    def wait(self, backend: str, now: float) -> float | None:
        return self.waits.get(backend)


def signals(**waits: float | None) -> Signals:
    return Signals(steps=Waits(**waits))  # type: ignore[arg-type]


def test_each_holder_pays_for_its_wait_past_the_soonest() -> None:
    cands = [Candidate("a", matched_blocks=5), Candidate("b", matched_blocks=5), Candidate("c")]
    got = StepWait(10_000, Waits(a=0.012, b=0.002, c=0.0))(cands, Ask(1, 5, 5))  # type: ignore[arg-type]
    assert got is not None
    assert [round(v, 6) for v in got] == [-100.0, 0.0, 0.0]


def test_an_unknown_rhythm_gets_the_mean_of_the_known_ones() -> None:
    # a's rhythm is unknown: it waits the mean of b's and c's (6 ms), 4 ms past b's
    cands = [Candidate("a", matched_blocks=5), Candidate("b", matched_blocks=5), Candidate("c")]
    got = StepWait(10_000, Waits(a=None, b=0.002, c=0.010))(cands, Ask(1, 5, 5))  # type: ignore[arg-type]
    assert got is not None
    assert [round(v, 6) for v in got] == [-40.0, 0.0, 0.0]
    assert StepWait(10_000, Waits())(cands, Ask(1, 5, 5)) is None  # type: ignore[arg-type]


def test_between_equal_owners_the_step_that_ends_first_wins() -> None:
    for a_wait, b_wait, want in ((0.012, 0.002, "b"), (0.002, 0.012, "a")):
        cands = [Candidate("a", 3, matched_blocks=100), Candidate("b", 3, matched_blocks=100)]
        d = choose(
            cands, load_bound=0.5, load_cost_tokens=64, step_wait_tokens_per_ms=12.6,
            signals=signals(a=a_wait, b=b_wait),
        )
        assert (d.backend, d.reason) == (want, "hit")


def test_step_wait_is_one_cost_among_the_others() -> None:
    # 10 ms of wait is worth 126 tokens at 12.6 tokens/ms: less than the 256 that 4 more in
    # flight cost, so the idler owner still wins; and no rhythm outweighs a prefix match.
    cands = [
        Candidate("a", 1, matched_blocks=100),
        Candidate("b", 5, matched_blocks=100),
        Candidate("c", 1),
    ]
    d = choose(
        cands, load_bound=10, load_cost_tokens=64, step_wait_tokens_per_ms=12.6,
        signals=signals(a=0.012, b=0.002, c=0.0),
    )
    assert d.backend == "a"


def test_a_new_prefix_is_placed_by_load_not_by_step_phase() -> None:
    cands = [Candidate("a", 1), Candidate("b", 3)]
    d = choose(
        cands, load_bound=10, load_cost_tokens=64, step_wait_tokens_per_ms=12.6,
        signals=signals(a=0.015, b=0.001),
    )
    assert (d.backend, d.reason) == ("a", "miss")


def test_a_long_step_on_the_owner_never_sends_its_request_elsewhere() -> None:
    # Under overload a step can be a whole chunk of prefill (0.6 s): at 30 tokens/ms that
    # would outweigh 1,600 matched tokens, but the wait only ranks the holders.
    cands = [Candidate("a", 1, matched_blocks=100), Candidate("b", 0)]
    d = choose(
        cands, load_bound=10, load_cost_tokens=64, step_wait_tokens_per_ms=30,
        signals=signals(a=0.6, b=0.0),
    )
    assert (d.backend, d.reason) == ("a", "hit")
