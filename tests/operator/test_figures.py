from __future__ import annotations

from prefix_operator.cachestore import glob_escape
from prefix_operator.figures import STALE_AFTER_SECONDS, aggregate
from prefix_router.contract import WORKING_SET_WINDOW_S, RouterFigures


def pub(**kw: float) -> RouterFigures:
    return RouterFigures.from_hash({k: str(v) for k, v in kw.items()})


def test_aggregate_over_fresh_routers() -> None:
    now = 1000.0
    published = [
        pub(prompt_tokens=1000, cached_tokens=600, working_set_tokens=40000, in_flight=3,
            updated_at=now - 5),
        pub(prompt_tokens=1000, cached_tokens=200, working_set_tokens=50000, in_flight=5,
            updated_at=now - 1),
        pub(prompt_tokens=9999, cached_tokens=9999, working_set_tokens=1, in_flight=100,
            updated_at=now - 600),  # a router gone for ten minutes
    ]
    f = aggregate(published, now=now, ready_replicas=2, kv_capacity_tokens=50000)
    assert f.routers == 2
    assert f.hit_rate == 0.4
    assert f.cache_pressure == 0.5  # the most complete view (max), over 2 x 50k
    assert f.load == 4.0
    assert f.as_status("T") == {"routers": 2, "updatedAt": "T", "hitRate": 0.4,
                                "cachePressure": 0.5, "load": 4.0, "queued": 0,
                                "oldestWaitSeconds": 0}


def test_unknowns_stay_unknown() -> None:
    f = aggregate([pub(prompt_tokens=0, updated_at=10)], now=10, ready_replicas=0,
                  kv_capacity_tokens=0)
    assert (f.hit_rate, f.cache_pressure, f.load) == (None, None, None)
    assert aggregate([], now=0, ready_replicas=1, kv_capacity_tokens=1).routers == 0
    junk = RouterFigures.from_hash({"prompt_tokens": "junk", "updated_at": "5"})
    assert aggregate([junk], now=5, ready_replicas=1, kv_capacity_tokens=1).hit_rate is None


def test_a_router_is_stale_after_one_working_set_window() -> None:
    assert STALE_AFTER_SECONDS == WORKING_SET_WINDOW_S
    at = 1000.0
    ok = aggregate([pub(in_flight=1, updated_at=at)], now=at + WORKING_SET_WINDOW_S,
                   ready_replicas=1, kv_capacity_tokens=1)
    gone = aggregate([pub(in_flight=1, updated_at=at)], now=at + WORKING_SET_WINDOW_S + 0.1,
                     ready_replicas=1, kv_capacity_tokens=1)
    assert (ok.routers, gone.routers) == (1, 0)


def test_glob_escape() -> None:
    assert glob_escape("prefixrouter:ns/a*b?[c]:") == r"prefixrouter:ns/a\*b\?\[c\]:"


def test_index_states_as_the_router_that_knows_least_says() -> None:
    now = 100.0
    published = [
        pub(engines=4, engines_exact=3, engines_degraded=1, updated_at=now),
        pub(engines=4, engines_exact=2, engines_degraded=0, updated_at=now),  # one behind
    ]
    f = aggregate(published, now=now, ready_replicas=4, kv_capacity_tokens=1)
    status = f.as_status("T")
    assert {k: status[k] for k in ("engines", "exactEngines", "estimatedEngines",
                                   "degradedEngines", "indexExact")} == {
        "engines": 4, "exactEngines": 2, "estimatedEngines": 1, "degradedEngines": 1,
        "indexExact": "2/4"}  # fmt: skip


def test_no_index_states_from_routers_that_publish_none() -> None:
    f = aggregate([pub(in_flight=1, updated_at=5)], now=5, ready_replicas=1,
                  kv_capacity_tokens=1)
    assert "indexExact" not in f.as_status("T")
