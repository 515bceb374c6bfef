"""The Reconciler's decisions against an in-memory API (no server): which objects it applies,
prunes and announces, and when it writes status. The real API server is in tests/k8s."""

from __future__ import annotations

import copy
from typing import Any

from operator_builders import body

from prefix_operator.config import OperatorConfig
from prefix_operator.kinds import MODEL, Kind
from prefix_operator.kube import KubeError
from prefix_operator.reconcile import Reconciler


class FakeKube:
    """Objects by (kind, namespace, name); apply bumps resourceVersion (and generation, for
    kinds that have one) only when the applied content differs, like server-side apply."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.rv = 0
        self.status_patches = 0
        self.reject: set[str] = set()

    def _key(self, kind: str, ns: str, name: str) -> tuple[str, str, str]:
        return kind, ns, name

    def put_model(self, obj: dict[str, Any]) -> None:
        m = obj["metadata"]
        self.objects[self._key("PrefixRoutedModel", m["namespace"], m["name"])] = obj

    def model(self, ns: str = "ml", name: str = "llama") -> dict[str, Any]:
        return self.objects[("PrefixRoutedModel", ns, name)]

    async def get(self, kind: Kind, ns: str, name: str) -> dict[str, Any] | None:
        obj = self.objects.get(self._key(kind.kind, ns, name))
        return copy.deepcopy(obj) if obj else None

    async def get_model(self, ns: str, name: str) -> dict[str, Any] | None:
        return await self.get(MODEL, ns, name)

    async def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        if obj["kind"] in self.reject:
            raise KubeError(422, "Invalid", f"{obj['kind']} is invalid: nope")
        m = obj["metadata"]
        key = self._key(obj["kind"], m["namespace"], m["name"])
        before = self.objects.get(key)
        content = {k: v for k, v in obj.items() if k != "metadata"}
        if before is not None and {k: v for k, v in before.items()
                                   if k not in ("metadata", "status")} == content:
            return copy.deepcopy(before)
        self.rv += 1
        new = copy.deepcopy(obj)
        new["metadata"]["resourceVersion"] = str(self.rv)
        if obj["kind"] == "Deployment":
            gen = (before or {}).get("metadata", {}).get("generation", 0) + 1
            new["metadata"]["generation"] = gen
            replicas = obj["spec"]["replicas"]
            new["status"] = {"observedGeneration": gen, "replicas": replicas,
                             "readyReplicas": replicas, "updatedReplicas": replicas}
        self.objects[key] = new
        return copy.deepcopy(new)

    async def delete(self, kind: Kind, ns: str, name: str) -> bool:
        return self.objects.pop(self._key(kind.kind, ns, name), None) is not None

    async def patch_model_status(self, ns: str, name: str,
                                 status: dict[str, Any]) -> dict[str, Any] | None:
        self.status_patches += 1
        model = self.model(ns, name)
        model.setdefault("status", {}).update(status)
        return model


def setup(**spec: Any) -> tuple[FakeKube, Reconciler, list[tuple[str, str]]]:
    kube = FakeKube()
    kube.put_model(body(**spec))
    seen: list[tuple[str, str]] = []
    r = Reconciler(kube, OperatorConfig(), lambda b, t, reason, msg: seen.append((t, reason)),
                   clock=lambda: "2026-01-01T00:00:00Z")
    return kube, r, seen


def kinds(kube: FakeKube) -> set[tuple[str, str]]:
    return {(k, n) for k, _, n in kube.objects if k != "PrefixRoutedModel"}


async def test_first_reconcile_creates_and_reports_ready() -> None:
    kube, r, seen = setup()
    out = await r.reconcile("ml", "llama")
    assert len(out.created) == 12 and not out.pruned
    assert seen.count(("Normal", "Created")) == 12
    assert ("Normal", "Ready") in seen
    st = kube.model()["status"]
    assert st["observedGeneration"] == 1
    assert st["conditions"][0]["type"] == "Ready" and st["conditions"][0]["status"] == "True"


async def test_a_second_run_changes_nothing_and_writes_nothing() -> None:
    kube, r, seen = setup()
    await r.reconcile("ml", "llama")
    patches, rv, n = kube.status_patches, kube.rv, len(seen)
    out = await r.reconcile("ml", "llama")
    assert out.created == [] and kube.rv == rv
    assert kube.status_patches == patches  # unchanged status is not rewritten
    assert len(seen) == n  # and nothing is announced


async def test_a_deleted_child_is_drift_and_is_recreated() -> None:
    kube, r, seen = setup()
    await r.reconcile("ml", "llama")
    del kube.objects[("Deployment", "ml", "llama-router")]
    out = await r.reconcile("ml", "llama")
    assert out.created == ["Deployment/llama-router"]
    assert seen[-1] == ("Warning", "DriftRepaired")


async def test_a_spec_change_is_an_update_not_drift() -> None:
    kube, r, seen = setup()
    await r.reconcile("ml", "llama")
    model = kube.model()
    model["spec"]["router"] = {"loadBound": 0.75}
    model["metadata"]["generation"] = 2
    seen.clear()
    await r.reconcile("ml", "llama")
    updated = {reason for _, reason in seen}
    assert updated == {"Updated"}
    assert kube.objects[("Deployment", "ml", "llama-model-server")]["metadata"][
        "generation"] == 1  # untouched
    assert kube.objects[("Deployment", "ml", "llama-router")]["metadata"]["generation"] == 2


async def test_objects_the_spec_no_longer_needs_are_pruned() -> None:
    kube, r, _seen = setup(router={"kvCapacityTokens": 1000}, autoscaling={"enabled": True})
    await r.reconcile("ml", "llama")
    assert ("HorizontalPodAutoscaler", "llama") in kinds(kube)
    model = kube.model()
    model["spec"]["autoscaling"] = {"enabled": False}
    model["spec"]["cacheStore"] = {"type": "external", "url": "redis://127.0.0.1:1"}
    model["metadata"]["generation"] = 2
    r.cfg = OperatorConfig(store_timeout_seconds=0.2)
    out = await r.reconcile("ml", "llama")
    assert set(out.pruned) == {"HorizontalPodAutoscaler/llama", "Deployment/llama-redis",
                               "Service/llama-redis"}
    ready = kube.model()["status"]["conditions"][0]
    assert (ready["status"], ready["reason"]) == ("False", "ExternalStoreUnreachable")


async def test_an_invalid_spec_applies_nothing() -> None:
    kube, r, _seen = setup(engine={"args": ["--port", "1"]})
    out = await r.reconcile("ml", "llama")
    assert out.applied == [] and kinds(kube) == set()
    ready = kube.model()["status"]["conditions"][0]
    assert (ready["status"], ready["reason"]) == ("False", "ConflictingEngineArgs")


async def test_a_rejected_object_is_reported_not_raised() -> None:
    kube, r, seen = setup()
    kube.reject.add("Deployment")
    await r.reconcile("ml", "llama")
    ready = kube.model()["status"]["conditions"][0]
    assert (ready["status"], ready["reason"]) == ("False", "DeploymentRejected")
    assert ("Warning", "DeploymentRejected") in seen


async def test_a_deleting_model_is_left_to_garbage_collection() -> None:
    kube, r, _seen = setup()
    kube.model()["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    out = await r.reconcile("ml", "llama")
    assert out.skipped == "deleting" and kinds(kube) == set()
