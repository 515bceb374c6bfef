"""The pure parts of bench/autoscale.py: the growing workload, the capacity model of a sample,
scale events and the run's summary, the manifest and what the HPA the operator renders for it
reads. The run itself (control plane, operator, adapter, routers) is not started here."""

from __future__ import annotations

import dataclasses
from typing import Any
from urllib.parse import parse_qs, urlsplit

from bench.autoscale import (
    METRIC_PATH,
    NAME,
    NAMESPACE,
    Settings,
    derived,
    growing_workload,
    model_manifest,
    scale_events,
    summarize,
    tenants_at,
)
from prefix_operator.config import OperatorConfig
from prefix_operator.render import horizontal_pod_autoscaler
from prefix_operator.spec import Model
from prefix_router.contract import WORKING_SET_METRIC

# One replica holds 1,000 tokens; the HPA's target is half of that: 500 tokens per replica.
S = Settings(kv_capacity_tokens=1000, target_cache_pressure=0.5, min_replicas=1, max_replicas=4)
LOAD_START, LOAD_STOP = 4.0, 20.0


def sample(
    t: float, ws: float | None, spec: int | None, ready: int, desired: int | None = None
) -> dict[str, Any]:
    """A sample as the benchmark records it, with the derived figures added the same way."""
    x: dict[str, Any] = {
        "t": t,
        "working_set_tokens": ws,
        "spec_replicas": spec,
        "ready_replicas": ready,
        "hpa_desired": spec if desired is None else desired,
    }
    x.update(derived(x, S))
    return x


# A run: up 1 -> 2 -> 3 under load, down 3 -> 2 -> 1 after it (figures worked out by hand in
# test_the_summary_of_a_run).
RUN = [
    sample(0, 0, 1, 1),
    sample(2, 0, 1, 1),
    sample(4, 520, 1, 1),  # pressure 0.52: over 0.5, within the HPA's tolerance
    sample(6, 600, 1, 1),  # pressure 0.6 > 0.5 x 1.1: over the target
    sample(8, 900, 2, 1, desired=2),  # spec 2, one pod Ready
    sample(10, 1100, 2, 2),  # both Ready: 2 s after the change
    sample(12, 1400, 3, 3),  # Ready in the same sample
    sample(14, 1400, 3, 3),
    sample(16, 1400, 3, 3),
    sample(18, 1400, 3, 3),
    sample(20, 1400, 3, 3),  # the load stops here: needed 2.8 of 3
    sample(22, 1400, 3, 3),
    sample(24, 1200, 3, 3),  # needed 2.4: below 3 x 0.9 but its ceiling is still 3
    sample(26, 900, 3, 3),  # needed 1.8: the first ask for fewer (2)
    sample(28, 900, 3, 3),
    sample(30, 400, 3, 3),  # needed 0.8: asks for 1
    sample(32, 400, 2, 3),  # spec 3 -> 2, replicas not yet gone
    sample(34, 0, 2, 3),  # still not
    sample(36, 0, 2, 2),  # 4 s after the change
    sample(38, 0, 1, 1),  # spec 2 -> 1, all at min at once
    sample(40, 0, 1, 1),
]


# --------------------------------------------------------------------------- settings, workload


def test_working_set_per_replica_is_capacity_times_target_and_never_zero() -> None:
    assert Settings().working_set_per_replica == 16_000  # 20,000 x 0.8
    assert S.working_set_per_replica == 500
    assert Settings(kv_capacity_tokens=1, target_cache_pressure=0.1).working_set_per_replica == 1


def test_tenants_grow_linearly_over_the_ramp_and_then_hold() -> None:
    s = Settings(prompts_start=2, prompts_end=12, ramp_s=100.0)
    assert tenants_at(s, -5) == 2
    assert tenants_at(s, 0) == 2
    assert tenants_at(s, 50) == 7
    assert tenants_at(s, 73) == 2 + round(10 * 0.73)
    assert tenants_at(s, 100) == 12
    assert tenants_at(s, 1000) == 12
    assert tenants_at(dataclasses.replace(s, ramp_s=0), 0) == 12


def test_the_growing_workload_only_uses_tenants_introduced_so_far() -> None:
    s = Settings(rate=2.0, ramp_s=20.0, hold_s=10.0, prompts_start=2, prompts_end=8,
                 prompt_tokens=40, seed=3)  # fmt: skip
    w = growing_workload(s)
    assert len(w.sessions) == int(2.0 * 30 * 1.3) + 20
    assert w.working_set_tokens == 8 * 40
    for k, sess in enumerate(w.sessions):
        i = int(sess.group.removeprefix("t"))
        assert i < tenants_at(s, k / s.rate), (k, sess.group)
        assert sess.system is not None and sess.system.startswith(f"[tenant {i} system prompt] ")
        assert len(sess.turns) == 1 and 16 <= sess.turns[0].max_tokens <= 32
    # The same tenant always sends the same system prompt: a shared prefix.
    by_group: dict[str, set[str | None]] = {}
    for sess in w.sessions:
        by_group.setdefault(sess.group, set()).add(sess.system)
    assert all(len(v) == 1 for v in by_group.values())
    # Early on only the first tenants; by the end of the ramp more than those.
    assert {x.group for x in w.sessions[:2]} <= {"t0", "t1"}
    assert len({x.group for x in w.sessions[40:]}) > 2
    # Seeded: the same settings give the same requests.
    again = growing_workload(s)
    assert [(x.group, x.turns[0].user) for x in again.sessions] == [
        (x.group, x.turns[0].user) for x in w.sessions
    ]
    other = growing_workload(dataclasses.replace(s, seed=4))
    assert [x.turns[0].user for x in other.sessions] != [x.turns[0].user for x in w.sessions]


# --------------------------------------------------------------------------- the manifest


def test_model_manifest_carries_the_settings() -> None:
    s = dataclasses.replace(S, target_load=3.0, scale_down_stabilization_s=45)
    m = model_manifest(s, "redis://127.0.0.1:6390/0")
    assert m["kind"] == "PrefixRoutedModel"
    assert m["metadata"] == {"name": NAME, "namespace": NAMESPACE}
    spec = m["spec"]
    assert (spec["replicas"], spec["minReplicas"], spec["maxReplicas"]) == (1, 1, 4)
    assert spec["router"] == {"kvCapacityTokens": 1000}
    assert spec["engine"]["type"] == "custom"  # byte blocks, as the simulators key them
    assert spec["cacheStore"] == {"type": "external", "url": "redis://127.0.0.1:6390/0"}
    assert spec["autoscaling"] == {
        "enabled": True,
        "targetCachePressure": 0.5,
        "targetLoad": 3.0,
        "scaleDownStabilizationSeconds": 45,
    }


def test_the_benchmark_reads_what_the_operators_hpa_reads() -> None:
    # The metric the samples plot is the one (name and selector) the HPA rendered for the
    # manifest scales on, and its per-replica target is the one the samples divide by.
    hpa = horizontal_pod_autoscaler(
        Model.from_body({**model_manifest(Settings(), "redis://r:6379/0"), "metadata": {
            "name": NAME, "namespace": NAMESPACE, "uid": "u", "generation": 1}}),
        OperatorConfig(),
    )
    (ext,) = [m["external"] for m in hpa["spec"]["metrics"]
              if m["external"]["metric"]["name"] == WORKING_SET_METRIC]  # fmt: skip
    url = urlsplit(METRIC_PATH)
    assert url.path == f"/apis/external.metrics.k8s.io/v1beta1/namespaces/{NAMESPACE}/" + (
        WORKING_SET_METRIC
    )
    selector = parse_qs(url.query)["labelSelector"][0]
    assert dict(kv.split("=") for kv in selector.split(",")) == ext["metric"]["selector"][
        "matchLabels"
    ]
    assert float(ext["target"]["averageValue"]) == Settings().working_set_per_replica


# --------------------------------------------------------------------------- samples


def test_derived_pressure_is_per_ready_replica_and_needed_is_per_target() -> None:
    assert derived({"working_set_tokens": 1500, "ready_replicas": 2}, S) == {
        "cache_pressure": 0.75,  # 1500 / (2 x 1000)
        "needed_replicas": 3.0,  # 1500 / 500
    }
    assert derived({"working_set_tokens": 1000, "ready_replicas": 3}, S) == {
        "cache_pressure": 0.333,
        "needed_replicas": 2.0,
    }
    # No Ready replica: no pressure to speak of, but the HPA's ratio still is.
    assert derived({"working_set_tokens": 700, "ready_replicas": 0}, S) == {
        "cache_pressure": None,
        "needed_replicas": 1.4,
    }
    assert derived({"working_set_tokens": 700}, S)["cache_pressure"] is None
    # No metric (stale or missing): neither.
    assert derived({"working_set_tokens": None, "ready_replicas": 2}, S) == {
        "cache_pressure": None,
        "needed_replicas": None,
    }


def test_scale_events_with_when_each_was_ready() -> None:
    assert scale_events(RUN) == [
        {"t": 8, "from": 1, "to": 2, "ready_after_s": 2},
        {"t": 12, "from": 2, "to": 3, "ready_after_s": 0},
        {"t": 32, "from": 3, "to": 2, "ready_after_s": 4},
        {"t": 38, "from": 2, "to": 1, "ready_after_s": 0},
    ]


def test_scale_events_skip_missing_reads_and_note_never_ready() -> None:
    xs = [
        sample(0, 0, 1, 1),
        sample(2, 0, None, 1),  # a failed read: neither a change nor a reset
        sample(4, 0, 1, 1),
        sample(6, 0, 2, 1),  # never all Ready before spec moves on
        sample(8, 0, 3, 1),
        sample(10, 0, None, 3),  # a failed read does not end the wait
        sample(12, 0, 3, 3),
    ]
    assert scale_events(xs) == [
        {"t": 6, "from": 1, "to": 2, "ready_after_s": None},
        {"t": 8, "from": 2, "to": 3, "ready_after_s": 4},
    ]
    assert scale_events([]) == []


def test_the_summary_of_a_run() -> None:
    m = summarize(RUN, S, LOAD_START, LOAD_STOP)
    assert m.pop("scale_events") == scale_events(RUN)
    assert m == {
        "peak_working_set_tokens": 1400,
        "peak_cache_pressure": 0.9,  # t=8: 900 tokens on the one Ready replica
        "max_spec_replicas": 3,
        # Up: over 0.5 x 1.1 at t=6 (t=4's 0.52 and t=10's 0.55 are not), spec 2 at t=8.
        "pressure_over_target_at_s": 6,
        "first_scale_up_at_s": 8,
        "seconds_to_first_scale_up": 2,
        # Down: all at 1 first at t=38.
        "load_stopped_at_s": 20,
        "back_to_min_at_s": 38,
        "seconds_load_stop_to_min": 18,
    }


def test_the_summary_counts_only_what_it_should() -> None:
    # Pressure over the target before the load started is not the load's doing; a scale-up
    # before the pressure went over it is not an answer to it.
    xs = [
        sample(0, 900, 1, 1),  # pressure 0.9 before the load
        sample(4, 400, 1, 1),
        sample(6, 700, 1, 1),  # 0.7: over 0.55
        sample(8, 700, 2, 2),
        sample(10, 300, 1, 1),
        sample(12, 300, 1, 1),
    ]
    m = summarize(xs, S, 4.0, 12.0)
    assert m["pressure_over_target_at_s"] == 6
    assert m["first_scale_up_at_s"] == 8 and m["seconds_to_first_scale_up"] == 2
    assert m["back_to_min_at_s"] == 12 and m["seconds_load_stop_to_min"] == 0
    early = [sample(4, 0, 2, 2), sample(6, 700, 2, 1)]  # up at 4, over only at 6
    assert summarize(early, S, 0.0, 10.0)["seconds_to_first_scale_up"] is None
    assert summarize([sample(0, 0, 1, 1), *early], S, 0.0, 10.0)["first_scale_up_at_s"] == 4


def test_the_summary_of_no_samples() -> None:
    m = summarize([], S, 0.0, 10.0)
    assert m["scale_events"] == []
    assert m["peak_working_set_tokens"] is None and m["peak_cache_pressure"] is None
    assert m["max_spec_replicas"] is None
    assert m["first_scale_up_at_s"] is None and m["back_to_min_at_s"] is None
    assert m["seconds_load_stop_to_min"] is None
