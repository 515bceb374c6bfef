"""The response id map: the engine holding each id, oldest out first past the bound, entries
gone at their TTL."""

from __future__ import annotations

from prefix_router.response_ids import ResponseIds


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_each_id_names_its_engine() -> None:
    ids = ResponseIds(10, 60.0)
    ids.remember("resp_a", "http://e1")
    ids.remember("resp_b", "http://e2")
    assert ids.holder("resp_a") == "http://e1"
    assert ids.holder("resp_b") == "http://e2"
    assert ids.holder("resp_c") is None
    ids.forget("resp_a")
    assert ids.holder("resp_a") is None and len(ids) == 1


def test_the_oldest_goes_first_past_the_bound() -> None:
    ids = ResponseIds(3, 60.0)
    for i in range(5):
        ids.remember(f"resp_{i}", f"http://e{i % 2}")
    assert len(ids) == 3
    assert [ids.holder(f"resp_{i}") for i in range(5)] == [
        None, None, "http://e0", "http://e1", "http://e0"]  # fmt: skip


def test_an_id_leaves_within_a_second_past_its_ttl() -> None:
    clock = Clock()
    ids = ResponseIds(100, 10.0, clock)
    ids.remember("resp_a", "http://e1")
    clock.t += 0.5
    ids.remember("resp_b", "http://e1")
    clock.t += 10.0
    assert ids.holder("resp_a") == "http://e1"  # 10.5 s: its second's end is 10 s ago
    ids.remember("resp_b", "http://e2")  # seen again: its engine changes, not its time
    assert ids.holder("resp_b") == "http://e2"
    clock.t += 0.5
    assert ids.holder("resp_a") is None and ids.holder("resp_b") is None
    assert len(ids) == 0


def test_expired_ids_leave_as_new_ones_come() -> None:
    clock = Clock()
    ids = ResponseIds(1000, 1.0, clock)
    for i in range(50):
        ids.remember(f"resp_{i}", "http://e1")
    clock.t += 2.0
    ids.remember("resp_new", "http://e2")
    assert len(ids) == 1  # nobody asked for the old ones: they went all the same
