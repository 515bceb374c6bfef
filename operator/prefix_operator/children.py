"""Everything a PrefixRoutedModel owns, declared once, in apply order.

One row per child: its kind, its name, its component label, the function that renders its
body, whether the spec may turn it off, and which Observed field (and so which condition) it
feeds. Rendering (render_all), pruning (possible_refs minus what render_all made), the status
lookups (OBSERVED), the drift watches (WATCHED_KINDS, handlers.py) and the RBAC the chart must
grant the operator (permissions(), checked by tests/k8s/test_chart.py) all read this table.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

from . import API_VERSION, KIND, kinds, render
from .config import OperatorConfig
from .kinds import Kind
from .naming import (
    CACHE_STORE,
    MODEL_SERVER,
    ROUTER,
    hpa_name,
    labels,
    model_server_name,
    redis_name,
    router_name,
)
from .spec import Model

Manifest = dict[str, Any]


class Ref(NamedTuple):
    """One object of a model's namespace."""

    kind: Kind
    name: str


# The Observed fields a child can fill (status.py turns each into a condition).
ObservedField = Literal["model_server", "router", "redis", "hpa"]


def _always(_: Model) -> bool:
    return True


def _managed_store(model: Model) -> bool:
    return model.spec.cache_store.type == "managed"


def _autoscaling(model: Model) -> bool:
    return model.spec.autoscaling.enabled


def owner_reference(model: Model) -> dict[str, Any]:
    # controller=true makes the model the one managing owner; blockOwnerDeletion lets a
    # foreground deletion of the model wait for its children.
    return {"apiVersion": API_VERSION, "kind": KIND, "name": model.name, "uid": model.uid,
            "controller": True, "blockOwnerDeletion": True}


@dataclass(frozen=True)
class Child:
    kind: Kind
    name: Callable[[Model], str]
    component: str
    body: Callable[[Model, OperatorConfig], dict[str, Any]]
    # False for a spec that does not need this child: it is not rendered, and pruned if there.
    wanted: Callable[[Model], bool] = _always
    observed_as: ObservedField | None = None

    @property
    def conditional(self) -> bool:
        return self.wanted is not _always

    def ref(self, model: Model) -> Ref:
        return Ref(self.kind, self.name(model))

    def render(self, model: Model, cfg: OperatorConfig) -> Manifest:
        meta = {"name": self.name(model), "namespace": model.namespace,
                "labels": labels(model, self.component),
                "ownerReferences": [owner_reference(model)]}
        return {"apiVersion": self.kind.api_version, "kind": self.kind.kind, "metadata": meta,
                **self.body(model, cfg)}


# Identities and config first, then the Services, then the workloads that mount or use them.
CHILDREN: tuple[Child, ...] = (
    Child(kinds.SERVICE_ACCOUNT, router_name, ROUTER, render.router_service_account),
    Child(kinds.ROLE, router_name, ROUTER, render.router_role),
    Child(kinds.ROLE_BINDING, router_name, ROUTER, render.router_role_binding),
    Child(kinds.CONFIG_MAP, router_name, ROUTER, render.router_configmap),
    Child(kinds.SERVICE, model_server_name, MODEL_SERVER, render.model_server_service),
    Child(kinds.SERVICE, router_name, ROUTER, render.router_service),
    Child(kinds.SERVICE, redis_name, CACHE_STORE, render.redis_service, _managed_store),
    Child(kinds.DEPLOYMENT, redis_name, CACHE_STORE, render.redis_deployment, _managed_store,
          observed_as="redis"),
    Child(kinds.DEPLOYMENT, model_server_name, MODEL_SERVER, render.model_server_deployment,
          observed_as="model_server"),
    Child(kinds.DEPLOYMENT, router_name, ROUTER, render.router_deployment, observed_as="router"),
    Child(kinds.PDB, model_server_name, MODEL_SERVER, render.model_server_pdb),
    Child(kinds.PDB, router_name, ROUTER, render.router_pdb),
    Child(kinds.HPA, hpa_name, MODEL_SERVER, render.horizontal_pod_autoscaler, _autoscaling,
          observed_as="hpa"),
)

OBSERVED: tuple[Child, ...] = tuple(c for c in CHILDREN if c.observed_as)
# Watched so that a hand edit or deletion is repaired at once and status follows the
# Deployments' real state (the periodic resync is only the backstop).
WATCHED_KINDS: tuple[Kind, ...] = tuple(dict.fromkeys(c.kind for c in CHILDREN))

# What the reconciler does to every child kind: read it before applying (get), server-side
# apply (create when new, patch), and watch it for drift (list, watch).
CHILD_VERBS = ("get", "create", "patch", "list", "watch")
# And to a kind with a child the spec can turn off: prune it (delete).
PRUNE_VERB = "delete"
# The engine pods the model-server Deployment makes: listed and annotated with their deletion
# cost (cost_writer.py), never read one by one, created or deleted.
ENGINE_POD_VERBS = ("list", "patch")


def render_all(model: Model, cfg: OperatorConfig) -> list[Manifest]:
    """Every object this model should own, in apply order."""
    return [c.render(model, cfg) for c in CHILDREN if c.wanted(model)]


def possible_refs(model: Model) -> list[Ref]:
    """Every object this model may own under some spec: what is among them but not rendered
    for the current spec gets pruned."""
    return [c.ref(model) for c in CHILDREN]


def ref_of(obj: Manifest) -> Ref:
    return Ref(kinds.of(obj), obj["metadata"]["name"])


def permissions() -> set[tuple[str, str, str]]:
    """(API group, resource, verb) the reconciler needs on the children."""
    out: set[tuple[str, str, str]] = set()
    for c in CHILDREN:
        verbs = (*CHILD_VERBS, PRUNE_VERB) if c.conditional else CHILD_VERBS
        out |= {(c.kind.group, c.kind.plural, v) for v in verbs}
    out |= {(kinds.POD.group, kinds.POD.plural, v) for v in ENGINE_POD_VERBS}
    return out
