"""The Kubernetes kinds the operator reads and writes, each with its API group, version and
plural once: manifests, API paths, watches and the chart's RBAC test all take them from here."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import GROUP, KIND, PLURAL, VERSION


@dataclass(frozen=True)
class Kind:
    kind: str
    group: str  # "" is the core group
    version: str
    plural: str

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(self, namespace: str, name: str | None = None) -> str:
        """The REST path of one object, or of the namespace's collection without a name."""
        base = f"/apis/{self.api_version}" if self.group else f"/api/{self.version}"
        path = f"{base}/namespaces/{namespace}/{self.plural}"
        return f"{path}/{name}" if name else path


SERVICE_ACCOUNT = Kind("ServiceAccount", "", "v1", "serviceaccounts")
CONFIG_MAP = Kind("ConfigMap", "", "v1", "configmaps")
SERVICE = Kind("Service", "", "v1", "services")
SECRET = Kind("Secret", "", "v1", "secrets")
POD = Kind("Pod", "", "v1", "pods")
ROLE = Kind("Role", "rbac.authorization.k8s.io", "v1", "roles")
ROLE_BINDING = Kind("RoleBinding", "rbac.authorization.k8s.io", "v1", "rolebindings")
DEPLOYMENT = Kind("Deployment", "apps", "v1", "deployments")
PDB = Kind("PodDisruptionBudget", "policy", "v1", "poddisruptionbudgets")
HPA = Kind("HorizontalPodAutoscaler", "autoscaling", "v2", "horizontalpodautoscalers")
MODEL = Kind(KIND, GROUP, VERSION, PLURAL)

_BY_TYPE = {(k.api_version, k.kind): k for k in (
    SERVICE_ACCOUNT, CONFIG_MAP, SERVICE, SECRET, ROLE, ROLE_BINDING, DEPLOYMENT, PDB, HPA, MODEL)}


def of(obj: dict[str, Any]) -> Kind:
    """The Kind of a manifest (KeyError for a kind the operator does not handle)."""
    return _BY_TYPE[(obj["apiVersion"], obj["kind"])]
