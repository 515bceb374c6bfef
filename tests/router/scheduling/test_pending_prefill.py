from prefix_router.config import RouterSettings
from prefix_router.scheduling import Ask, Candidate
from prefix_router.scheduling.scorers import pending_prefill

from .conftest import choose


def test_pending_prefill_costs_its_weight_in_tokens() -> None:
    scorer = pending_prefill.build(RouterSettings(pending_weight=0.5), None)
    assert scorer is not None
    assert scorer([Candidate("a", 0, 600), Candidate("b")], Ask(1)) == [-300, 0]


def test_a_backend_with_prefill_queued_is_avoided() -> None:
    cands = [Candidate("a", 1, 6000), Candidate("b", 1, 0)]
    assert choose(cands).backend == "b"
