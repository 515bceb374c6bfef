from prefix_router.scheduling import Ask, Candidate
from prefix_router.scheduling.filters import load_limit
from prefix_router.scheduling.scorers.prefix_match import PrefixMatch
from prefix_router.sizing import Sizing

from .conftest import choose

SIZING = Sizing(16, 64, 4.0, exact=True)


def test_the_score_is_the_matched_prefill_in_tokens() -> None:
    cands = [Candidate("a", matched_blocks=3), Candidate("b")]
    assert PrefixMatch(SIZING)(cands, Ask(1, 10, 3)) == [48, 0]
    assert PrefixMatch(SIZING)([Candidate("a")], Ask(1, 10, 0)) is None  # a miss: nothing to say


def test_the_owner_wins() -> None:
    cands = [Candidate("a", 1), Candidate("b", 1, matched_blocks=100), Candidate("c", 0)]
    d = choose(cands)
    assert (d.backend, d.reason) == ("b", "hit")


def test_overflow_keeps_affinity_among_the_backends_within_the_bound() -> None:
    # The full owner is out, but a partial owner is preferred over a cold backend.
    cands = [
        Candidate("a", 0),
        Candidate("b", 4, matched_blocks=100),
        Candidate("c", 1, matched_blocks=60),
        Candidate("d", 0),
    ]
    assert choose(cands).backend == "c"


def test_one_shared_prompt_gets_no_monopoly() -> None:
    # Every request shares one system prompt; with in-flight counting no backend passes the
    # bound, so the prompt gets several owners.
    names = list("abcdefgh")
    in_flight = dict.fromkeys(names, 0)
    owners = {"a"}
    for _ in range(200):
        cands = [Candidate(n, in_flight[n], matched_blocks=50 if n in owners else 0) for n in names]
        d = choose(cands)
        assert in_flight[d.backend] + 1 <= load_limit(cands, 0.25)
        in_flight[d.backend] += 1
        owners.add(d.backend)
        if sum(in_flight.values()) > 40:  # requests complete, load stays ~40 in flight
            in_flight[max(names, key=in_flight.__getitem__)] -= 1
    assert len(owners) >= 4


def test_a_lower_tier_hit_scores_its_prefill_less_its_load() -> None:
    # "a" holds 2 blocks on GPU; "b" none on GPU but 10 in CPU, each saving 1 - cost of a
    # block (index/tiers.py): its 10 x (1 - 1/22) blocks beat a's 2
    cands = [Candidate("a", matched_blocks=2), Candidate("b", tier_blocks=10 * (1 - 1 / 22))]
    assert PrefixMatch(SIZING)(cands, Ask(1, 10, 2)) == [32, 16 * 10 * (1 - 1 / 22)]
    only_cpu = [Candidate("a"), Candidate("b", tier_blocks=3.0)]
    assert PrefixMatch(SIZING)(only_cpu, Ask(1, 10, 0)) == [0, 48]  # no GPU hit anywhere
    d = choose(only_cpu)
    assert d.backend == "b"
