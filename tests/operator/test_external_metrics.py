"""The metrics adapter's pure parts: totals, staleness, label selectors, API objects, and the
arithmetic the HPA does on them with the targets the operator renders."""

from __future__ import annotations

import math

import pytest
from operator_builders import FULL_SPEC, body, model

from prefix_operator import external_metrics as em
from prefix_operator.config import OperatorConfig
from prefix_operator.figures import Totals, aggregate, totals
from prefix_operator.render import horizontal_pod_autoscaler
from prefix_router.contract import RouterFigures


def pub(**kw: float) -> RouterFigures:
    """What a router publishes, read back the way the store hands it over (strings)."""
    return RouterFigures.from_hash({k: str(v) for k, v in kw.items()})


NOW = 10_000.0


def test_totals_sum_in_flight_and_take_the_widest_working_set() -> None:
    t = totals([
        pub(prompt_tokens=10, working_set_tokens=40000, in_flight=3, updated_at=NOW - 5),
        pub(cached_tokens=4, working_set_tokens=50000, in_flight=5, updated_at=NOW - 1),
        pub(working_set_tokens=999999, in_flight=100, updated_at=NOW - 600),  # gone
    ], now=NOW, stale_after=60)
    assert t == Totals(routers=2, prompt_tokens=10, cached_tokens=4, working_set_tokens=50000,
                       in_flight=8, updated_at=NOW - 1)
    assert em.value(t, em.IN_FLIGHT_METRIC) == 8
    assert em.value(t, em.WORKING_SET_METRIC) == 50000
    with pytest.raises(KeyError):
        em.value(t, "prefix_router_something_else")


def test_no_fresh_router_means_no_totals_not_zero() -> None:
    assert totals([], now=NOW) is None
    assert totals([pub(in_flight=4, updated_at=NOW - 61)], now=NOW, stale_after=60) is None
    # A hash without a usable timestamp is as good as silent.
    junk = RouterFigures.from_hash({"in_flight": "4", "updated_at": "junk"})
    assert totals([junk], now=NOW) is None
    # A fresh router that reports nothing in flight is a real zero, and is reported.
    fresh = totals([pub(in_flight=0, updated_at=NOW)], now=NOW)
    assert fresh is not None and fresh.in_flight == 0


@pytest.mark.parametrize(("text", "labels", "expected"), [
    ("", {}, True),
    ("prefixrouter.io/model=a", {"prefixrouter.io/model": "a"}, True),
    ("prefixrouter.io/model==a", {"prefixrouter.io/model": "b"}, False),
    ("prefixrouter.io/model!=a", {"prefixrouter.io/model": "b"}, True),
    ("prefixrouter.io/model!=a", {}, True),
    ("m in (a, b),ns=x", {"m": "b", "ns": "x"}, True),
    ("m in (a,b), ns=x", {"m": "c", "ns": "x"}, False),
    ("m notin (a,b)", {}, True),
    ("m notin (a,b)", {"m": "a"}, False),
    ("team", {"team": ""}, True),
    ("!team", {"team": "x"}, False),
    ("!team", {}, True),
    ("a=,b=1", {"a": "", "b": "1"}, True),
])
def test_label_selectors(text: str, labels: dict[str, str], expected: bool) -> None:
    assert em.parse_selector(text).matches(labels) is expected


@pytest.mark.parametrize("bad", ["a in (b", "a in b)", "=x", "a > 1", "a in (b),,", "a b"])
def test_bad_label_selectors_are_refused(bad: str) -> None:
    with pytest.raises(ValueError):
        em.parse_selector(bad)


def test_hpa_selector_string_matches_the_models_metric_labels() -> None:
    # What the HPA controller sends for the rendered selector (labels.Selector.String()).
    hpa = horizontal_pod_autoscaler(model(**FULL_SPEC), OperatorConfig())
    match = hpa["spec"]["metrics"][0]["external"]["metric"]["selector"]["matchLabels"]
    sent = ",".join(f"{k}={v}" for k, v in sorted(match.items()))
    labels = em.metric_labels(body(name="llama", namespace="ml"))
    assert em.parse_selector(sent).matches(labels)
    assert not em.parse_selector(sent).matches(em.metric_labels(body(name="other",
                                                                     namespace="ml")))


def test_metric_labels_keep_the_models_own_labels_but_ours_win() -> None:
    b = body(name="llama", namespace="ml")
    b["metadata"]["labels"] = {"team": "search", "prefixrouter.io/model": "spoofed"}
    assert em.metric_labels(b) == {"team": "search", "prefixrouter.io/model": "llama",
                                   "prefixrouter.io/namespace": "ml"}


def test_metric_items_filter_select_and_skip_stale() -> None:
    fresh = [pub(working_set_tokens=1200, in_flight=2.5, updated_at=NOW - 2)]
    stale = [pub(working_set_tokens=1, in_flight=1, updated_at=NOW - 3600)]
    a = {"prefixrouter.io/model": "a", "prefixrouter.io/namespace": "ml"}
    b = {"prefixrouter.io/model": "b", "prefixrouter.io/namespace": "ml"}
    c = {"prefixrouter.io/model": "c", "prefixrouter.io/namespace": "ml"}
    models = [(a, fresh), (b, stale), (c, [])]
    everything = em.parse_selector("")
    items = em.metric_items(em.IN_FLIGHT_METRIC, models, everything, now=NOW)
    assert items == [{"metricName": "prefix_router_in_flight", "metricLabels": a,
                      "timestamp": em.rfc3339(NOW - 2), "value": "2500m"}]
    assert em.metric_items(em.WORKING_SET_METRIC, models, everything,
                           now=NOW)[0]["value"] == "1200"
    assert em.metric_items(em.IN_FLIGHT_METRIC, models,
                           em.parse_selector("prefixrouter.io/model=b"), now=NOW) == []
    assert em.metric_items(em.IN_FLIGHT_METRIC, models,
                           em.parse_selector("prefixrouter.io/model=b"), now=NOW,
                           stale_after=7200)[0]["value"] == "1"


def test_quantities_and_timestamps() -> None:
    assert em.quantity(12) == "12"
    assert em.quantity(12.0) == "12"
    assert em.quantity(0.25) == "250m"
    assert em.quantity(0) == "0"
    assert em.rfc3339(0) == "1970-01-01T00:00:00Z"


def test_discovery_objects() -> None:
    resources = em.api_resource_list()
    assert resources["groupVersion"] == "external.metrics.k8s.io/v1beta1"
    assert [r["name"] for r in resources["resources"]] == [
        "prefix_router_working_set_tokens", "prefix_router_in_flight", "prefix_router_demand",
        "prefix_router_queued", "prefix_router_queue_oldest_wait_seconds"]
    assert all(r["namespaced"] and r["verbs"] == ["get"] for r in resources["resources"])
    group = em.api_group_list()["groups"][0]
    assert group["name"] == "external.metrics.k8s.io"
    assert group["preferredVersion"]["groupVersion"] == "external.metrics.k8s.io/v1beta1"
    assert em.status(401, "Unauthorized", "no")["code"] == 401


def _hpa_replicas(total: float, average_value: str) -> int:
    """The HPA's rule for an External AverageValue target: ceil(sum of items / target)."""
    target = float(average_value[:-1]) / 1000 if average_value.endswith("m") \
        else float(average_value)
    return math.ceil(total / target)


def test_hpa_arithmetic_on_our_totals_is_the_capacity_model() -> None:
    m = model(router={"kvCapacityTokens": 100000},
              autoscaling={"enabled": True, "targetCachePressure": 0.8, "targetLoad": 4})
    targets = {x["external"]["metric"]["name"]: x["external"]["target"]["averageValue"]
               for x in horizontal_pod_autoscaler(m, OperatorConfig())["spec"]["metrics"]}
    t = totals([pub(working_set_tokens=250000, in_flight=6, updated_at=NOW),
                   pub(working_set_tokens=240000, in_flight=5, updated_at=NOW)], now=NOW)
    assert t is not None
    # 250k tokens of hot prefixes at 80% of 100k per replica: 4 replicas (3.125 -> 4),
    # at which the cache pressure 250k / 400k = 0.625 is under the 0.8 target.
    ws = _hpa_replicas(t.working_set_tokens, targets[em.WORKING_SET_METRIC])
    assert ws == 4 and t.working_set_tokens / (ws * 100000) <= 0.8
    # 11 in flight at 4 per replica: 3 replicas.
    assert _hpa_replicas(t.in_flight, targets[em.IN_FLIGHT_METRIC]) == 3


def test_waiting_demand_reaches_the_hpa_and_the_status() -> None:
    """Requests waiting in the routers' dispatch queues (issue 39) add to the load the HPA
    scales on; the oldest wait is the longest, not a sum."""
    m = model(router={"kvCapacityTokens": 100000},
              autoscaling={"enabled": True, "targetCachePressure": 0.8, "targetLoad": 4})
    targets = {x["external"]["metric"]["name"]: x["external"]["target"]["averageValue"]
               for x in horizontal_pod_autoscaler(m, OperatorConfig())["spec"]["metrics"]}
    t = totals([pub(in_flight=8, queued=20, oldest_wait_s=3.5, updated_at=NOW),
                pub(in_flight=8, queued=4, oldest_wait_s=1.0, updated_at=NOW)], now=NOW)
    assert t is not None
    assert em.value(t, em.QUEUED_METRIC) == 24
    assert em.value(t, em.OLDEST_WAIT_METRIC) == 3.5
    # 16 in flight alone asks for 4 replicas; with 24 waiting, 40 at 4 a replica: 10
    assert _hpa_replicas(t.in_flight, targets[em.IN_FLIGHT_METRIC]) == 4
    assert _hpa_replicas(em.value(t, em.DEMAND_METRIC), targets[em.DEMAND_METRIC]) == 10
    figs = aggregate([pub(in_flight=8, queued=24, oldest_wait_s=3.5, updated_at=NOW)],
                     now=NOW, ready_replicas=4, kv_capacity_tokens=100000)
    status = figs.as_status("2026-01-01T00:00:00Z")
    assert status["queued"] == 24 and status["oldestWaitSeconds"] == 3.5
