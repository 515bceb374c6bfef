"""The map of stored responses to their engines: bounded, oldest out first, entries expire."""

from prefix_router.response_ids import ResponseIds


def test_the_map_keeps_the_newest_within_its_bound() -> None:
    ids = ResponseIds(max_ids=2, ttl_s=100.0, clock=lambda: 0.0)
    ids.remember("resp_a", "e1")
    ids.remember("resp_b", "e2")
    ids.remember("resp_a", "e1")  # seen again: the newest now
    ids.remember("resp_c", "e3")
    assert len(ids) == 2
    assert (ids.holder("resp_a"), ids.holder("resp_b"), ids.holder("resp_c")) == ("e1", None, "e3")


def test_an_entry_expires() -> None:
    now = [0.0]
    ids = ResponseIds(max_ids=10, ttl_s=60.0, clock=lambda: now[0])
    ids.remember("resp_a", "e1")
    now[0] = 59.0
    assert ids.holder("resp_a") == "e1"
    now[0] = 60.0
    assert ids.holder("resp_a") is None and len(ids) == 0
