"""`python -m bench autoscale`: cache pressure drives the real HPA, end to end (issue 6).

All real processes on this host: the local control plane (e2e/cluster: etcd, kube-apiserver,
kube-controller-manager with its HPA controller, kube-scheduler, kwok fake GPU nodes), our
operator and metrics adapter, one redis-server (the model's cache store), `prefix-router`
processes started from the router.yaml the operator rendered (discovery swapped for a backends
file: kwok pod IPs are unreachable), and one engine-sim per possible replica: each sample
rewrites the backends file with as many simulators as there are Ready model-server pods.

The load's working set grows (tenant prompts added over the ramp); the routers publish it,
the adapter serves it, the HPA asks for ceil(working set / (kvCapacityTokens x
targetCachePressure)) replicas and scales the PrefixRoutedModel, the operator the Deployment,
kwok makes the pods Ready. Then the load stops and the HPA scales down after the CR's
stabilisation window. Every ~2 s a sample of all of it, into bench/results/autoscale/.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import random
import sys
import time
import urllib.parse
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from prefix_router.contract import IN_FLIGHT_METRIC, WORKING_SET_METRIC

from .harness.engines import fetch_stats
from .harness.fleet import Fleet, free_port
from .harness.loadgen import run_load
from .harness.workloads import Session, Turn, Workload, text
from .provenance import machine, now_utc
from .report import fmt, md_table, pyplot, save_figure
from .runner import MODEL
from .scenarios import PROFILE

REPO = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).parent / "results" / "autoscale"
CRD = REPO / "crds" / "prefixroutedmodel.yaml"
NAMESPACE = "autoscale"
NAME = "chat"
GV = "external.metrics.k8s.io/v1beta1"
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


def growing_workload(s: Settings) -> Workload:
    """Single-turn requests whose distinct prefixes grow over the ramp: session k (sent at about
    k / rate s) picks among the tenants introduced by then, so each stays hot once introduced;
    short user turns (24-40 tokens) add little next to the shared prompts."""
    rng = random.Random(s.seed)
    prompts = [f"[tenant {i} system prompt] " + text(rng, s.prompt_tokens)
               for i in range(s.prompts_end)]
    count = int(s.rate * (s.ramp_s + s.hold_s) * 1.3) + 20
    sessions = [Session(prompts[i], [Turn(text(rng, rng.randint(24, 40)), rng.randint(16, 32))],
                        f"t{i}") for i in (rng.randrange(tenants_at(s, k / s.rate))
                                           for k in range(count))]
    return Workload("growing-tenants", sessions, s.prompts_end * s.prompt_tokens)


def tenants_at(s: Settings, t: float) -> int:
    """Tenants introduced by `t` seconds into the load."""
    frac = min(1.0, max(0.0, t / s.ramp_s)) if s.ramp_s > 0 else 1.0
    return s.prompts_start + round((s.prompts_end - s.prompts_start) * frac)


_SUFFIX = {"Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40,  # two letters first
           "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}


def quantity(q: str | int | float | None) -> float | None:
    """A Kubernetes quantity ("80k", "1500m", "45000", "1.5e3") as a float."""
    if q is None or isinstance(q, int | float):
        return None if q is None else float(q)
    q = q.strip()
    suffix = next((x for x in _SUFFIX if q.endswith(x)), "")
    return float(q[: len(q) - len(suffix)]) * _SUFFIX.get(suffix, 1.0)


def condition(obj: dict[str, Any] | None, type_: str) -> dict[str, Any]:
    conditions = ((obj or {}).get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c.get("type") == type_), {})


def derived(sample: dict[str, Any], s: Settings) -> dict[str, Any]:
    """A sample's cache pressure (working set / (Ready replicas x kvCapacityTokens)) and the
    replicas it asks for (working set / (kvCapacityTokens x targetCachePressure), the ratio the
    HPA takes the ceiling of)."""
    ws, ready = sample.get("working_set_tokens"), sample.get("ready_pods") or 0
    return {"cache_pressure": None if ws is None or not ready
            else round(ws / (ready * s.kv_capacity_tokens), 3),
            "needed_replicas": None if ws is None else round(ws / s.working_set_per_replica, 3)}


def _first(samples: list[dict[str, Any]], pred: Any, after: float = -math.inf) -> float | None:
    return next((x["t"] for x in samples if x["t"] >= after and pred(x)), None)


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
    return len(tail) == 2 and all(x["spec_replicas"] == x["ready_pods"] == min_replicas ==
                                  x["status_ready_replicas"] == x["hpa_desired"] for x in tail)


def summarize(samples: list[dict[str, Any]], s: Settings, load_start: float,
              load_stop: float) -> dict[str, Any]:
    """The run's numbers, from the samples alone."""

    def gap(a: float | None, b: float | None) -> float | None:
        return None if a is None or b is None else round(a - b, 1)

    def peak(key: str) -> Any:
        return max((x[key] for x in samples if x.get(key) is not None), default=None)

    def fewer(x: dict[str, Any]) -> bool:  # the HPA's own arithmetic, tolerance included
        need, spec = x.get("needed_replicas"), x.get("spec_replicas")
        return need is not None and spec is not None and need < spec * (1 - HPA_TOLERANCE) \
            and math.ceil(need) < spec

    events = scale_events(samples)
    ups = [e for e in events if e["to"] > e["from"]]
    downs = [e for e in events if e["to"] < e["from"] and e["t"] >= load_stop]
    over = _first(samples, lambda x: (x.get("cache_pressure") or 0)
                  > s.target_cache_pressure * (1 + HPA_TOLERANCE), load_start)
    first_up = ups[0]["t"] if ups else None
    top = peak("spec_replicas") or 0
    peak_at = _first(samples, lambda x: x.get("spec_replicas") == top)
    peak_ready = _first(samples, lambda x: x.get("ready_pods") == top == x.get(
        "status_ready_replicas"), peak_at if peak_at is not None else 0)
    asks_fewer = _first(samples, fewer, load_stop)  # after the load, the metric asks for fewer
    first_down = downs[0]["t"] if downs else None
    at_min = _first(samples, lambda x: x.get("spec_replicas") == x.get("ready_pods") == x.get(
        "status_ready_replicas") == s.min_replicas, load_stop)
    lags = [e["ready_after_s"] for e in events if e["ready_after_s"] is not None]
    return {
        "samples": len(samples), "peak_working_set_tokens": peak("working_set_tokens"),
        "peak_cache_pressure": peak("cache_pressure"),
        "peak_needed_replicas": peak("needed_replicas"),
        "max_hpa_desired_replicas": peak("hpa_desired") or 0, "max_spec_replicas": top,
        "max_ready_pods": peak("ready_pods") or 0,
        "pressure_over_target_at_s": over, "first_scale_up_at_s": first_up,
        "seconds_to_first_scale_up": gap(first_up, over)
        if (gap(first_up, over) or 0) >= 0 else None,
        "peak_replicas_ready_at_s": peak_ready,
        "seconds_load_start_to_peak_ready": gap(peak_ready, load_start),
        "scale_up_steps": len(ups),
        "mean_seconds_spec_to_ready": round(sum(lags) / len(lags), 1) if lags else None,
        "load_stopped_at_s": load_stop, "working_set_asks_fewer_at_s": asks_fewer,
        "first_scale_down_at_s": first_down,
        "seconds_metric_to_scale_down": gap(first_down, asks_fewer),
        "scale_down_steps": len(downs), "back_to_min_at_s": at_min,
        "seconds_load_stop_to_min": gap(at_min, load_stop), "scale_events": events,
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
    return {"apiVersion": "prefixrouter.io/v1alpha1", "kind": "PrefixRoutedModel",
            "metadata": {"name": NAME, "namespace": NAMESPACE}, "spec": {
                "replicas": s.min_replicas, "minReplicas": s.min_replicas,
                "maxReplicas": s.max_replicas,
                "model": {"name": MODEL, "source": "meta-llama/Llama-3.1-70B-Instruct"},
                # the engines are engine-sim processes (kwok pods stand for them, their image
                # never pulled) keyed in byte blocks: a custom engine, so the routers get no
                # Hugging Face tokenizer to fetch and no KV-event index (derived for vLLM)
                "engine": {"type": "custom", "image": "engine-sim"},
                "router": {"kvCapacityTokens": s.kv_capacity_tokens},
                "cacheStore": {"type": "external", "url": redis_url},
                "autoscaling": {"enabled": True, "targetCachePressure": s.target_cache_pressure,
                                "targetLoad": s.target_load,
                                "scaleDownStabilizationSeconds": s.scale_down_stabilization_s}}}


class Cluster:
    """The control plane plus our operator and adapter, and typed reads of what we sample:
    straight to kube-apiserver over HTTPS (cp.request), no kubectl process per read."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.cp: Any = None
        self.operator: Any = None
        self.adapter: Any = None

    def start(self) -> None:
        controlplane, processes = _cluster_modules()
        self.cp = cp = controlplane.ControlPlane(controlplane.ensure_binaries(build=False),
                                                 self.work / "controlplane")
        cp.start()
        print(f"  control plane up in {cp.startup_seconds:.1f} s ({cp.server})", flush=True)
        cp.kubectl("apply", "--server-side", "--force-conflicts", "--field-manager=bench", "-f",
                   str(CRD))
        cp.kubectl("wait", "--for=condition=Established", "--timeout=30s",
                   "crd/prefixroutedmodels.prefixrouter.io")
        cp.kubectl("create", "namespace", NAMESPACE)
        cp.wait_for(lambda: cp.kubectl("get", "serviceaccount", "default", "-n", NAMESPACE,
                                       check=False).returncode == 0, 30, "the default SA")
        # The adapter's production default staleness (60 s): the routers publish every second.
        self.adapter = processes.MetricsAdapter(cp, self.work / "adapter", stale_after=60)
        self.adapter.start()
        self.adapter.register()
        self.operator = processes.Operator(cp, NAMESPACE, self.work / "operator")
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
    for ext in (m.get("external") or {} for m in hpa["spec"]["metrics"]):
        if ext.get("metric", {}).get("name") == metric:
            return ",".join(f"{k}={v}" for k, v in
                            sorted(ext["metric"]["selector"]["matchLabels"].items()))
    raise KeyError(metric)


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
        sims = [(await fleet.start_sim(f"sim{i}", model=MODEL, kv_capacity=s.kv_capacity_tokens,
                                       profile=PROFILE, time_scale=1.0)).url
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
        totals: list[tuple[int, int]] = [(0, 0)]  # the sims' (prompt, cached) tokens, by sample
        serving = 1

        async def sample() -> dict[str, Any]:
            nonlocal serving
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
            stats = await fetch_stats(sims)
            totals.append((sum(x["prompt_tokens"] for x in stats),
                           sum(x["cached_tokens"] for x in stats)))
            # over the last HIT_RATE_SAMPLES samples: one 2 s sample holds a handful of requests
            base = totals[max(0, len(totals) - 1 - HIT_RATE_SAMPLES)]
            prompt, cached = totals[-1][0] - base[0], totals[-1][1] - base[1]
            hs = (h or {}).get("status") or {}
            routing = ((m or {}).get("status") or {}).get("routing") or {}
            x: dict[str, Any] = {
                "t": t, "working_set_tokens": ws, "in_flight": inflight,
                "hpa_desired": hs.get("desiredReplicas"),
                "spec_replicas": ((m or {}).get("spec") or {}).get("replicas"),
                "status_ready_replicas": ((m or {}).get("status") or {}).get("readyReplicas"),
                "status_cache_pressure": routing.get("cachePressure"),
                "ready_pods": pods[0], "pods": pods[1], "sims_serving": serving,
                "engine_hit_rate": round(cached / prompt, 3) if prompt > 0 else None,
            }
            x.update(derived(x, s))
            return x

        async def sampler(stop: asyncio.Event) -> None:
            next_at = time.monotonic()
            while not stop.is_set():
                x = await sample()
                samples.append(x)
                if "load_stop" in marks and back_at_min(samples, marks["load_stop"],
                                                        s.min_replicas):
                    settled.set()
                if len(samples) % 5 == 1:
                    print("  " + ", ".join(f"{k} {x[k]}" for k in (
                        "t", "working_set_tokens", "needed_replicas", "hpa_desired",
                        "spec_replicas", "ready_pods", "cache_pressure")), flush=True)
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
        return {"hpa_active_wait_s": hpa_wait, "load_start_s": marks["load_start"],
                "load_stop_s": marks["load_stop"], "requests": len(log.results),
                "failed_requests": sum(not r.ok for r in log.results),
                "router_config": {k: config[k] for k in ("model_key", "block_size",
                                                         "kv_capacity_tokens", "store")},
                "samples": samples}


def main(s: Settings, out: Path, command: str) -> dict[str, Any]:
    log_dir = REPO / "bench" / ".logs" / f"autoscale-{int(time.time())}"
    log_dir.mkdir(parents=True)
    started, cluster = time.monotonic(), Cluster(log_dir)
    print(f"autoscale: logs in {log_dir}", flush=True)
    try:
        cluster.start()
        run = asyncio.run(_run(s, cluster, log_dir))
        hpa = cluster.hpa() or {}
    finally:
        cluster.stop()
    result = {"command": command, "machine": machine(), "date_utc": now_utc(),
              "settings": asdict(s), "working_set_per_replica": s.working_set_per_replica,
              "hpa_sync_period_s": 5, "hpa_behavior": (hpa.get("spec") or {}).get("behavior"),
              "wall_clock_s": round(time.monotonic() - started, 1), **run}
    return rebuild(out, result)


def rebuild(out: Path, result: dict[str, Any] | None = None) -> dict[str, Any]:
    """The summary, JSON, plot and README of a run (by default: of out/autoscale.json)."""
    r = result or json.loads((out / "autoscale.json").read_text())
    r["summary"] = summarize(r["samples"], Settings(**r["settings"]), r["load_start_s"],
                             r["load_stop_s"])
    out.mkdir(parents=True, exist_ok=True)
    (out / "autoscale.json").write_text(json.dumps(r, indent=1) + "\n")
    plot(r, out / "autoscale.png")
    (out / "README.md").write_text(readme(r))
    return r


# --------------------------------------------------------------------------- outputs


def plot(result: dict[str, Any], path: Path) -> None:
    plt = pyplot()
    s = result["settings"]
    xs = result["samples"]
    t = [x["t"] for x in xs]
    fig, (top, mid) = plt.subplots(2, 1, figsize=(10, 7), sharex=True, height_ratios=[3, 2])
    for ax in (top, mid):
        ax.axvspan(result["load_start_s"], result["load_stop_s"], color="0.93", zorder=0)
        ax.grid(alpha=0.3)
    top.plot(t, [x["needed_replicas"] for x in xs], color="tab:orange",
             label="working set / (kvCapacityTokens x targetCachePressure)")
    for key, style in (("hpa_desired", {"lw": 5, "alpha": 0.35}), ("spec_replicas", {"ls": "--"}),
                       ("ready_pods", {"lw": 1.5})):
        top.step(t, [x[key] for x in xs], where="post", label=key.replace("_", " "), **style)
    top.set_ylabel("replicas")
    top.set_ylim(0, s["max_replicas"] + 0.8)
    top.legend(fontsize=8, loc="upper left")
    mid.plot(t, [x["cache_pressure"] for x in xs], color="tab:red",
             label="cache pressure = working set / (Ready replicas x kvCapacityTokens)")
    mid.plot(t, [x["engine_hit_rate"] for x in xs], color="tab:gray", lw=1,
             label="simulators' hit rate")
    mid.axhline(s["target_cache_pressure"], color="tab:red", ls="--", lw=1,
                label="targetCachePressure")
    mid.set_xlabel("seconds (grey band: load through the routers)")
    mid.legend(fontsize=8, loc="upper left")
    save_figure(plt, fig, path)


def readme(r: dict[str, Any]) -> str:
    """The report: how it ran (settings), the figures of its summary, every scale event."""
    rows = [*((k, fmt(v)) for k, v in r["settings"].items()),
            *((k, fmt(r.get(k))) for k in ("requests", "failed_requests", "hpa_sync_period_s")),
            *((k, fmt(v)) for k, v in r["summary"].items() if k != "scale_events")]
    events = [(f"{e['t']:g}", f"{e['from']} -> {e['to']}", fmt(e["ready_after_s"]))
              for e in r["summary"]["scale_events"]]
    return "\n".join([
        "# Autoscaling on cache pressure, end to end", "",
        f"Written by `{r['command']}` on {r['date_utc']}, {r.get('machine', 'host not recorded')}"
        f" (`--report`: this file and the plot from `autoscale.json`); wall clock "
        f"{fmt(r['wall_clock_s'])} s. bench/autoscale.py says what runs: every process real but "
        "the model-server pods (kwok), whose Ready count the routers' backends file follows with "
        "local engine-sim processes. Times in seconds from the first sample.", "",
        "![replicas and cache pressure over time](autoscale.png)", "",
        *md_table(("setting or figure", "value"), [(k.replace("_", " "), v) for k, v in rows]), "",
        "Every change of the model's spec.replicas (the HPA's writes), and when its pods were "
        "all Ready and the status said so:", "",
        *md_table(("t (s)", "replicas", "Ready after (s)"), events), ""])
