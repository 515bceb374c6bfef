"""index/tiers.py: what each KV-cache group needs of a hit, and what lower tiers save."""

from __future__ import annotations

import pytest

from prefix_router.index.tiers import GroupNeed, Residency, hybrid_hit, need_of, tier_run

M, B = "m", "http://192.0.2.10:8000"


def test_what_a_group_needs_of_a_hit() -> None:
    # vLLM's SlidingWindowManager: ceil((W - 1) / block_size) blocks before the hit point
    assert need_of("sliding_window", 32, 16) == GroupNeed(2)
    assert need_of("sliding_window", 4096, 16) == GroupNeed(256)
    assert need_of("sliding_window", 1, 16) == GroupNeed(1)
    assert need_of("mamba", None, 16) == GroupNeed(1)  # the state at the hit point
    assert need_of("full_attention", None, 16) is None  # the main table's
    assert need_of("chunked_local_attention", 64, 16) is None  # not modelled


def test_a_mamba_groups_hit_ends_where_it_holds_a_state() -> None:
    chain = list(range(100, 110))
    states = Residency()
    states.add(M, [chain[3], chain[6]], B)  # states after blocks 3 and 6
    assert hybrid_hit(chain, 10, [(GroupNeed(1), states)], M, B) == 7
    assert hybrid_hit(chain, 6, [(GroupNeed(1), states)], M, B) == 4
    assert hybrid_hit(chain, 3, [(GroupNeed(1), states)], M, B) == 0


def test_each_block_after_the_gpu_hit_counts_at_its_cheapest_tier() -> None:
    chain = list(range(10))
    cpu, disk = Residency(), Residency()
    cpu.add(M, chain[2:5], B)
    disk.add(M, chain[3:8], B)
    tiers = [(0.05, cpu), (0.2, disk)]  # cheapest first
    # from block 2: 2, 3, 4 from the CPU, 5, 6, 7 from disk; block 8 is nowhere
    assert tier_run(chain, 2, tiers, M, B) == pytest.approx(3 * 0.95 + 3 * 0.8)
    assert tier_run(chain, 0, tiers, M, B) == 0.0  # block 0 is in no tier: no run
