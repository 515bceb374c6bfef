"""The router in Kubernetes discovery mode against the real local control plane.

kwok's pod IPs are not reachable, so each pod carries a test-only annotation that maps it to
a simulator on 127.0.0.1; the router reads it because its settings name that annotation.
"""

from __future__ import annotations

import sys
import uuid
from pathlib import Path

import aiohttp
import pytest
from waiting import scaled, until

from bench.harness.fleet import Fleet, free_port

pytestmark = [pytest.mark.k8s, pytest.mark.slow]

ANNOTATION = "prefixrouter.io/test-address"
MODEL = "test-model"


@pytest.fixture
def ns(control_plane):
    name = f"rd-{uuid.uuid4().hex[:8]}"
    control_plane.kubectl("create", "namespace", name)
    control_plane.wait_for(
        lambda: (
            control_plane.kubectl(
                "get", "serviceaccount", "default", "-n", name, check=False
            ).returncode
            == 0
        ),
        30,
        f"the default ServiceAccount in {name}",
    )
    yield name
    control_plane.kubectl("delete", "namespace", name, "--wait=false", check=False)


def pod(name: str, ns: str, address: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": ns,
            "labels": {"app": "engine"},
            "annotations": {ANNOTATION: address},
        },
        "spec": {
            "containers": [
                {
                    "name": "engine",
                    "image": "example.invalid/engine:1",
                    "ports": [{"containerPort": 8000, "name": "http"}],
                }
            ]
        },
    }


async def test_router_follows_ready_endpoints(control_plane, ns, tmp_path: Path):
    cp = control_plane
    cp.apply(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "engine", "namespace": ns},
            "spec": {
                "clusterIP": "None",
                "selector": {"app": "engine"},
                "ports": [{"name": "http", "port": 8000, "targetPort": 8000}],
            },
        }
    )
    async with Fleet(tmp_path / "logs") as fleet:
        sims = [
            await fleet.start_sim(
                f"sim{i}", model=MODEL, kv_capacity=50_000, profile="fast", time_scale=1.0
            )
            for i in range(2)
        ]
        cfg = tmp_path / "router.yaml"
        cfg.write_text(
            "discovery:\n"
            "  mode: kubernetes\n"
            f"  namespace: {ns}\n"
            "  service: engine\n"
            "  port: 8000\n"
            f"  kubeconfig: {cp.kubeconfig}\n"
            f"  address_override_annotation: {ANNOTATION}\n"
            "health: {probe_interval_s: 0.3}\n"
        )
        # The router starts with no backend at all: it is alive (/healthz) and /readyz must
        # wait for the first endpoint.
        port = free_port()
        router = await fleet.start(
            "router",
            [sys.executable, "-m", "prefix_router", "--host", "127.0.0.1", "--port", str(port),
             "--policy", "prefix", "--kv-capacity-tokens", "50000", "--log-level", "warning",
             "--expose-routing", "--config", str(cfg)],
            port, "/healthz", timeout=scaled(30),
        )  # fmt: skip
        async with aiohttp.ClientSession() as s:

            async def readyz() -> int:
                async with s.get(router.url + "/readyz") as r:
                    return r.status

            assert await readyz() == 503
            for i, sim in enumerate(sims):
                cp.apply(pod(f"engine-{i}", ns, sim.url.removeprefix("http://")))

            async def ready_backends() -> int:
                async with s.get(router.url + "/readyz") as r:
                    return (await r.json())["healthy_backends"]

            async def wait_count(n: int) -> None:
                async def seen() -> bool:
                    return await ready_backends() == n

                await until(seen, 60, f"the router to see {n} ready backends", interval=0.3)

            await wait_count(2)
            seen = set()
            for i in range(6):
                body = {"model": MODEL, "prompt": f"question {i} " * 40, "max_tokens": 2}
                async with s.post(router.url + "/v1/completions", json=body) as r:
                    assert r.status == 200, await r.text()
                    seen.add(r.headers["x-routed-to"])
            assert seen <= {p.url for p in sims}

            cp.kubectl("delete", "pod", "engine-0", "-n", ns, "--grace-period=0", "--force")
            await wait_count(1)
            for i in range(4):
                body = {"model": MODEL, "prompt": f"after {i} " * 40, "max_tokens": 2}
                async with s.post(router.url + "/v1/completions", json=body) as r:
                    assert r.status == 200
                    assert r.headers["x-routed-to"] == sims[1].url


async def test_a_terminating_engine_takes_nothing_new_and_hands_its_prefixes_on(
        control_plane, ns, tmp_path: Path):
    """A pod on its way out (deleted, held Terminating by a finalizer, as a pod in its grace
    period) stays a member of the router's set, marked leaving: no new request goes there,
    and the prefixes it alone held are found on one successor (hits there, not misses)."""
    cp = control_plane
    cp.apply({"apiVersion": "v1", "kind": "Service",
              "metadata": {"name": "engine", "namespace": ns},
              "spec": {"clusterIP": "None", "selector": {"app": "engine"},
                       "ports": [{"name": "http", "port": 8000, "targetPort": 8000}]}})
    async with Fleet(tmp_path / "logs") as fleet:
        sims = [await fleet.start_sim(f"sim{i}", model=MODEL, kv_capacity=50_000,
                                      profile="fast", time_scale=1.0) for i in range(3)]
        cfg = tmp_path / "router.yaml"
        cfg.write_text(
            f"discovery:\n  mode: kubernetes\n  namespace: {ns}\n  service: engine\n"
            f"  port: 8000\n  kubeconfig: {cp.kubeconfig}\n"
            f"  address_override_annotation: {ANNOTATION}\n"
            "health: {probe_interval_s: 0.3}\n")
        port = free_port()
        router = await fleet.start(
            "router",
            [sys.executable, "-m", "prefix_router", "--host", "127.0.0.1", "--port", str(port),
             "--policy", "prefix", "--kv-capacity-tokens", "50000", "--log-level", "warning",
             "--expose-routing", "--config", str(cfg)],
            port, "/healthz", timeout=scaled(30))  # fmt: skip
        for i, sim in enumerate(sims):
            body = pod(f"engine-{i}", ns, sim.url.removeprefix("http://"))
            body["metadata"]["finalizers"] = ["prefixrouter.io/test-hold"]
            cp.apply(body)
        async with aiohttp.ClientSession() as s:

            async def readyz() -> dict:
                async with s.get(router.url + "/readyz") as r:
                    return await r.json()

            async def send(prompt: str) -> tuple[str, str]:
                body = {"model": MODEL, "prompt": prompt, "max_tokens": 2}
                async with s.post(router.url + "/v1/completions", json=body) as r:
                    assert r.status == 200, await r.text()
                    return r.headers["x-routed-to"], r.headers["x-route-reason"]

            async def all_ready() -> bool:
                return (await readyz())["healthy_backends"] == 3

            await until(all_ready, 60, "the router to see 3 ready backends", interval=0.3)
            holder: dict[str, str] = {}
            for i in range(12):
                prompt = f"tenant {i} system prompt " * 40
                holder[prompt] = (await send(prompt + "first"))[0]
                await send(prompt + "second")  # asked for again: only its engine holds it
            leaving = max(holder.values(), key=list(holder.values()).count)
            index = next(i for i, sim in enumerate(sims) if sim.url == leaving)
            cp.kubectl("delete", "pod", f"engine-{index}", "-n", ns, "--wait=false")

            async def terminating_seen() -> bool:
                # still a member, no longer placed on: the first follower of one of its
                # prefixes goes elsewhere
                return (await readyz())["backends"] == 3 and \
                    (await send(next(p for p, b in holder.items() if b == leaving) + "probe"))[0] \
                    != leaving
            await until(terminating_seen, 60, "the router to mark the engine leaving",
                        interval=0.3)
            for prompt, b in holder.items():
                to, why = await send(prompt + "follower")
                assert to != leaving
                if b == leaving:
                    assert why == "hit", (prompt[:20], to, why)
                    assert (await send(prompt + "another"))[0] == to  # they meet there
        for i in range(3):
            cp.kubectl("patch", "pod", f"engine-{i}", "-n", ns, "--type=merge",
                       "-p", '{"metadata": {"finalizers": null}}', check=False)
