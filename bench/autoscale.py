"""`python -m bench autoscale`: cache pressure drives the real HPA, end to end (issue 6).

One run, all real processes on this machine:
- the local control plane (e2e/cluster/controlplane.py: etcd, kube-apiserver,
  kube-controller-manager with its HPA controller, kube-scheduler, kwok fake GPU nodes);
- `prefix-operator` watching one namespace and `prefix-metrics-adapter` behind
  kube-apiserver's aggregation layer (e2e/cluster/processes.py, as the tests run them);
- one redis-server: the PrefixRoutedModel's external cache store;
- `prefix-router` processes started with the router.yaml the operator rendered into the
  model's ConfigMap (store redis, model key <ns>/<name>, block size, KV capacity), except for
  discovery: kwok pod IPs are not reachable, so the routers read a backends file instead;
- one engine-sim per possible model-server replica. The i-th Ready kwok model-server pod stands
  for the i-th simulator: each sample rewrites the routers' backends file with as many
  simulators as there are Ready pods, as the routers' Kubernetes discovery would follow the
  model-server Service's ready endpoints.

Load goes through the routers with a working set that grows: tenant system prompts are added
over the ramp, each request picks one of those introduced so far. The routers publish the
working set they see in the shared store; the adapter serves it; the HPA asks for
ceil(working set / (kvCapacityTokens x targetCachePressure)) replicas and scales the
PrefixRoutedModel; the operator scales the model-server Deployment; kwok makes the pods Ready;
the operator writes status. Then the load stops: the working-set window empties and the HPA
scales down after the CR's stabilisation window.

Every ~2 s a sample: the metric values as the aggregator serves them, the HPA's status, the
model's spec.replicas and status, the Ready pods, the simulators' hit rate. Written to
bench/results/autoscale/: autoscale.json, autoscale.png and README.md (all numbers in the
README come from the JSON).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import random
import shutil
import sys
import textwrap
import time
import urllib.parse
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from prefix_router.redis_store import WS_WINDOW_S

from .fleet import Fleet, free_port
from .loadgen import run_load
from .run import MODEL, fetch_stats
from .workloads import Session, Turn, Workload, text

REPO = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).parent / "results" / "autoscale"
CRD = REPO / "crds" / "prefixroutedmodel.yaml"
NAMESPACE = "autoscale"
NAME = "chat"
GV = "external.metrics.k8s.io/v1beta1"
WORKING_SET_METRIC = "prefixrouter_working_set_tokens"
IN_FLIGHT_METRIC = "prefixrouter_in_flight"
MODEL_SERVER_SELECTOR = f"prefixrouter.io/model={NAME},app.kubernetes.io/component=model-server"
# The HPA does nothing while |usage / target - 1| <= 0.1 (kube-controller-manager's default
# --horizontal-pod-autoscaler-tolerance): "above target" that the HPA must act on means beyond it.
HPA_TOLERANCE = 0.1
HIT_RATE_SAMPLES = 5


@dataclass(frozen=True)
class Settings:
    # The PrefixRoutedModel: per-replica KV capacity and targets, small so that a working set a
    # 2-core host can generate needs several replicas.
    kv_capacity_tokens: int = 20_000
    target_cache_pressure: float = 0.8
    target_load: float = 8.0
    min_replicas: int = 1
    max_replicas: int = 6
    scale_down_stabilization_s: int = 30
    # The load: `rate` requests/s for ramp + hold seconds; tenants' system prompts go from
    # prompts_start to prompts_end over the ramp.
    rate: float = 4.0
    ramp_s: float = 120.0
    hold_s: float = 30.0
    prompts_start: int = 2
    prompts_end: int = 44
    prompt_tokens: int = 1500
    routers: int = 2
    sample_s: float = 2.0
    # After the load: give up waiting for the way back to minReplicas after this long.
    settle_timeout_s: float = 180.0
    seed: int = 11

    @property
    def working_set_per_replica(self) -> float:
        """The HPA's AverageValue target for the working-set metric (as the operator renders)."""
        return max(1, round(self.kv_capacity_tokens * self.target_cache_pressure))


# --------------------------------------------------------------------------- workload


def growing_workload(s: Settings) -> Workload:
    """Single-turn requests whose distinct prefixes grow over the ramp.

    Session k is sent at about k / rate seconds; it picks uniformly among the tenants
    introduced by then, so every tenant stays hot once introduced and the working set (the
    window's distinct blocks) grows with the tenant count. User turns are short (24-40 tokens)
    so that the unique part of each prompt adds little next to the shared prompts."""
    rng = random.Random(s.seed)
    prompts = [f"[tenant {i} system prompt] " + text(rng, s.prompt_tokens)
               for i in range(s.prompts_end)]
    count = int(s.rate * (s.ramp_s + s.hold_s) * 1.3) + 20
    sessions = []
    for k in range(count):
        t = k / s.rate
        n = tenants_at(s, t)
        i = rng.randrange(n)
        sessions.append(Session(prompts[i], [Turn(text(rng, rng.randint(24, 40)),
                                                  rng.randint(16, 32))], f"t{i}"))
    return Workload("growing-tenants", sessions, s.prompts_end * s.prompt_tokens,
                    f"{s.prompts_start} -> {s.prompts_end} tenant prompts over {s.ramp_s:g} s")


def tenants_at(s: Settings, t: float) -> int:
    """Tenants introduced by `t` seconds into the load."""
    frac = min(1.0, max(0.0, t / s.ramp_s)) if s.ramp_s > 0 else 1.0
    return s.prompts_start + round((s.prompts_end - s.prompts_start) * frac)


# --------------------------------------------------------------------------- pure helpers

_SUFFIX = {"m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12,
           "Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40}


def quantity(q: str | int | float | None) -> float | None:
    """A Kubernetes quantity ("80k", "1500m", "45000", "1.5e3") as a float."""
    if q is None:
        return None
    if isinstance(q, int | float):
        return float(q)
    q = q.strip()
    for suffix in ("Ki", "Mi", "Gi", "Ti", "m", "k", "M", "G", "T"):
        if q.endswith(suffix):
            return float(q[: -len(suffix)]) * _SUFFIX[suffix]
    return float(q)


def condition(obj: dict[str, Any] | None, type_: str) -> dict[str, Any]:
    for c in ((obj or {}).get("status") or {}).get("conditions") or []:
        if c.get("type") == type_:
            return c
    return {}


def derived(sample: dict[str, Any], s: Settings) -> dict[str, Any]:
    """What a raw sample means for the capacity model.

    cache_pressure: working set / (Ready replicas x kvCapacityTokens), the figure the HPA
    target is a fraction of (DESIGN.md). needed_replicas: working set / (kvCapacityTokens x
    targetCachePressure), the ratio the HPA takes the ceiling of."""
    ws = sample.get("working_set_tokens")
    ready = sample.get("ready_pods") or 0
    out: dict[str, Any] = {"cache_pressure": None, "needed_replicas": None}
    if ws is not None:
        out["needed_replicas"] = round(ws / s.working_set_per_replica, 3)
        if ready > 0:
            out["cache_pressure"] = round(ws / (ready * s.kv_capacity_tokens), 3)
    return out


def _first(samples: list[dict[str, Any]], pred: Any, after: float = -math.inf) -> float | None:
    for x in samples:
        if x["t"] >= after and pred(x):
            return x["t"]
    return None


def scale_events(samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each change of the model's spec.replicas (what the HPA wrote through the scale
    subresource), with when its pods were all Ready and the status said so."""
    events = []
    prev = None
    for i, x in enumerate(samples):
        n = x.get("spec_replicas")
        if n is None:
            continue
        if prev is not None and n != prev:
            ready_t = None
            for y in samples[i:]:
                if y.get("spec_replicas") != n:
                    break
                if y.get("ready_pods") == n and y.get("status_ready_replicas") == n:
                    ready_t = y["t"]
                    break
            events.append({"t": x["t"], "from": prev, "to": n, "ready_t": ready_t,
                           "ready_after_s": None if ready_t is None
                           else round(ready_t - x["t"], 1)})
        prev = n
    return events


def back_at_min(samples: list[dict[str, Any]], load_stop: float, min_replicas: int) -> bool:
    """Two samples in a row after the load with everything at minReplicas."""
    tail = [x for x in samples if x["t"] > load_stop][-2:]
    return len(tail) == 2 and all(
        x["spec_replicas"] == min_replicas
        and x["ready_pods"] == min_replicas
        and x["status_ready_replicas"] == min_replicas
        and x["hpa_desired"] == min_replicas
        for x in tail
    )


def summarize(samples: list[dict[str, Any]], s: Settings, load_start: float,
              load_stop: float) -> dict[str, Any]:
    """The run's numbers, from the samples alone."""

    def r1(v: float | None) -> float | None:
        return None if v is None else round(v, 1)

    pressures = [x["cache_pressure"] for x in samples if x.get("cache_pressure") is not None]
    wss = [x["working_set_tokens"] for x in samples if x.get("working_set_tokens") is not None]
    events = scale_events(samples)
    ups = [e for e in events if e["to"] > e["from"]]
    downs = [e for e in events if e["to"] < e["from"] and e["t"] >= load_stop]
    over = _first(samples, lambda x: (x.get("cache_pressure") or 0)
                  > s.target_cache_pressure * (1 + HPA_TOLERANCE), load_start)
    first_up = ups[0]["t"] if ups else None
    peak_spec = max((x.get("spec_replicas") or 0 for x in samples), default=0)
    peak_at = _first(samples, lambda x: x.get("spec_replicas") == peak_spec)
    peak_ready = _first(samples, lambda x: x.get("ready_pods") == peak_spec
                        and x.get("status_ready_replicas") == peak_spec,
                        peak_at if peak_at is not None else 0)
    # After the load: when the working set first asked for fewer replicas than the model had
    # (the HPA's own arithmetic, tolerance included), and when the HPA acted on it.
    asks_fewer = _first(samples, lambda x: x.get("needed_replicas") is not None
                        and x.get("spec_replicas") is not None
                        and x["needed_replicas"] < x["spec_replicas"] * (1 - HPA_TOLERANCE)
                        and math.ceil(x["needed_replicas"]) < x["spec_replicas"], load_stop)
    first_down = downs[0]["t"] if downs else None
    # The HPA scales down once every recommendation inside its stabilisation window asks for
    # fewer: the last sample that still asked for the current count starts that window (to
    # within the HPA's 5 s sync and our 2 s samples).
    last_as_many = None
    if first_down is not None:
        for x in samples:
            if load_stop <= x["t"] < first_down and x.get("needed_replicas") is not None \
                    and not (x["needed_replicas"] < x["spec_replicas"] * (1 - HPA_TOLERANCE)
                             and math.ceil(x["needed_replicas"]) < x["spec_replicas"]):
                last_as_many = x["t"]
    # Each step down, after the first sample whose working set asked for that count or fewer.
    down_lags = []
    for e in downs:
        asked = _first(samples, lambda x, to=e["to"]: x.get("needed_replicas") is not None
                       and max(s.min_replicas, math.ceil(x["needed_replicas"])) <= to,
                       load_stop)
        if asked is not None and asked <= e["t"]:
            down_lags.append(round(e["t"] - asked, 1))
    at_min = _first(samples, lambda x: x.get("spec_replicas") == s.min_replicas
                    and x.get("ready_pods") == s.min_replicas
                    and x.get("status_ready_replicas") == s.min_replicas, load_stop)
    ready_lags = [e["ready_after_s"] for e in events if e["ready_after_s"] is not None]
    hpa_desired = [x.get("hpa_desired") or 0 for x in samples]
    return {
        "samples": len(samples),
        "peak_working_set_tokens": max(wss, default=None),
        "peak_cache_pressure": max(pressures, default=None),
        "peak_needed_replicas": max((x["needed_replicas"] for x in samples
                                     if x.get("needed_replicas") is not None), default=None),
        "max_hpa_desired_replicas": max(hpa_desired, default=0),
        "max_spec_replicas": peak_spec,
        "max_ready_pods": max((x.get("ready_pods") or 0 for x in samples), default=0),
        "pressure_over_target_at_s": r1(over),
        "first_scale_up_at_s": r1(first_up),
        "seconds_to_first_scale_up": r1(first_up - over) if over is not None
        and first_up is not None and first_up >= over else None,
        "peak_replicas_ready_at_s": r1(peak_ready),
        "seconds_load_start_to_peak_ready": r1(peak_ready - load_start)
        if peak_ready is not None else None,
        "scale_up_steps": len(ups),
        "mean_seconds_spec_to_ready": round(sum(ready_lags) / len(ready_lags), 1)
        if ready_lags else None,
        "load_stopped_at_s": r1(load_stop),
        "working_set_asks_fewer_at_s": r1(asks_fewer),
        "first_scale_down_at_s": r1(first_down),
        "seconds_metric_to_scale_down": r1(first_down - asks_fewer)
        if first_down is not None and asks_fewer is not None else None,
        "working_set_last_asked_as_many_at_s": r1(last_as_many),
        "seconds_last_as_many_to_scale_down": r1(first_down - last_as_many)
        if first_down is not None and last_as_many is not None else None,
        "scale_down_steps": len(downs),
        "seconds_metric_to_each_step_down": down_lags,
        "back_to_min_at_s": r1(at_min),
        "seconds_load_stop_to_min": r1(at_min - load_stop) if at_min is not None else None,
        "scale_events": events,
    }


# --------------------------------------------------------------------------- the cluster side


def _cluster_modules() -> tuple[Any, Any]:
    """e2e/cluster/controlplane.py and processes.py are plain modules (see their docstrings)."""
    path = str(REPO / "e2e" / "cluster")
    if path not in sys.path:
        sys.path.insert(0, path)
    import controlplane
    import processes

    return controlplane, processes


def model_manifest(s: Settings, redis_url: str) -> dict[str, Any]:
    return {
        "apiVersion": "prefixrouter.io/v1alpha1", "kind": "PrefixRoutedModel",
        "metadata": {"name": NAME, "namespace": NAMESPACE},
        "spec": {
            "replicas": s.min_replicas, "minReplicas": s.min_replicas,
            "maxReplicas": s.max_replicas,
            "model": {"name": MODEL, "source": "meta-llama/Llama-3.1-70B-Instruct"},
            "router": {"kvCapacityTokens": s.kv_capacity_tokens},
            "cacheStore": {"type": "external", "url": redis_url},
            "autoscaling": {"enabled": True, "targetCachePressure": s.target_cache_pressure,
                            "targetLoad": s.target_load,
                            "scaleDownStabilizationSeconds": s.scale_down_stabilization_s},
        },
    }


class Cluster:
    """The control plane plus our operator and adapter, and typed reads of what we sample.

    Reads go straight to kube-apiserver over HTTPS (cp.request), the same paths `kubectl get
    --raw` would use, without a kubectl process per read on a 2-core host."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.cp: Any = None
        self.operator: Any = None
        self.adapter: Any = None

    def start(self) -> None:
        controlplane, processes = _cluster_modules()
        bin_dir = controlplane.ensure_binaries(build=False)
        self.cp = controlplane.ControlPlane(bin_dir, self.work / "controlplane")
        self.cp.start()
        print(f"  control plane up in {self.cp.startup_seconds:.1f} s ({self.cp.server})",
              flush=True)
        self.cp.kubectl("apply", "--server-side", "--force-conflicts",
                        "--field-manager=bench", "-f", str(CRD))
        self.cp.kubectl("wait", "--for=condition=Established", "--timeout=30s",
                        "crd/prefixroutedmodels.prefixrouter.io")
        self.cp.kubectl("create", "namespace", NAMESPACE)
        self.cp.wait_for(lambda: self.cp.kubectl("get", "serviceaccount", "default", "-n",
                                                 NAMESPACE, check=False).returncode == 0,
                         30, "the default ServiceAccount")
        # The adapter's production default staleness (60 s): the routers publish every second.
        self.adapter = processes.MetricsAdapter(self.cp, self.work / "adapter", stale_after=60)
        self.adapter.start()
        self.adapter.register()
        self.operator = processes.Operator(self.cp, NAMESPACE, self.work / "operator")
        self.operator.start()

    def stop(self) -> None:
        for part in (self.operator, self.adapter, self.cp):
            if part is not None:
                with contextlib.suppress(Exception):
                    part.stop()

    def get(self, path: str) -> dict[str, Any] | None:
        try:
            return self.cp.request("GET", path, timeout=5)
        except Exception:  # a missing or failing read is a gap in the series, not an end
            return None

    def model(self) -> dict[str, Any] | None:
        return self.get(f"/apis/prefixrouter.io/v1alpha1/namespaces/{NAMESPACE}/"
                        f"prefixroutedmodels/{NAME}")

    def hpa(self) -> dict[str, Any] | None:
        return self.get(f"/apis/autoscaling/v2/namespaces/{NAMESPACE}/"
                        f"horizontalpodautoscalers/{NAME}")

    def metric(self, name: str, selector: str) -> float | None:
        """The value the aggregator serves (through kube-apiserver to our adapter) for the
        HPA's own selector; None when it serves no item (stale or missing figures)."""
        out = self.get(f"/apis/{GV}/namespaces/{NAMESPACE}/{name}?labelSelector="
                       + urllib.parse.quote(selector))
        items = (out or {}).get("items") or []
        return sum(quantity(i["value"]) or 0.0 for i in items) if items else None

    def ready_pods(self) -> tuple[int, int]:
        """(Ready, all not being deleted) model-server pods."""
        out = self.get(f"/api/v1/namespaces/{NAMESPACE}/pods?labelSelector="
                       + urllib.parse.quote(MODEL_SERVER_SELECTOR)) or {}
        live = [p for p in out.get("items") or [] if not p["metadata"].get("deletionTimestamp")]
        ready = [p for p in live if condition(p, "Ready").get("status") == "True"]
        return len(ready), len(live)

    def router_config(self) -> dict[str, Any]:
        cm = self.get(f"/api/v1/namespaces/{NAMESPACE}/configmaps/{NAME}-router")
        if not cm:
            raise RuntimeError("the operator did not create the router ConfigMap")
        return yaml.safe_load(cm["data"]["router.yaml"])


def hpa_selector(hpa: dict[str, Any], metric: str) -> str:
    for m in hpa["spec"]["metrics"]:
        ext = m.get("external") or {}
        if ext.get("metric", {}).get("name") == metric:
            labels = ext["metric"]["selector"]["matchLabels"]
            return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
    raise KeyError(metric)


def hpa_current(hpa: dict[str, Any] | None, metric: str) -> float | None:
    """The HPA's own last reading of a metric (status.currentMetrics, per replica)."""
    for m in ((hpa or {}).get("status") or {}).get("currentMetrics") or []:
        ext = m.get("external") or {}
        if ext.get("metric", {}).get("name") == metric:
            cur = ext.get("current") or {}
            return quantity(cur.get("averageValue") or cur.get("value"))
    return None


# --------------------------------------------------------------------------- the run


async def _run(s: Settings, cluster: Cluster, log_dir: Path) -> dict[str, Any]:
    cp = cluster.cp
    async with Fleet(log_dir / "fleet") as fleet:
        redis_url = await fleet.start_redis()
        cp.apply(model_manifest(s, redis_url))
        print("  model applied; waiting for Ready and the HPA", flush=True)

        def ready() -> dict[str, Any] | None:
            obj = cluster.model()
            return obj if condition(obj, "Ready").get("status") == "True" else None

        await asyncio.to_thread(cp.wait_for, ready, 90, "the model Ready", 0.5)
        hpa = await asyncio.to_thread(cp.wait_for, cluster.hpa, 30, "the operator's HPA", 0.5)
        selectors = {m: hpa_selector(hpa, m) for m in (WORKING_SET_METRIC, IN_FLIGHT_METRIC)}

        # The routers: the operator's router.yaml, discovery swapped for a file (see above).
        config = cluster.router_config()
        assert config["store"]["mode"] == "redis" and config["model_key"] == \
            f"{NAMESPACE}/{NAME}", config
        sims = [(await fleet.start_sim(f"sim{i}", model=MODEL,
                                       kv_capacity=s.kv_capacity_tokens,
                                       profile="llama-3.1-70b-h100", time_scale=1.0)).url
                for i in range(s.max_replicas)]
        backends = log_dir / "backends"
        backends.write_text(sims[0] + "\n")
        routers = []
        for i in range(s.routers):
            port = free_port()
            cfg = {**config, "host": "127.0.0.1", "port": port, "log_level": "warning",
                   "discovery": {"mode": "file", "file": str(backends)}}
            path = log_dir / f"router{i}.yaml"
            path.write_text(yaml.safe_dump(cfg, sort_keys=True))
            routers.append(await fleet.start(
                f"router{i}", [sys.executable, "-m", "prefix_router", "--config", str(path)],
                port, "/readyz"))

        # The HPA acts once kube-controller-manager knows the CRD's scale subresource and our
        # metrics have values (the idle routers publish zeros): wait for that before the load,
        # so that the scale-up timing is the loop's, not the controller's first discovery.
        t_wait = time.monotonic()
        await asyncio.to_thread(
            cp.wait_for, lambda: condition(cluster.hpa(), "ScalingActive").get("status")
            == "True", 120, "the HPA's ScalingActive=True", 1.0)
        hpa_wait = round(time.monotonic() - t_wait, 1)
        print(f"  HPA active after {hpa_wait} s; starting the load", flush=True)

        samples: list[dict[str, Any]] = []
        t0 = time.monotonic()
        marks: dict[str, float] = {}
        last_stats: dict[str, tuple[int, int]] = {}
        deltas: list[tuple[int, int]] = []  # (prompt, cached) tokens of the sims per sample
        serving = 1

        async def sample() -> dict[str, Any]:
            nonlocal serving, last_stats
            t = round(time.monotonic() - t0, 1)
            ws, inflight, h, m, pods = await asyncio.gather(
                asyncio.to_thread(cluster.metric, WORKING_SET_METRIC,
                                  selectors[WORKING_SET_METRIC]),
                asyncio.to_thread(cluster.metric, IN_FLIGHT_METRIC, selectors[IN_FLIGHT_METRIC]),
                asyncio.to_thread(cluster.hpa), asyncio.to_thread(cluster.model),
                asyncio.to_thread(cluster.ready_pods))
            # The routers follow the Ready pods: the i-th Ready pod is the i-th simulator.
            want = max(1, min(pods[0], len(sims)))
            if want != serving:
                # whole-file replace: a router re-reading it never sees half a list
                tmp = backends.with_suffix(".tmp")
                tmp.write_text("".join(u + "\n" for u in sims[:want]))
                tmp.replace(backends)
                serving = want
            stats = dict(zip(sims, await fetch_stats(sims), strict=True))
            deltas.append((sum(st["prompt_tokens"] - last_stats.get(u, (0, 0))[0]
                               for u, st in stats.items()),
                           sum(st["cached_tokens"] - last_stats.get(u, (0, 0))[1]
                               for u, st in stats.items())))
            last_stats = {u: (st["prompt_tokens"], st["cached_tokens"])
                          for u, st in stats.items()}
            # over the last HIT_RATE_SAMPLES samples: one 2 s sample holds a handful of requests
            prompt = sum(d[0] for d in deltas[-HIT_RATE_SAMPLES:])
            cached = sum(d[1] for d in deltas[-HIT_RATE_SAMPLES:])
            hs = (h or {}).get("status") or {}
            routing = ((m or {}).get("status") or {}).get("routing") or {}
            x: dict[str, Any] = {
                "t": t, "utc": datetime.now(UTC).strftime("%H:%M:%S"),
                "working_set_tokens": ws, "in_flight": inflight,
                "hpa_current_ws_per_replica": hpa_current(h, WORKING_SET_METRIC),
                "hpa_desired": hs.get("desiredReplicas"), "hpa_current": hs.get("currentReplicas"),
                "hpa_scaling_active": condition(h, "ScalingActive").get("reason"),
                "spec_replicas": ((m or {}).get("spec") or {}).get("replicas"),
                "status_ready_replicas": ((m or {}).get("status") or {}).get("readyReplicas"),
                "status_cache_pressure": routing.get("cachePressure"),
                "ready_pods": pods[0], "pods": pods[1], "sims_serving": serving,
                "engine_hit_rate": round(cached / prompt, 3) if prompt > 0 else None,
                "tenants": tenants_at(s, t - marks["load_start"]) if "load_start" in marks
                and "load_stop" not in marks else None,
            }
            x.update(derived(x, s))
            return x

        async def sampler(stop: asyncio.Event) -> None:
            next_at = time.monotonic()
            while not stop.is_set():
                x = await sample()
                samples.append(x)
                if "load_stop" in marks and back_at_min(
                    samples, marks["load_stop"], s.min_replicas
                ):
                    settled.set()
                if len(samples) % 5 == 1:
                    print(f"  t={x['t']:6.1f}s ws={x['working_set_tokens']} "
                          f"needed={x['needed_replicas']} hpa={x['hpa_desired']} "
                          f"spec={x['spec_replicas']} ready={x['ready_pods']} "
                          f"pressure={x['cache_pressure']} hit={x['engine_hit_rate']}",
                          flush=True)
                next_at += s.sample_s
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), max(0.0, next_at - time.monotonic()))

        stop, settled = asyncio.Event(), asyncio.Event()
        task = asyncio.create_task(sampler(stop))
        await asyncio.sleep(3 * s.sample_s)  # a few idle samples first
        marks["load_start"] = round(time.monotonic() - t0, 1)
        log = await run_load(growing_workload(s), [r.url for r in routers], MODEL, s.rate,
                             s.ramp_s + s.hold_s, seed=s.seed, progress=False)
        marks["load_stop"] = round(time.monotonic() - t0, 1)
        print(f"  load stopped at t={marks['load_stop']} s; waiting for the scale-down",
              flush=True)

        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(settled.wait(), s.settle_timeout_s)
        stop.set()
        await task
        ok = [r for r in log.results if r.ok]
        return {
            "hpa_active_wait_s": hpa_wait,
            "load_start_s": marks["load_start"], "load_stop_s": marks["load_stop"],
            "requests": len(log.results), "failed_requests": len(log.results) - len(ok),
            "router_config": {k: config[k] for k in ("model_key", "block_size",
                                                       "kv_capacity_tokens", "store")},
            "samples": samples,
        }


def main(s: Settings | None = None, out: Path = RESULTS) -> dict[str, Any]:
    s = s or Settings()
    log_dir = REPO / "bench" / ".logs" / f"autoscale-{int(time.time())}"
    shutil.rmtree(log_dir, ignore_errors=True)
    log_dir.mkdir(parents=True)
    started = time.monotonic()
    cluster = Cluster(log_dir)
    print(f"autoscale: logs in {log_dir}", flush=True)
    try:
        cluster.start()
        run = asyncio.run(_run(s, cluster, log_dir))
        hpa = cluster.hpa() or {}
    finally:
        cluster.stop()
    wall = round(time.monotonic() - started, 1)
    result = {
        "command": command_line(s),
        "date_utc": datetime.now(UTC).strftime("%Y-%m-%d %H:%M"),
        "settings": asdict(s),
        "working_set_per_replica": s.working_set_per_replica,
        "hpa_sync_period_s": 5,
        "working_set_window_s": WS_WINDOW_S,
        "hpa_behavior": (hpa.get("spec") or {}).get("behavior"),
        "wall_clock_s": wall,
        **{k: v for k, v in run.items() if k != "samples"},
        "summary": summarize(run["samples"], s, run["load_start_s"], run["load_stop_s"]),
        "samples": run["samples"],
    }
    write_outputs(result, out)
    return result


def write_outputs(result: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "autoscale.json").write_text(json.dumps(result, indent=1) + "\n")
    plot(result, out / "autoscale.png")
    (out / "README.md").write_text(readme(result))


def rebuild(out: Path = RESULTS) -> dict[str, Any]:
    """Recompute the summary, the plot and the README from a run's autoscale.json (no run)."""
    r = json.loads((out / "autoscale.json").read_text())
    s = Settings(**r["settings"])
    samples = r.pop("samples")
    r["summary"] = summarize(samples, s, r["load_start_s"], r["load_stop_s"])
    r["samples"] = samples
    write_outputs(r, out)
    return r


def command_line(s: Settings) -> str:
    d = Settings()
    flags = []
    for field, flag in (("rate", "--rate"), ("ramp_s", "--ramp-seconds"),
                        ("hold_s", "--hold-seconds"),
                        ("scale_down_stabilization_s", "--stabilization-seconds"),
                        ("max_replicas", "--max-replicas")):
        if getattr(s, field) != getattr(d, field):
            flags.append(f"{flag} {getattr(s, field):g}")
    return " ".join([".venv/bin/python -m bench autoscale", *flags])


# --------------------------------------------------------------------------- outputs


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = result["settings"]
    xs = result["samples"]
    t = [x["t"] for x in xs]
    fig, (top, mid, low) = plt.subplots(3, 1, figsize=(10, 9), sharex=True,
                                        height_ratios=[3, 2, 1.3])
    for ax in (top, mid, low):
        ax.axvspan(result["load_start_s"], result["load_stop_s"], color="0.93", zorder=0)
        ax.grid(alpha=0.3)
    top.plot(t, [x["needed_replicas"] for x in xs], color="tab:orange", lw=1.2,
             label="working set / (kvCapacityTokens x targetCachePressure)")
    # wide and pale underneath: where all three agree, the desired count still shows
    top.step(t, [x["hpa_desired"] for x in xs], where="post", color="tab:blue", lw=5,
             alpha=0.35, label="HPA desiredReplicas")
    top.step(t, [x["spec_replicas"] for x in xs], where="post", color="tab:purple", lw=1,
             ls="--", label="PrefixRoutedModel spec.replicas")
    top.step(t, [x["ready_pods"] for x in xs], where="post", color="tab:green", lw=1.5,
             label="Ready model-server pods (kwok)")
    top.axhline(s["max_replicas"], color="0.5", lw=0.8, ls=":", label="maxReplicas")
    top.set_ylabel("replicas")
    top.set_ylim(0, s["max_replicas"] + 0.8)
    top.legend(fontsize=8, loc="upper left")
    mid.plot(t, [x["cache_pressure"] for x in xs], color="tab:red", lw=1.5,
             label="cache pressure = working set / (Ready replicas x kvCapacityTokens)")
    mid.axhline(s["target_cache_pressure"], color="tab:red", ls="--", lw=1,
                label=f"targetCachePressure {s['target_cache_pressure']:g}")
    mid.set_ylabel("cache pressure")
    mid.legend(fontsize=8, loc="upper left")
    low.plot(t, [x["engine_hit_rate"] for x in xs], color="tab:gray", lw=1,
             label=f"simulators' hit rate (prompt tokens from cache, last "
             f"{HIT_RATE_SAMPLES * s['sample_s']:g} s)")
    low.set_ylim(0, 1)
    low.set_ylabel("hit rate")
    low.set_xlabel("seconds (grey band: load through the routers)")
    low.legend(fontsize=8, loc="lower left")
    fig.suptitle(f"HPA on cache pressure: kvCapacityTokens {s['kv_capacity_tokens']:,}, "
                 f"target {s['target_cache_pressure']:g}, {s['rate']:g} req/s, "
                 f"{s['prompts_start']} -> {s['prompts_end']} tenant prompts, "
                 f"scale-down window {s['scale_down_stabilization_s']} s", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _fmt(v: Any, unit: str = "") -> str:
    if v is None:
        return "n/a"
    if isinstance(v, float) and v.is_integer() and abs(v) >= 10:
        v = int(v)
    if isinstance(v, float):
        return f"{v:,.3g}{unit}" if abs(v) < 10 else f"{v:,.1f}{unit}"
    if isinstance(v, int):
        return f"{v:,}{unit}"
    return f"{v}{unit}"


def reflow(md: str, width: int = 96) -> str:
    """Re-wrap the paragraphs and list items of generated Markdown (substituted numbers leave
    ragged lines); headings, images and code blocks stay as they are."""
    out = []
    for block in md.strip("\n").split("\n\n"):
        if block.startswith(("#", "![", "|", "```")):
            out.append(block)
            continue
        items: list[list[str]] = []
        for line in block.splitlines():
            if line.startswith("- ") or not items:
                items.append([line])
            else:
                items[-1].append(line.strip())
        out.append("\n".join(
            textwrap.fill(" ".join(it), width, break_long_words=False, break_on_hyphens=False,
                          subsequent_indent="  " if it[0].startswith("- ") else "")
            for it in items))
    return "\n\n".join(out) + "\n"


def readme(r: dict[str, Any]) -> str:
    return reflow(_readme(r))


def _readme(r: dict[str, Any]) -> str:
    s, m = r["settings"], r["summary"]
    def ready_note(lag: float | None) -> str:
        if lag is None:
            return " (never all Ready)"
        if lag == 0:
            return " (Ready in the same sample)"
        return f" (Ready {lag:g} s later)"

    steps = ", ".join(f"{e['from']}->{e['to']} at {e['t']:g} s" + ready_note(e["ready_after_s"])
                      for e in m["scale_events"])
    return f"""# Autoscaling on cache pressure, end to end

Generated by `{r['command']}` on {r['date_utc']} UTC (bench/autoscale.py writes this file, the
JSON and the plot; every number below comes from `autoscale.json`). Wall clock of the run:
{_fmt(r['wall_clock_s'], ' s')}.

![replicas and cache pressure over time](autoscale.png)

## What ran

All on this host, all real processes: the local control plane (etcd, kube-apiserver,
kube-controller-manager with the real HPA controller at a {r['hpa_sync_period_s']} s sync period,
kube-scheduler, kwok), `prefix-operator` and `prefix-metrics-adapter` (the aggregated
`external.metrics.k8s.io` API, reached by kube-apiserver through an ExternalName Service to
localhost), one redis-server as the model's external cache store, {s['routers']} `prefix-router`
processes started from the `router.yaml` the operator rendered into the model's ConfigMap
(store `{r['router_config']['store']['mode']}`, model key `{r['router_config']['model_key']}`,
block size {r['router_config']['block_size']}, KV capacity
{_fmt(r['router_config']['kv_capacity_tokens'])} tokens), and {s['max_replicas']} engine-sim
processes.

**What is simulated.** The model-server pods the operator scales are kwok pods: kwok marks
them Running and Ready, nothing runs in them. The traffic is served by the local engine-sim
processes. To close the loop anyway, the routers' discovery is a backends file (kwok pod IPs
are unreachable) that the benchmark rewrites at every sample with as many simulators as there
are Ready model-server pods; in a cluster the routers follow the model-server Service's ready
endpoints instead. The point of this run is the control loop, not serving performance.

The model (`{NAMESPACE}/{NAME}`): kvCapacityTokens {_fmt(s['kv_capacity_tokens'])},
targetCachePressure {s['target_cache_pressure']:g} (so the HPA's working-set target is
{_fmt(r['working_set_per_replica'])} tokens per replica), targetLoad {s['target_load']:g},
minReplicas {s['min_replicas']}, maxReplicas {s['max_replicas']},
scaleDownStabilizationSeconds {s['scale_down_stabilization_s']}. The HPA's behavior as created
by the operator: `{json.dumps(r['hpa_behavior'])}`.

Load: {s['rate']:g} requests/s (Poisson) through the routers for {s['ramp_s'] + s['hold_s']:g} s,
single-turn chats of a ~{s['prompt_tokens']:,}-token tenant system prompt plus a 24-40 token user
turn, 16-32 output tokens. The tenant count grows from {s['prompts_start']} to
{s['prompts_end']} over the first {s['ramp_s']:g} s and then holds for {s['hold_s']:g} s; each
request picks a tenant already introduced. The routers count the working set as the distinct
{r['router_config']['block_size']}-token blocks requested over a {r['working_set_window_s']} s
window (HyperLogLogs in Redis), so it keeps its value for up to that long after the load stops
and then empties. {r['requests']:,} requests, {r['failed_requests']} failed.
The benchmark waited {_fmt(r['hpa_active_wait_s'], ' s')} for the HPA's ScalingActive=True
(kube-controller-manager discovering the CRD's scale subresource) before starting the load.

Samples every {s['sample_s']:g} s ({m['samples']} in all): the working set and in-flight values
as the aggregator serves them (`/apis/{GV}/namespaces/{NAMESPACE}/...?labelSelector=` with the
HPA's own selector, through kube-apiserver), the HPA's desired/current replicas, the model's
spec.replicas and status.readyReplicas, Ready kwok model-server pods, the simulators' hit rate
(prompt tokens served from their KV cache over the last {HIT_RATE_SAMPLES * s['sample_s']:g} s).

## What the run showed

- Peak working set {_fmt(m['peak_working_set_tokens'])} tokens: {_fmt(m['peak_needed_replicas'])}
  replicas' worth at the target; peak cache pressure {_fmt(m['peak_cache_pressure'])} (target
  {s['target_cache_pressure']:g}).
- Up: the cache pressure first went over the target by more than the HPA's 10% tolerance at
  {_fmt(m['pressure_over_target_at_s'], ' s')}; the HPA scaled the PrefixRoutedModel up at
  {_fmt(m['first_scale_up_at_s'], ' s')} ({_fmt(m['seconds_to_first_scale_up'], ' s')} later), in
  {m['scale_up_steps']} steps to {m['max_spec_replicas']} replicas (HPA desired at most
  {m['max_hpa_desired_replicas']}, Ready pods at most {m['max_ready_pods']}); all
  {m['max_spec_replicas']} Ready and in the model's status
  {_fmt(m['seconds_load_start_to_peak_ready'], ' s')} after the load started. From a new
  spec.replicas to its pods Ready and status.readyReplicas saying so (operator -> Deployment ->
  kwok -> operator): {_fmt(m['mean_seconds_spec_to_ready'], ' s')} on average (0 = within
  the same {s['sample_s']:g} s sample).
- Down: the load stopped at {_fmt(m['load_stopped_at_s'], ' s')}. The working set stayed up
  while the requests of the last minute were still in its window, and first asked for fewer
  replicas at {_fmt(m['working_set_asks_fewer_at_s'], ' s')}; the last sample still asking for
  {m['max_spec_replicas']} was at {_fmt(m['working_set_last_asked_as_many_at_s'], ' s')}. The
  HPA's first scale-down came at {_fmt(m['first_scale_down_at_s'], ' s')}:
  {_fmt(m['seconds_last_as_many_to_scale_down'], ' s')} after that last sample and
  {_fmt(m['seconds_metric_to_scale_down'], ' s')} after the first lower one. The stabilisation
  window is {s['scale_down_stabilization_s']} s: the HPA scales down once every recommendation
  of the last {s['scale_down_stabilization_s']} s asks for fewer, and it reads the metric every
  {r['hpa_sync_period_s']} s, so the gap to a {s['sample_s']:g} s sample lands within one sync of
  the window. It went down in {m['scale_down_steps']} steps, each
  {', '.join(f'{v:g}' for v in m['seconds_metric_to_each_step_down']) or 'n/a'} s after the
  first sample whose working set asked for that count, following the working set as it emptied
  bucket by bucket; back at {s['min_replicas']} replica, Ready and in the status,
  {_fmt(m['seconds_load_stop_to_min'], ' s')} after the load stopped.
- Every change of spec.replicas: {steps or 'none'}.

## Re-running

`{r['command']}` (this run took {_fmt(r['wall_clock_s'], ' s')} from start to teardown; needs
the cached Kubernetes binaries, see docs/controlplane.md, and redis-server). Options:
`--rate`, `--ramp-seconds`,
`--hold-seconds`, `--stabilization-seconds`, `--max-replicas`, `--out DIR`;
`--report-only` rebuilds the summary, this file and the plot from `autoscale.json` without a
run. Logs of every process go to `bench/.logs/autoscale-<time>/`.
"""
