import math
import random
from collections import Counter

from prefix_router.policy import (
    Candidate,
    HashRing,
    RoundRobin,
    choose_chwbl,
    choose_least_loaded,
    choose_prefix,
    load_limit,
)


def pick(cands, key=1, eps=0.25, cost=256.0):
    return choose_prefix(cands, block_tokens=16, eps=eps, load_cost_tokens=cost, key=key)


def test_prefers_owner():
    cands = [Candidate("a", 1, 0, 0), Candidate("b", 1, 0, 100), Candidate("c", 0, 0, 0)]
    d = pick(cands)
    assert d.backend == "b" and d.reason == "hit"


def test_bounded_load_excludes_full_owner_and_replicates():
    # b owns the prefix but is at the bound: ceil(1.25 * 7 / 3) = 3, so b (3 in flight) is out
    cands = [Candidate("a", 1, 0, 0), Candidate("b", 3, 0, 100), Candidate("c", 2, 0, 0)]
    assert load_limit(cands, 0.25) == 3
    d = pick(cands)
    assert d.backend == "a" and d.reason == "replicated"
    assert d.order[-1] == "b"  # held back, last resort for retries


def test_overflow_keeps_affinity_among_allowed():
    # The full owner is out, but a partial owner is preferred over a cold backend:
    # imbalance handling must not discard affinity.
    cands = [
        Candidate("a", 0, 0, 0),
        Candidate("b", 4, 0, 100),
        Candidate("c", 1, 0, 60),
        Candidate("d", 0, 0, 0),
    ]
    d = pick(cands)
    assert d.backend == "c"


def test_miss_under_low_concurrency_spreads():
    # Idle fleet, all misses: different prefixes must not all land on one backend.
    cands = [Candidate(n) for n in "abcdefgh"]
    hits = Counter(pick(cands, key=random.Random(k).getrandbits(64)).backend for k in range(800))
    assert set(hits) == set("abcdefgh")
    assert max(hits.values()) < 2 * 800 / 8


def test_ties_broken_by_load_first():
    cands = [Candidate("a", 2, 0, 0), Candidate("b", 0, 0, 0), Candidate("c", 1, 0, 0)]
    assert pick(cands, cost=0).backend == "b"


def test_pending_prefill_counts_as_load():
    cands = [Candidate("a", 1, 6000, 0), Candidate("b", 1, 0, 0)]
    assert pick(cands).backend == "b"


def test_single_shared_prompt_is_no_monopoly():
    # Every request shares one system prompt. Simulate dispatch with in-flight counting:
    # no backend may exceed the bound, so the prompt gets several owners.
    names = list("abcdefgh")
    inflight = dict.fromkeys(names, 0)
    owners: set[str] = {"a"}
    for _ in range(200):
        cands = [Candidate(n, inflight[n], 0, 50 if n in owners else 0) for n in names]
        d = pick(cands)
        limit = load_limit(cands, 0.25)
        assert inflight[d.backend] + 1 <= limit
        inflight[d.backend] += 1
        owners.add(d.backend)
        if sum(inflight.values()) > 40:  # requests complete, load stays ~40 in flight
            busiest = max(names, key=inflight.__getitem__)
            inflight[busiest] -= 1
    assert (
        max(inflight.values()) <= load_limit([Candidate(n, inflight[n]) for n in names], 0.25) + 1
    )
    assert len(owners) >= 4


def test_least_loaded_and_round_robin():
    rng = random.Random(0)
    cands = [Candidate("a", 3), Candidate("b", 1), Candidate("c", 2)]
    assert choose_least_loaded(cands, rng).backend == "b"
    rr = RoundRobin()
    got = [rr.choose(cands).backend for _ in range(6)]
    assert got == ["a", "b", "c", "a", "b", "c"]


def test_chwbl_is_sticky_and_bounded():
    ring = HashRing()
    cands = [Candidate(n) for n in "abcd"]
    first = choose_chwbl(cands, ring, key=12345, eps=0.25).backend
    assert choose_chwbl(cands, ring, key=12345, eps=0.25).backend == first
    loaded = [Candidate(n, 5 if n == first else 0) for n in "abcd"]
    d = choose_chwbl(loaded, ring, key=12345, eps=0.25)
    assert d.backend != first and d.reason == "overflow"


def test_a_miss_goes_where_it_evicts_the_coldest_blocks():
    # Equal load, no owner: "hot" evicted a block used 1 s ago, "cold" one unused for 60 s,
    # "roomy" has space left. The miss must not push out blocks still in use on "hot".
    hot, cold = Candidate("hot", 2, 0, 0, tail_age=1.0), Candidate("cold", 2, 0, 0, tail_age=60.0)
    d = choose_prefix(
        [hot, cold], block_tokens=16, eps=0.5, load_cost_tokens=256, key=7,
        prompt_blocks=125, evict_weight=1.0,
    )
    assert d.backend == "cold" and d.reason == "miss"
    roomy = Candidate("roomy", 2, 0, 0)
    d = choose_prefix(
        [hot, cold, roomy], block_tokens=16, eps=0.5, load_cost_tokens=256, key=7,
        prompt_blocks=125, evict_weight=1.0,
    )
    assert d.backend == "roomy"
    # Without the eviction cost the tie falls to the hash, which picks "hot" for some key.
    keys = {
        choose_prefix([hot, cold], block_tokens=16, eps=0.5, load_cost_tokens=256, key=k).backend
        for k in range(20)
    }
    assert keys == {"hot", "cold"}


def test_eviction_cost_yields_to_load():
    # The cold backend is much busier: 125 blocks x 16 tokens x (1 - 1.5/60.5) ~ 1,950 tokens
    # of eviction saved is worth less than 10 requests x 256 tokens of load.
    hot = Candidate("hot", 0, 0, 0, tail_age=1.0)
    cold = Candidate("cold", 10, 0, 0, tail_age=60.0)
    d = choose_prefix(
        [hot, cold], block_tokens=16, eps=10, load_cost_tokens=256, key=7,
        prompt_blocks=125, evict_weight=1.0,
    )
    assert d.backend == "hot"


def test_load_slack_is_an_absolute_floor_under_the_bound():
    cands = [Candidate("a", 1), Candidate("b", 3), Candidate("c", 2)]
    assert load_limit(cands, 0.25) == 3  # ceil(1.25 x 7/3)
    assert load_limit(cands, 0.25, slack=4) == 7  # ceil(7/3 + 4)
    # at high load the relative bound is the larger one
    busy = [Candidate(n, 40) for n in "abc"]
    assert load_limit(busy, 0.25, slack=4) == math.ceil(1.25 * 121 / 3)


def test_between_equal_owners_the_step_that_ends_first_wins():
    # Both hold the prefix, both carry 3: the one whose engine step ends in 2 ms starts this
    # request's prefill 10 ms sooner than the other (steps.py).
    for a_wait, b_wait, want in ((0.012, 0.002, "b"), (0.002, 0.012, "a")):
        cands = [
            Candidate("a", 3, 0, 100, step_wait=a_wait),
            Candidate("b", 3, 0, 100, step_wait=b_wait),
        ]
        d = choose_prefix(
            cands, block_tokens=16, eps=0.5, load_cost_tokens=64, key=7, wait_tokens_per_s=12_600
        )
        assert (d.backend, d.reason) == (want, "hit")


def test_step_wait_is_one_cost_among_the_others():
    # 10 ms of wait is worth 126 tokens at 12,600 tokens/s: less than 4 more in flight cost
    # (256), so the idler owner still wins; and no rhythm never outweighs a prefix match.
    cands = [
        Candidate("a", 1, 0, 100, step_wait=0.012),
        Candidate("b", 5, 0, 100, step_wait=0.002),
        Candidate("c", 1, 0, 0, step_wait=0.0),
    ]
    d = choose_prefix(
        cands, block_tokens=16, eps=10, load_cost_tokens=64, key=7, wait_tokens_per_s=12_600
    )
    assert d.backend == "a"


def test_a_new_prefix_is_placed_by_load_not_by_step_phase():
    # Nobody holds it: b's step ends 14 ms sooner, but a carries 2 fewer, and the placement
    # decides where every later request of this prefix goes.
    cands = [Candidate("a", 1, 0, 0, step_wait=0.015), Candidate("b", 3, 0, 0, step_wait=0.001)]
    d = choose_prefix(
        cands, block_tokens=16, eps=10, load_cost_tokens=64, key=7, wait_tokens_per_s=12_600
    )
    assert (d.backend, d.reason) == ("a", "miss")


def test_demand_for_another_owner_takes_the_best_non_owner_within_bounds():
    # a and b hold the prefix; the router's demand estimate wants a third owner: of the
    # others, c is over the bound and d is idler than e, so d takes it.
    cands = [
        Candidate("a", 2, 0, 100),
        Candidate("b", 2, 0, 100),
        Candidate("c", 9, 0, 0),
        Candidate("d", 1, 0, 0),
        Candidate("e", 3, 0, 0),
    ]
    d = choose_prefix(cands, block_tokens=16, eps=0.5, load_cost_tokens=64, key=7, spread=True)
    assert (d.backend, d.reason) == ("d", "replicated")
    assert d.order[:2] == ["a", "b"]  # the owners stay the first fallbacks
    # without the demand the owners keep it
    d = choose_prefix(cands, block_tokens=16, eps=0.5, load_cost_tokens=64, key=7)
    assert d.reason == "hit" and d.backend in ("a", "b")


def test_demand_for_another_owner_yields_when_every_backend_holds_it_or_is_full():
    everyone = [Candidate("a", 2, 0, 100), Candidate("b", 1, 0, 100)]
    d = choose_prefix(everyone, block_tokens=16, eps=0.5, load_cost_tokens=64, key=7, spread=True)
    assert (d.backend, d.reason) == ("b", "hit")
    full = [Candidate("a", 1, 0, 100), Candidate("b", 9, 0, 0)]
    d = choose_prefix(full, block_tokens=16, eps=0.5, load_cost_tokens=64, key=7, spread=True)
    assert (d.backend, d.reason) == ("a", "hit")
    # a miss has no owner to add to: it is placed as any miss
    cold = [Candidate("a", 2), Candidate("b", 1)]
    d = choose_prefix(cold, block_tokens=16, eps=0.5, load_cost_tokens=64, key=7, spread=True)
    assert (d.backend, d.reason) == ("b", "miss")


def test_a_long_step_on_the_owner_never_sends_its_request_elsewhere():
    # Under overload an engine's step can be a whole chunk of prefill (0.6 s here): at 30
    # tokens/ms that wait would outweigh the 1,600 matched tokens. The wait only ranks the
    # owners against each other, so the request stays with its owner.
    cands = [Candidate("a", 1, 0, 100, step_wait=0.6), Candidate("b", 0, 0, 0, step_wait=0.0)]
    d = choose_prefix(
        cands, block_tokens=16, eps=10, load_cost_tokens=64, key=7, wait_tokens_per_s=30_000
    )
    assert (d.backend, d.reason) == ("a", "hit")
