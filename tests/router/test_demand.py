from prefix_router.scheduling.demand import Demand, wants_another_owner


def test_the_rate_of_a_steady_stream_is_read_back() -> None:
    d = Demand(half_life=30.0)
    t = 0.0
    for _ in range(600):  # 4 requests a second for 150 s
        d.observe(1, t)
        t += 0.25
    assert 3.6 < d.rate(1, t) < 4.4
    assert d.rate(2, t) == 0.0
    # without requests it decays with its half-life
    assert abs(d.rate(1, t + 30.0) - d.rate(1, t) / 2) < 1e-9


def test_tracking_is_bounded_and_the_coldest_go_first() -> None:
    d = Demand(max_tracked=8)
    for k in range(8):
        for _ in range(k + 1):
            d.observe(k, 0.0)
    d.observe(100, 0.0)
    assert len(d) <= 8
    assert d.rate(7, 0.0) > 0 and d.rate(0, 0.0) == 0.0


def test_one_more_owner_per_replicate_rate_up_to_the_cap() -> None:
    assert wants_another_owner(2.5, 2, 1.0, 0)
    assert not wants_another_owner(1.5, 2, 1.0, 0)
    assert not wants_another_owner(9.0, 3, 1.0, 3)  # capped
    assert not wants_another_owner(9.0, 1, 0.0, 0)  # off
