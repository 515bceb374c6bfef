"""`python -m bench.deletion_writes`: the API server's write rate from engine pod deletion
costs, over minutes of steady load (issue 38).

Every process is real but the model-server pods, kwok's: e2e/cluster's control plane, our
operator with its production timers (figures and deletion costs every 15 s), Redis, two
routers on the router.yaml the operator rendered, and one engine simulator per pod (the
routers' backends file lists them; each kwok pod carries its simulator's address in the
operator's test-only engine address annotation, as the router's discovery reads it in
tests/k8s). The count is the API server's own: `apiserver_request_total` of PATCH on pods
(not their status, which kwok writes), read before and after the measured window.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
import shlex
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from prefix_operator.deletion_cost import ANNOTATION

from .harness.fleet import Fleet, free_port
from .harness.loadgen import run_load
from .harness.workloads import system_prompts
from .provenance import now_utc, stamp
from .report import fmt, md_table
from .runner import MODEL
from .scenarios import PROFILE

REPO = Path(__file__).resolve().parents[1]
NAMESPACE, NAME = "lifecycle", "chat"
ADDRESS_ANNOTATION = "prefixrouter.io/test-engine-address"
CONFIG_PATH = f"/api/v1/namespaces/{NAMESPACE}/configmaps/{NAME}-router"
POD_PATCHES = re.compile(r'^apiserver_request_total\{([^}]*)\} ([0-9.e+]+)$', re.M)


@dataclass(frozen=True)
class Settings:
    engines: int = 8
    kv_capacity_tokens: int = 24_000
    routers: int = 2
    rate: float = 4.0
    warm_s: float = 90.0  # load before the window: the first costs are written then
    measure_s: float = 600.0
    sample_s: float = 15.0
    seed: int = 3


def pod_patches(metrics: str) -> float:
    """PATCH requests on pods themselves (no subresource) the API server has answered."""
    total = 0.0
    for labels, value in POD_PATCHES.findall(metrics):
        kv = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        if kv.get("verb") == "PATCH" and kv.get("resource") == "pods" \
                and not kv.get("subresource"):
            total += float(value)
    return total


def model_manifest(s: Settings, redis_url: str) -> dict[str, Any]:
    return {"apiVersion": "prefixrouter.io/v1alpha1", "kind": "PrefixRoutedModel",
            "metadata": {"name": NAME, "namespace": NAMESPACE}, "spec": {
                "replicas": s.engines, "minReplicas": 1, "maxReplicas": s.engines,
                "model": {"name": MODEL, "source": "meta-llama/Llama-3.1-70B-Instruct"},
                "engine": {"type": "custom", "image": "engine-sim"},
                "router": {"kvCapacityTokens": s.kv_capacity_tokens},
                "cacheStore": {"type": "external", "url": redis_url}}}


def start_operator(cp: Any, log_dir: Path) -> subprocess.Popen[bytes]:
    """Standalone, one namespace, the production timers; the engine address annotation."""
    log_dir.mkdir(parents=True, exist_ok=True)
    env = {**cp.env(), "PREFIX_OPERATOR_ENGINE_ADDRESS_ANNOTATION": ADDRESS_ANNOTATION}
    with open(log_dir / "operator.log", "wb") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "prefix_operator", "--standalone", "--namespace", NAMESPACE,
             "--verbose"],
            stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO)


def engine_pods(cp: Any) -> list[dict[str, Any]]:
    items = cp.kubectl_json("get", "pods", "-n", NAMESPACE, "-l",
                            f"prefixrouter.io/model={NAME},"
                            "app.kubernetes.io/component=model-server")["items"]
    return sorted((p for p in items if not p["metadata"].get("deletionTimestamp")),
                  key=lambda p: p["metadata"]["name"])


async def _run(s: Settings, cp: Any, log_dir: Path) -> dict[str, Any]:
    async with Fleet(log_dir / "fleet") as fleet:
        cp.apply(model_manifest(s, await fleet.start_redis()))
        router_yaml = await asyncio.to_thread(cp.wait_for, lambda: (cp.request(
            "GET", CONFIG_PATH) or {}).get("data", {}).get("router.yaml"), 90, "router.yaml")
        (log_dir / "router.yaml").write_text(router_yaml)
        pods = await asyncio.to_thread(cp.wait_for, lambda: (lambda ps: ps if len(ps) == s.engines
                                       and all(p["status"].get("podIP") for p in ps) else None)(
                                           engine_pods(cp)), 120, "the engine pods")
        sims = [await fleet.start_sim(f"sim{i}", model=MODEL, kv_capacity=s.kv_capacity_tokens,
                                      profile=PROFILE, time_scale=1.0) for i in range(s.engines)]
        for p, sim in zip(pods, sims, strict=True):
            cp.kubectl("annotate", "pod", p["metadata"]["name"], "-n", NAMESPACE,
                       f"{ADDRESS_ANNOTATION}={sim.url.removeprefix('http://')}")
        backends = log_dir / "backends"
        backends.write_text("".join(x.url + "\n" for x in sims))
        routers = [(await fleet.start(f"router{i}", [
            sys.executable, "-m", "prefix_router", "--config", str(log_dir / "router.yaml"),
            "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning",
            "--discovery", "file", "--backends-file", str(backends)], port, "/readyz")).url
            for i, port in enumerate(free_port() for _ in range(s.routers))]
        seconds = s.warm_s + s.measure_s
        workload = system_prompts(int(s.rate * seconds * 1.5) + 50, seed=s.seed)
        t0 = time.monotonic()
        load = asyncio.create_task(run_load(workload, routers, MODEL, s.rate, seconds,
                                            seed=s.seed, progress=False))
        samples: list[dict[str, Any]] = []
        start = end = None
        k = 0
        while not load.done():
            await asyncio.sleep(max(0.0, t0 + k * s.sample_s - time.monotonic()))
            t = round(time.monotonic() - t0, 1)
            metrics = (await asyncio.to_thread(cp.kubectl, "get", "--raw", "/metrics")).stdout
            costs = {p["metadata"]["name"]: (p["metadata"].get("annotations") or {}).get(
                ANNOTATION) for p in await asyncio.to_thread(engine_pods, cp)}
            samples.append({"t": t, "pod_patches": pod_patches(metrics), "costs": costs})
            if start is None and t >= s.warm_s:
                start = samples[-1]
            if t >= seconds:
                end = samples[-1]
                break
            k += 1
        log = await load
    assert start is not None and end is not None, "the load ended before the window"
    patches = end["pod_patches"] - start["pod_patches"]
    minutes = (end["t"] - start["t"]) / 60
    return {"requests": len(log.results), "errors": sum(not r.ok for r in log.results),
            "window_s": round(end["t"] - start["t"], 1),
            "patches_in_window": patches, "patches_per_minute": round(patches / minutes, 2),
            "patches_before_window": start["pod_patches"], "samples": samples}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.deletion_writes", description=__doc__)
    p.add_argument("--measure-seconds", type=float, default=Settings.measure_s)
    p.add_argument("--warm-seconds", type=float, default=Settings.warm_s)
    p.add_argument("--out", default="bench/results/lifecycle")
    args = p.parse_args(argv)
    s = Settings(measure_s=args.measure_seconds, warm_s=args.warm_seconds)
    command = "python -m bench.deletion_writes " + shlex.join(
        argv if argv is not None else sys.argv[1:])
    provenance = stamp(command)  # of the code that runs, whatever is committed meanwhile
    log_dir = REPO / "bench" / ".logs" / f"deletion-writes-{int(time.time())}"
    log_dir.mkdir(parents=True)
    print(f"deletion_writes: logs in {log_dir}", flush=True)
    sys.path.insert(0, str(REPO / "e2e" / "cluster"))
    import controlplane

    with contextlib.ExitStack() as stack:
        cp = stack.enter_context(controlplane.ControlPlane(
            controlplane.ensure_binaries(build=False), log_dir / "cp"))
        cp.apply((REPO / "crds" / "prefixroutedmodel.yaml").read_text())
        cp.kubectl("create", "namespace", NAMESPACE)
        op = start_operator(cp, log_dir / "operator")
        stack.callback(lambda: (op.terminate(), op.wait(15)))
        run = asyncio.run(_run(s, cp, log_dir))
    r = {**provenance, "date_utc": now_utc(), "settings": asdict(s), **run}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "deletion-writes.json").write_text(json.dumps(r, indent=1) + "\n")
    rows = [("engines (kwok pods, one simulator each)", s.engines), ("routers", s.routers),
            ("load", f"system-prompts, {s.rate:g} req/s"), ("requests", r["requests"]),
            ("errors", r["errors"]), ("window (s)", r["window_s"]),
            ("pod PATCHes before the window (first costs)", r["patches_before_window"]),
            ("pod PATCHes in the window", r["patches_in_window"]),
            ("pod PATCHes a minute", r["patches_per_minute"])]
    (out / "deletion-writes.md").write_text("\n".join([
        "# API server writes from pod deletion costs, under steady load", "",
        f"Written by `{command}` on {r['date_utc']}, {r['machine']}, code {r['version']}. "
        "bench/deletion_writes.py says what runs; `apiserver_request_total` of PATCH on pods, "
        "read every 15 s (deletion-writes.json has every sample with the costs then).", "",
        *md_table(("figure", "value"), [(k, fmt(v)) for k, v in rows]), ""]))
    print(f"  {r['patches_in_window']} pod patches in {r['window_s']} s: "
          f"{r['patches_per_minute']} a minute; {r['errors']} errors", flush=True)


if __name__ == "__main__":
    main()
