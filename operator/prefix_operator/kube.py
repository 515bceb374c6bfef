"""A small async Kubernetes API client: get, server-side apply, merge-patch status, delete.

kopf brings no apply client, so this speaks the REST API through kubernetes_asyncio's
ApiClient (auth, TLS and kubeconfig handling) with plain paths; the kinds the operator owns
are few enough that their paths are a table (kinds.py) rather than a discovery round trip.
"""

from __future__ import annotations

import json
from typing import Any

from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException

from . import FIELD_MANAGER, kinds
from .kinds import Kind

# Errors worth retrying: conflicts, throttling, server-side trouble.
TEMPORARY_STATUSES = frozenset({409, 429, 500, 502, 503, 504})


class KubeError(Exception):
    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"HTTP {status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message

    @property
    def temporary(self) -> bool:
        return self.status in TEMPORARY_STATUSES or self.status == 0


def _error(e: ApiException) -> KubeError:
    message = e.reason or ""
    reason = ""
    try:
        body = json.loads(e.body or "{}")
        message = body.get("message", message)
        reason = body.get("reason", "")
    except (TypeError, ValueError):
        pass
    return KubeError(int(e.status or 0), reason, message)


async def connect(kubeconfig: str | None = None) -> client.ApiClient:
    """The API client of every part (operator, leader election, metrics adapter): `kubeconfig`
    when given, else in-cluster credentials when running in a pod, else $KUBECONFIG /
    ~/.kube/config, which is what kopf uses too: all talk to one cluster as one user."""
    if kubeconfig is None:
        try:
            config.load_incluster_config()
            return client.ApiClient(client.Configuration.get_default_copy())
        except config.ConfigException:
            pass
    cfg = client.Configuration()
    await config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
    return client.ApiClient(cfg)


class Kube:
    def __init__(self, api: client.ApiClient) -> None:
        self._api = api

    async def close(self) -> None:
        await self._api.close()

    async def request(self, method: str, path: str, *, body: Any = None,
                      query: list[tuple[str, str]] | None = None,
                      content_type: str = "application/json") -> dict[str, Any] | None:
        headers = {"Accept": "application/json", "Content-Type": content_type}
        try:
            resp = await self._api.call_api(
                path, method, query_params=query or [], header_params=headers,
                body=body, auth_settings=["BearerToken"], _preload_content=False,
                _request_timeout=30,
            )
        except ApiException as e:
            raise _error(e) from None
        except (OSError, TimeoutError) as e:
            raise KubeError(0, "ConnectionError", str(e)) from None
        raw = await resp.read()
        status = getattr(resp, "status", 200)
        if status >= 400:
            # Unpreloaded responses come back whatever their status: raise as the API would.
            err = ApiException(status=status, reason=getattr(resp, "reason", ""))
            err.body = raw.decode(errors="replace") if raw else None
            raise _error(err)
        return json.loads(raw) if raw else None

    async def get(self, kind: Kind, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return await self.request("GET", kind.path(namespace, name))
        except KubeError as e:
            if e.status == 404:
                return None
            raise

    async def apply(self, obj: dict[str, Any], *, force: bool = True) -> dict[str, Any]:
        """Server-side apply as field manager prefix-operator; force takes fields back from
        whoever changed them by hand (that is what repairing drift means)."""
        meta = obj["metadata"]
        path = kinds.of(obj).path(meta["namespace"], meta["name"])
        query = [("fieldManager", FIELD_MANAGER), ("force", "true" if force else "false")]
        out = await self.request("PATCH", path, body=obj, query=query,
                                 content_type="application/apply-patch+yaml")
        assert out is not None
        return out

    async def delete(self, kind: Kind, namespace: str, name: str) -> bool:
        try:
            await self.request("DELETE", kind.path(namespace, name),
                               body={"propagationPolicy": "Background"})
            return True
        except KubeError as e:
            if e.status == 404:
                return False
            raise

    async def get_model(self, namespace: str, name: str) -> dict[str, Any] | None:
        return await self.get(kinds.MODEL, namespace, name)

    async def patch_model_status(self, namespace: str, name: str,
                                 status: dict[str, Any]) -> dict[str, Any] | None:
        """JSON merge patch of the status subresource (lists such as conditions are replaced
        whole, which is what we want: we always write the complete list)."""
        path = kinds.MODEL.path(namespace, name) + "/status"
        try:
            return await self.request("PATCH", path, body={"status": status},
                                      content_type="application/merge-patch+json")
        except KubeError as e:
            if e.status == 404:  # deleted meanwhile
                return None
            raise

    async def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        out = await self.request("GET", kinds.POD.path(namespace),
                                 query=[("labelSelector", selector)])
        return list((out or {}).get("items") or [])

    async def annotate_pod(self, namespace: str, name: str,
                           annotations: dict[str, str | None]) -> bool:
        """Merge-patch a pod's annotations (None removes one); False when it is gone."""
        try:
            await self.request("PATCH", kinds.POD.path(namespace, name),
                               body={"metadata": {"annotations": annotations}},
                               content_type="application/merge-patch+json")
            return True
        except KubeError as e:
            if e.status == 404:
                return False
            raise
