"""`python -m bench autoscale`: a growing working set drives the real HPA up, and down after the
load (issue 6). Every process is real (e2e/cluster's control plane, our operator and adapter,
routers on the router.yaml the operator rendered) but the model-server pods, kwok's: the routers'
backends file lists as many engine-sims as the model has Ready replicas."""

import asyncio
import contextlib
import itertools
import json
import math
import random
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from prefix_router.contract import WORKING_SET_METRIC

from .harness.fleet import Fleet, free_port
from .harness.loadgen import run_load
from .harness.workloads import Session, Turn, Workload, text
from .provenance import now_utc, stamp
from .report import fmt, md_table, pyplot, save_figure
from .runner import MODEL
from .scenarios import PROFILE

REPO = Path(__file__).resolve().parents[1]
NAMESPACE, NAME = "autoscale", "chat"
MODEL_PATH = f"/apis/prefixrouter.io/v1alpha1/namespaces/{NAMESPACE}/prefixroutedmodels/{NAME}"
CONFIG_PATH = f"/api/v1/namespaces/{NAMESPACE}/configmaps/{NAME}-router"
HPA_PATH = f"/apis/autoscaling/v2/namespaces/{NAMESPACE}/horizontalpodautoscalers/{NAME}"
# what the HPA reads: from our adapter through kube-apiserver, with the HPA's selector
METRIC_PATH = (f"/apis/external.metrics.k8s.io/v1beta1/namespaces/{NAMESPACE}/{WORKING_SET_METRIC}"
               f"?labelSelector=prefixrouter.io/model={NAME},prefixrouter.io/namespace={NAMESPACE}")
# The HPA does nothing while |usage / target - 1| <= 0.1 (kube-controller-manager's default
# --horizontal-pod-autoscaler-tolerance): "over the target" it must act on means beyond that.
HPA_TOLERANCE = 0.1


@dataclass(frozen=True)
class Settings:
    # per-replica KV capacity small enough that what a 2-core host sends needs several replicas
    kv_capacity_tokens: int = 20_000
    target_cache_pressure: float = 0.8
    target_load: float = 8.0
    min_replicas: int = 1
    max_replicas: int = 6
    scale_down_stabilization_s: int = 30
    rate: float = 4.0  # requests/s for ramp + hold seconds
    ramp_s: float = 120.0
    hold_s: float = 30.0
    prompts_start: int = 2  # tenants' system prompts at the start of the ramp, and at its end
    prompts_end: int = 44
    prompt_tokens: int = 1500
    routers: int = 2
    sample_s: float = 2.0
    settle_timeout_s: float = 180.0  # how long after the load to wait for minReplicas
    seed: int = 11

    @property
    def working_set_per_replica(self) -> float:
        """The HPA's AverageValue target for the working-set metric (as the operator renders)."""
        return max(1, round(self.kv_capacity_tokens * self.target_cache_pressure))


def growing_workload(s: Settings) -> Workload:
    """Single-turn requests: session k (sent at about k / rate s) picks among the tenants
    introduced by then, so each stays hot once introduced; short user turns add little."""
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


def derived(sample: dict[str, Any], s: Settings) -> dict[str, Any]:
    """Cache pressure, and the replicas the working set asks for (the HPA takes the ceiling)."""
    ws, ready = sample.get("working_set_tokens"), sample.get("ready_replicas") or 0
    return {"cache_pressure": None if ws is None or not ready
            else round(ws / (ready * s.kv_capacity_tokens), 3),
            "needed_replicas": None if ws is None else round(ws / s.working_set_per_replica, 3)}


def all_at(x: dict[str, Any], n: int) -> bool:
    """spec.replicas at n and as many replicas Ready."""
    return x.get("spec_replicas") == x.get("ready_replicas") == n


def scale_events(samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each change of spec.replicas (the HPA's writes), and how long until all were Ready."""
    known = [x for x in samples if x.get("spec_replicas") is not None]  # not the failed reads
    events = []
    for i, (a, b) in enumerate(itertools.pairwise(known)):
        if (n := b["spec_replicas"]) != a["spec_replicas"]:
            same = itertools.takewhile(lambda y, n=n: y["spec_replicas"] == n, known[i + 1:])
            ready = next((round(y["t"] - b["t"], 1) for y in same if all_at(y, n)), None)
            events.append({"t": b["t"], "from": a["spec_replicas"], "to": n,
                           "ready_after_s": ready})
    return events


def summarize(samples: list[dict[str, Any]], s: Settings, load_start: float,
              load_stop: float) -> dict[str, Any]:
    """The run's headline numbers, from the samples alone."""
    peak = {k: max((x[k] for x in samples if x.get(k) is not None), default=None)
            for k in ("working_set_tokens", "cache_pressure", "spec_replicas")}
    events = scale_events(samples)
    up = next((e["t"] for e in events if e["to"] > e["from"]), None)
    over = next((x["t"] for x in samples if x["t"] >= load_start and (x.get("cache_pressure")
                 or 0) > s.target_cache_pressure * (1 + HPA_TOLERANCE)), None)
    at_min = next((x["t"] for x in samples if x["t"] >= load_stop and all_at(x, s.min_replicas)),
                  None)
    return {
        "peak_working_set_tokens": peak["working_set_tokens"],
        "peak_cache_pressure": peak["cache_pressure"], "max_spec_replicas": peak["spec_replicas"],
        "pressure_over_target_at_s": over, "first_scale_up_at_s": up,
        "seconds_to_first_scale_up": None if up is None or over is None or up < over
        else round(up - over, 1),
        "load_stopped_at_s": load_stop, "back_to_min_at_s": at_min,
        "seconds_load_stop_to_min": None if at_min is None else round(at_min - load_stop, 1),
        "scale_events": events,
    }


def model_manifest(s: Settings, redis_url: str) -> dict[str, Any]:
    """A custom engine: byte blocks, as engine-sim keys them, and no tokenizer to fetch."""
    return {"apiVersion": "prefixrouter.io/v1alpha1", "kind": "PrefixRoutedModel",
            "metadata": {"name": NAME, "namespace": NAMESPACE}, "spec": {
                "replicas": s.min_replicas, "minReplicas": s.min_replicas,
                "maxReplicas": s.max_replicas,
                "model": {"name": MODEL, "source": "meta-llama/Llama-3.1-70B-Instruct"},
                "engine": {"type": "custom", "image": "engine-sim"},
                "router": {"kvCapacityTokens": s.kv_capacity_tokens},
                "cacheStore": {"type": "external", "url": redis_url},
                "autoscaling": {"enabled": True, "targetCachePressure": s.target_cache_pressure,
                                "targetLoad": s.target_load,
                                "scaleDownStabilizationSeconds": s.scale_down_stabilization_s}}}


async def _run(s: Settings, cp: Any, log_dir: Path) -> dict[str, Any]:
    def get(path: str) -> dict[str, Any]:  # a failed read is a gap in the series, not an end
        with contextlib.suppress(Exception):
            return cp.request("GET", path, timeout=5)
        return {}

    async with Fleet(log_dir / "fleet") as fleet:
        cp.apply(model_manifest(s, await fleet.start_redis()))
        (log_dir / "router.yaml").write_text(await asyncio.to_thread(cp.wait_for, lambda: get(
            CONFIG_PATH).get("data", {}).get("router.yaml"), 90, "the operator's router.yaml"))
        sims = [(await fleet.start_sim(f"sim{i}", model=MODEL, kv_capacity=s.kv_capacity_tokens,
                                       profile=PROFILE, time_scale=1.0)).url
                for i in range(s.max_replicas)]
        backends = log_dir / "backends"
        backends.write_text(sims[0] + "\n")
        routers = [(await fleet.start(f"router{i}", [
            sys.executable, "-m", "prefix_router", "--config", str(log_dir / "router.yaml"),
            "--host", "127.0.0.1", "--port", str(port), "--metrics-port", str(free_port()),
            "--log-level", "warning",
            "--discovery", "file", "--backends-file", str(backends)], port, "/readyz")).url
            for i, port in enumerate(free_port() for _ in range(s.routers))]
        # Load once the HPA acts (scale subresource known, metric served): timings are the loop's.
        await asyncio.to_thread(cp.wait_for, lambda: any(
            c["type"] == "ScalingActive" and c["status"] == "True"
            for c in get(HPA_PATH).get("status", {}).get("conditions", [])), 120, "the HPA")
        workload, samples, t0 = growing_workload(s), [], time.monotonic()
        load, load_start, load_stop = None, math.inf, math.inf
        for k in itertools.count():
            await asyncio.sleep(max(0.0, t0 + k * s.sample_s - time.monotonic()))
            t = round(time.monotonic() - t0, 1)
            if k == 3:  # after a few idle samples
                load = asyncio.create_task(run_load(workload, routers, MODEL, s.rate,
                                                    s.ramp_s + s.hold_s, seed=s.seed,
                                                    progress=False))
                load_start, load_stop = t, t + s.ramp_s + s.hold_s
                print(f"  HPA active; load from t={t} s to {load_stop} s", flush=True)
            metric, hpa, model = await asyncio.gather(*(asyncio.to_thread(get, p) for p in (
                METRIC_PATH, HPA_PATH, MODEL_PATH)))
            # a whole number of tokens; no items: the adapter serves no figure (stale, missing)
            ws = [float(i["value"]) for i in metric.get("items", [])]
            x = {"t": t, "working_set_tokens": sum(ws) if ws else None,
                 "hpa_desired": hpa.get("status", {}).get("desiredReplicas"),
                 "spec_replicas": model.get("spec", {}).get("replicas"),
                 "ready_replicas": model.get("status", {}).get("readyReplicas")}
            samples.append({**x, **derived(x, s)})
            # The routers follow the Ready replicas, by a whole-file replace (never half a list).
            tmp = backends.with_suffix(".tmp")
            tmp.write_text("".join(u + "\n" for u in sims[:max(1, x["ready_replicas"] or 0)]))
            tmp.replace(backends)
            # done: two samples after the load with all at minReplicas, the HPA's wish too
            settled = [y for y in samples if y["t"] > load_stop and all_at(y, s.min_replicas)
                       and y["hpa_desired"] == s.min_replicas]
            if len(settled) == 2 or t > load_stop + s.settle_timeout_s:
                break
        log = await load
        return {"load_start_s": load_start, "load_stop_s": load_stop, "requests": len(log.results),
                "failed_requests": sum(not r.ok for r in log.results), "samples": samples}


def main(s: Settings, out: Path, command: str) -> dict[str, Any]:
    """The local control plane with our CRD and namespace, adapter and operator; then _run."""
    log_dir = REPO / "bench" / ".logs" / f"autoscale-{int(time.time())}"
    log_dir.mkdir(parents=True)
    print(f"autoscale: logs in {log_dir}", flush=True)
    started = time.monotonic()
    sys.path.insert(0, str(REPO / "e2e" / "cluster"))  # plain modules, see their docstrings
    import controlplane
    import processes

    with contextlib.ExitStack() as stack:
        cp = stack.enter_context(controlplane.ControlPlane(
            controlplane.ensure_binaries(build=False), log_dir / "cp"))
        cp.apply((REPO / "crds" / "prefixroutedmodel.yaml").read_text())
        cp.kubectl("create", "namespace", NAMESPACE)
        adapter = processes.MetricsAdapter(cp, log_dir / "adapter")
        operator = processes.Operator(cp, NAMESPACE, log_dir / "operator")
        for part in (adapter, operator):
            stack.callback(part.stop)
            part.start()
        adapter.register()
        run = asyncio.run(_run(s, cp, log_dir))
    return rebuild(out, {**stamp(command), "date_utc": now_utc(),
                         "settings": asdict(s),
                         "wall_clock_s": round(time.monotonic() - started, 1), **run})


def rebuild(out: Path, result: dict[str, Any] | None = None) -> dict[str, Any]:
    """The summary, JSON, plot and README of a run (by default: of out/autoscale.json)."""
    r = result or json.loads((out / "autoscale.json").read_text())
    r["summary"] = summarize(r["samples"], Settings(**r["settings"]), r["load_start_s"],
                             r["load_stop_s"])
    out.mkdir(parents=True, exist_ok=True)
    (out / "autoscale.json").write_text(json.dumps(r, indent=1) + "\n")
    plot(r, out / "autoscale.png")
    rows = [*r["settings"].items(), *((k, r[k]) for k in ("requests", "failed_requests")),
            *((k, v) for k, v in r["summary"].items() if k != "scale_events")]
    events = [(f"{e['t']:g}", f"{e['from']} -> {e['to']}", fmt(e["ready_after_s"]))
              for e in r["summary"]["scale_events"]]
    (out / "README.md").write_text("\n".join([
        "# Autoscaling on cache pressure, end to end", "",
        f"Written by `{r['command']}` on {r['date_utc']}, {r['machine']}, code "
        f"{r.get('version', '?')} (`--report`: this file "
        f"and the plot from `autoscale.json`); wall clock {fmt(r['wall_clock_s'])} s. "
        "bench/autoscale.py says what runs. Times in seconds from the first sample.", "",
        "![replicas and cache pressure over time](autoscale.png)", "",
        *md_table(("setting or figure", "value"),
                  [(k.replace("_", " "), fmt(v)) for k, v in rows]), "",
        "Every change of the model's spec.replicas (the HPA's writes), and how long until as "
        "many replicas were Ready:", "",
        *md_table(("t (s)", "replicas", "Ready after (s)"), events), ""]))
    return r


def plot(r: dict[str, Any], path: Path) -> None:
    plt, xs, s = pyplot(), r["samples"], r["settings"]
    t = [x["t"] for x in xs]
    fig, (top, mid) = plt.subplots(2, 1, figsize=(10, 7), sharex=True, height_ratios=[3, 2])
    top.plot(t, [x["needed_replicas"] for x in xs], color="tab:orange",
             label="working set / (kvCapacityTokens x targetCachePressure)")
    for key, style in (("hpa_desired", {"lw": 5, "alpha": 0.35}), ("spec_replicas", {"ls": "--"}),
                       ("ready_replicas", {"lw": 1.5})):
        top.step(t, [x[key] for x in xs], where="post", label=key.replace("_", " "), **style)
    top.set(ylabel="replicas", ylim=(0, s["max_replicas"] + 0.8))
    mid.plot(t, [x["cache_pressure"] for x in xs], color="tab:red",
             label="cache pressure = working set / (Ready replicas x kvCapacityTokens)")
    mid.axhline(s["target_cache_pressure"], color="tab:red", ls="--", lw=1,
                label="targetCachePressure")
    mid.set_xlabel("seconds (grey band: load through the routers)")
    for ax in (top, mid):
        ax.axvspan(r["load_start_s"], r["load_stop_s"], color="0.93", zorder=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="upper left")
    save_figure(plt, fig, path)
