from prefix_router.config import RouterSettings
from prefix_router.scheduling import Ask, Candidate
from prefix_router.scheduling.scorers import in_flight

from .conftest import choose


def test_each_request_in_flight_costs_its_tokens() -> None:
    scorer = in_flight.build(RouterSettings(load_cost_tokens=64), None)
    assert scorer is not None
    assert scorer([Candidate("a", 2), Candidate("b", 0)], Ask(1)) == [-128, 0]
    assert in_flight.build(RouterSettings(load_cost_tokens=0), None) is None


def test_among_equals_the_idler_wins_even_without_a_cost() -> None:
    cands = [Candidate("a", 2), Candidate("b", 0), Candidate("c", 1)]
    assert choose(cands, load_cost_tokens=0).backend == "b"  # the picker's first tie-break
    assert choose(cands).backend == "b"
