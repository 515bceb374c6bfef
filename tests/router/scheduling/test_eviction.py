from prefix_router.scheduling import Ask, Candidate
from prefix_router.scheduling.scorers.eviction import HEAT_FLOOR_S, Eviction
from prefix_router.sizing import Sizing

from .conftest import choose

SIZING = Sizing(16, 64, 4.0, exact=True)


def test_the_cost_is_new_blocks_times_their_heat() -> None:
    hot = Candidate("hot", tail_age=1.0)
    cold = Candidate("cold", tail_age=60.0, matched_blocks=25)
    roomy = Candidate("roomy")
    got = Eviction(1.0, SIZING)([hot, cold, roomy], Ask(1, 125, 25))
    assert got is not None
    heat_cold = (1.0 + HEAT_FLOOR_S) / (60.0 + HEAT_FLOOR_S)
    assert got == [-16.0 * 125, -16.0 * 100 * heat_cold, 0.0]
    assert Eviction(1.0, SIZING)([roomy], Ask(1, 125)) is None  # nobody is full: nothing evicts


def test_a_miss_goes_where_it_evicts_the_coldest_blocks() -> None:
    # Equal load, no owner: "hot" would evict a block used 1 s ago, "cold" one unused for
    # 60 s, "roomy" has space left.
    hot, cold = Candidate("hot", 2, tail_age=1.0), Candidate("cold", 2, tail_age=60.0)
    d = choose([hot, cold], load_bound=0.5, prompt_blocks=125, evict_weight=1.0)
    assert (d.backend, d.reason) == ("cold", "miss")
    roomy = Candidate("roomy", 2)
    d = choose([hot, cold, roomy], load_bound=0.5, prompt_blocks=125, evict_weight=1.0)
    assert d.backend == "roomy"
    # without the eviction cost the tie falls to the prefix's hash, which picks either
    picked = {choose([hot, cold], key=k, load_bound=0.5).backend for k in range(20)}
    assert picked == {"hot", "cold"}


def test_eviction_yields_to_load() -> None:
    # 125 blocks x 16 tokens x (1 - 1.5/60.5) ~ 1,950 tokens of eviction saved is worth less
    # than 10 requests x 256 tokens of load.
    hot = Candidate("hot", 0, tail_age=1.0)
    cold = Candidate("cold", 10, tail_age=60.0)
    d = choose([hot, cold], load_bound=10, prompt_blocks=125, evict_weight=1.0)
    assert d.backend == "hot"
