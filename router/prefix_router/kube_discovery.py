"""Backends from Kubernetes: the ready endpoints of the model-server Service's EndpointSlices.

A watch on EndpointSlices labelled `kubernetes.io/service-name=<service>` keeps the backend
set live; only endpoints whose `conditions.ready` is true (or unset, which the API defines as
ready) become backends. On any watch error the slices are listed again and the watch resumes,
so a restarted API server or an expired resourceVersion does not freeze the set.

Test-only: with `address_override_annotation` set, an endpoint whose pod carries that
annotation is reached at the annotation's host:port instead of the pod IP (kwok's fake pods
have IPs nothing listens on).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from typing import Any

from kubernetes_asyncio import client, config, watch
from kubernetes_asyncio.client.exceptions import ApiException

from .config import DiscoverySettings
from .discovery import OnChange, OnLeaving

log = logging.getLogger("prefix_router.kube_discovery")


def _namespace(settings: DiscoverySettings) -> str:
    if settings.namespace:
        return settings.namespace
    path = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
    if os.path.exists(path):
        with open(path) as f:
            return f.read().strip()
    return "default"


def ready_addresses(slice_obj: Any, port: int | None) -> list[tuple[str, int, str | None]]:
    """(address, port, pod name) of the ready endpoints of one EndpointSlice: on `port`, or
    on the slice's first port where it names others (or `port` is None)."""
    return _addresses(slice_obj, port, leaving=False)


def leaving_addresses(slice_obj: Any, port: int | None) -> list[tuple[str, int, str | None]]:
    """The same of its terminating endpoints: pods on their way out, whose requests in
    flight may still be running (the API keeps them in the slice with `terminating`)."""
    return _addresses(slice_obj, port, leaving=True)


def _addresses(
    slice_obj: Any, port: int | None, leaving: bool
) -> list[tuple[str, int, str | None]]:
    given = slice_obj.ports or []
    if port is None or (given and all(p.port != port for p in given)):
        port = next((p.port for p in given if p.port), port)
    if port is None:
        return []
    out = []
    for ep in slice_obj.endpoints or []:
        cond = ep.conditions
        ready = cond.ready if cond is not None and cond.ready is not None else True
        terminating = bool(cond is not None and cond.terminating)
        if not ep.addresses or not (terminating if leaving else ready):
            continue
        ref = ep.target_ref
        pod = ref.name if ref is not None and ref.kind == "Pod" else None
        out.append((ep.addresses[0], port, pod))
    return out


class KubernetesDiscovery:
    def __init__(self, settings: DiscoverySettings) -> None:
        self._s = settings
        self._ns = _namespace(settings)
        self._selector = f"kubernetes.io/service-name={settings.service}"
        self._task: asyncio.Task[None] | None = None
        self._slices: dict[str, list[tuple[str, int, str | None]]] = {}
        self._leaving: dict[str, list[tuple[str, int, str | None]]] = {}
        self._on_leaving: OnLeaving | None = None
        self._last_leaving: list[str] = []
        self._overrides: dict[str, str] = {}
        self._api: client.ApiClient | None = None
        self._last: list[str] | None = None

    async def start(self, on_change: OnChange, on_leaving: OnLeaving | None = None) -> None:
        if self._s.kubeconfig:
            await config.load_kube_config(config_file=self._s.kubeconfig)
        else:
            try:
                config.load_incluster_config()
            except config.ConfigException:
                await config.load_kube_config()
        self._api = client.ApiClient()
        self._on_change = on_change
        self._on_leaving = on_leaving
        rv = await self._list()
        self._task = asyncio.create_task(self._run(rv), name="kube-discovery")

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._api:
            await self._api.close()

    async def _list(self) -> str:
        assert self._api is not None
        api = client.DiscoveryV1Api(self._api)
        resp = await api.list_namespaced_endpoint_slice(self._ns, label_selector=self._selector)
        self._slices = {s.metadata.name: ready_addresses(s, self._s.port) for s in resp.items}
        self._leaving = {s.metadata.name: leaving_addresses(s, self._s.port) for s in resp.items}
        await self._publish()
        return resp.metadata.resource_version

    async def _run(self, rv: str | None) -> None:
        """Watch from `rv` (the list's version); list again on any error."""
        assert self._api is not None
        api = client.DiscoveryV1Api(self._api)
        while True:
            try:
                if rv is None:
                    rv = await self._list()
                w = watch.Watch()
                async with w.stream(
                    api.list_namespaced_endpoint_slice,
                    self._ns,
                    label_selector=self._selector,
                    resource_version=rv,
                    timeout_seconds=300,
                    allow_watch_bookmarks=True,
                ) as stream:
                    async for event in stream:
                        obj = event["object"]
                        kind = event["type"]
                        if kind == "BOOKMARK":
                            rv = obj.metadata.resource_version if hasattr(obj, "metadata") else rv
                            continue
                        if kind == "ERROR":
                            rv = None
                            break
                        rv = obj.metadata.resource_version
                        if kind == "DELETED":
                            self._slices.pop(obj.metadata.name, None)
                            self._leaving.pop(obj.metadata.name, None)
                        else:
                            self._slices[obj.metadata.name] = ready_addresses(obj, self._s.port)
                            self._leaving[obj.metadata.name] = leaving_addresses(
                                obj, self._s.port)
                        await self._publish()
            except ApiException as exc:
                rv = None
                if exc.status == 410:  # resourceVersion too old: list again
                    continue
                log.warning("endpointslice watch failed (%s); retrying", exc.status)
                await asyncio.sleep(1.0)
            except Exception as exc:  # a dropped connection must not end discovery
                log.warning("endpointslice watch error: %r; retrying", exc)
                rv = None
                await asyncio.sleep(1.0)

    async def _address(self, ip: str, port: int, pod: str | None) -> str:
        ann = self._s.address_override_annotation
        if ann and pod and pod not in self._overrides:
            assert self._api is not None
            try:
                p = await client.CoreV1Api(self._api).read_namespaced_pod(pod, self._ns)
                value = (p.metadata.annotations or {}).get(ann)
            except ApiException:
                value = None
            if value:
                self._overrides[pod] = value
        override = self._overrides.get(pod) if pod else None
        return "http://" + override if override else f"http://{ip}:{port}"

    async def _publish(self) -> None:
        urls: list[str] = []
        for eps in self._slices.values():
            for ip, port, pod in eps:
                urls.append(await self._address(ip, port, pod))
        leaving: list[str] = []
        if self._on_leaving is not None:
            # A member whose pod terminates stays one, marked leaving, until its endpoint goes:
            # the routers place nothing new there and hand its prefixes on (fleet_value.py).
            was = set(self._last or ())
            for eps in self._leaving.values():
                for ip, port, pod in eps:
                    url = await self._address(ip, port, pod)
                    if url in was and url not in urls:
                        leaving.append(url)
        current = sorted(set(urls) | set(leaving))
        if current != self._last:
            self._last = current
            log.info(
                "discovered %d ready backends (%d leaving) for service %s/%s",
                len(current) - len(set(leaving)),
                len(set(leaving)),
                self._ns,
                self._s.service,
            )
            self._on_change(current)
        leaving = sorted(set(leaving))
        if self._on_leaving is not None and leaving != self._last_leaving:
            self._last_leaving = leaving
            self._on_leaving(leaving)
