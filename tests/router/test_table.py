from prefix_router.index.table import OwnershipTable


def chain(n, base=0):
    return [base + i for i in range(1, n + 1)]


def test_match_depth_per_backend():
    t = OwnershipTable(block_tokens=16)
    t.record(chain(10), "a", now=0)
    t.record(chain(4), "b", now=0)
    assert t.match(chain(10)) == {"a": 10, "b": 4}
    assert t.match(chain(3)) == {"a": 3, "b": 3}
    assert t.match([999]) == {}
    # a diverging chain matches only up to the divergence
    assert t.match([1, 2, 777]) == {"a": 2, "b": 2}


def test_match_requires_contiguous_prefix():
    t = OwnershipTable(block_tokens=16)
    t.record([5, 6, 7], "a", now=0)
    assert t.match([1, 6, 7]) == {}


def test_capacity_evicts_tail_first_and_oldest_first():
    # capacity 8 blocks of 16 tokens
    t = OwnershipTable(block_tokens=16, capacity_tokens=128)
    t.record(chain(5, 0), "a", now=0)
    t.record(chain(5, 100), "a", now=1)
    # 10 blocks recorded, capacity 8: the two deepest blocks of the OLDER chain go first
    assert t.owned_blocks("a") == 8
    assert t.match(chain(5, 0)) == {"a": 3}
    assert t.match(chain(5, 100)) == {"a": 5}


def test_touch_refreshes_lru():
    t = OwnershipTable(block_tokens=16, capacity_tokens=16 * 6)
    t.record(chain(3, 0), "a", now=0)
    t.record(chain(3, 100), "a", now=1)
    t.record(chain(3, 0), "a", now=2)  # touch the first again
    t.record(chain(3, 200), "a", now=3)
    assert t.match(chain(3, 0)) == {"a": 3}
    assert t.match(chain(3, 100)) == {}
    assert len(t) == 6


def test_ttl():
    t = OwnershipTable(block_tokens=16, ttl=10)
    t.record(chain(3), "a", now=0)
    t.record(chain(3, 50), "a", now=8)
    assert t.match(chain(3), now=11) == {}
    assert t.match(chain(3, 50), now=11) == {"a": 3}
    assert t.expire(now=11) == 3
    assert len(t) == 3


def test_drop_backend_and_slot_reuse():
    t = OwnershipTable(block_tokens=16)
    t.record(chain(4), "a", now=0)
    t.record(chain(4), "b", now=0)
    assert t.drop_backend("a") == 4
    assert t.match(chain(4)) == {"b": 4}
    t.record(chain(2), "c", now=1)  # reuses a's bit
    assert t.match(chain(4)) == {"b": 4, "c": 2}
    assert t.drop_backend("zzz") == 0


def test_max_owners_limits_replication():
    t = OwnershipTable(block_tokens=16, max_owners=2)
    for b in "abc":
        t.record(chain(3), b, now=0)
    assert set(t.match(chain(3))) == {"a", "b"}


def test_max_entries_bound():
    t = OwnershipTable(block_tokens=16, max_entries=1000)
    for i in range(100):
        t.record(chain(20, i * 1000), f"b{i % 4}", now=i)
    assert len(t) <= 1000
    assert t.distinct_blocks() <= 1000


def test_truncate_keeps_the_head_of_the_chain():
    t = OwnershipTable(block_tokens=16)
    t.record(chain(5), "a", now=0)
    t.record(chain(5), "b", now=0)
    assert t.truncate(chain(5), "a", keep=2) == 3
    assert t.match(chain(5)) == {"a": 2, "b": 5}
    assert t.truncate(chain(5), "a", keep=0) == 2
    assert t.match(chain(5)) == {"b": 5}
    assert len(t) == 5


def test_tail_age_is_the_coldest_block_of_a_full_backend():
    t = OwnershipTable(block_tokens=16, capacity_tokens=16 * 10)
    t.record(chain(4), "a", now=0)
    assert t.tail_age("a", now=50) == float("inf")  # room left: a new prefix evicts nothing
    assert t.tail_age("nobody", now=50) == float("inf")
    t.record(chain(6, base=100), "a", now=40)
    assert t.tail_age("a", now=50) == 50  # full; its coldest block was used at 0
    t.record(chain(4), "a", now=45)  # the old prefix is used again: now the tail is at 40
    assert t.tail_age("a", now=50) == 10
    assert OwnershipTable(block_tokens=16).tail_age("a", now=1) == float("inf")  # no capacity model
