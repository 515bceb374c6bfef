"""What the metrics adapter serves at external.metrics.k8s.io/v1beta1, computed purely from the
models and the figures their routers publish (see figures.py); the HTTP edge is adapter.py.

Metrics are TOTALS per model, not ratios: the HPA sums the items it gets and, for an
AverageValue target, asks for ceil(total / target) replicas. With the targets the operator
renders (render.horizontal_pod_autoscaler) that division is the capacity model itself:

    prefix_router_working_set_tokens / (kvCapacityTokens x targetCachePressure)
    prefix_router_in_flight          / targetLoad
    prefix_router_demand             / targetLoad   (in flight + queued: waiting demand)

and, for dashboards and custom HPAs, prefix_router_queued (requests waiting in the routers'
dispatch queues) and prefix_router_queue_oldest_wait_seconds (the longest wait: a max).

The names are the contract's (prefix_router.contract), the same as the routers' own series.

A model none of whose routers reported within the staleness window yields no item at all, so
the HPA holds its replica count instead of scaling on a made-up zero.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from prefix_router.contract import (
    DEMAND_METRIC,
    IN_FLIGHT_METRIC,
    OLDEST_WAIT_METRIC,
    QUEUED_METRIC,
    WORKING_SET_METRIC,
    RouterFigures,
)

from .figures import STALE_AFTER_SECONDS, Totals, totals
from .naming import MODEL_LABEL

GROUP = "external.metrics.k8s.io"
VERSION = "v1beta1"
GROUP_VERSION = f"{GROUP}/{VERSION}"

# the ones an autoscaler scales on (the HPA the operator renders, the chart's KEDA triggers)
SCALING = (WORKING_SET_METRIC, IN_FLIGHT_METRIC, DEMAND_METRIC)
METRICS = (*SCALING, QUEUED_METRIC, OLDEST_WAIT_METRIC)

# The label that carries a model's namespace in its metrics (the HPA's selector names it, so
# that one selector string is unambiguous even outside the request path's namespace).
NAMESPACE_LABEL = "prefixrouter.io/namespace"


def value(t: Totals, metric: str) -> float:
    if metric == WORKING_SET_METRIC:
        return t.working_set_tokens
    if metric == IN_FLIGHT_METRIC:
        return t.in_flight
    if metric == DEMAND_METRIC:
        return t.demand
    if metric == QUEUED_METRIC:
        return t.queued
    if metric == OLDEST_WAIT_METRIC:
        return t.oldest_wait_s
    raise KeyError(metric)


# --------------------------------------------------------------------------- label selectors

_KEY = r"[A-Za-z0-9][-A-Za-z0-9_./]*"
_VALUE = r"[-A-Za-z0-9_.]*"
_SET_RE = re.compile(rf"^({_KEY})\s+(in|notin)\s+\(\s*([^()]*)\)$")
_CMP_RE = re.compile(rf"^({_KEY})\s*(==|!=|=)\s*({_VALUE})$")
_EXISTS_RE = re.compile(rf"^(!?)\s*({_KEY})$")


@dataclass(frozen=True)
class Requirement:
    key: str
    op: str  # "in", "notin", "exists", "!exists"
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        if self.op == "exists":
            return self.key in labels
        if self.op == "!exists":
            return self.key not in labels
        if self.op == "in":
            return self.key in labels and labels[self.key] in self.values
        # notin, like Kubernetes: true when the label is absent too.
        return labels.get(self.key) not in self.values


@dataclass(frozen=True)
class Selector:
    """A parsed Kubernetes label selector (the string form the HPA sends); empty matches all."""

    requirements: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(r.matches(labels) for r in self.requirements)


def _split_top_level(text: str) -> list[str]:
    """Split on commas outside parentheses: `a in (x,y),b=c` is two requirements."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced ')' in label selector {text!r}")
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth:
        raise ValueError(f"unbalanced '(' in label selector {text!r}")
    parts.append(text[start:])
    return parts


def parse_selector(text: str | None) -> Selector:
    """Equality (`=`, `==`, `!=`), set (`in`, `notin`) and existence (`k`, `!k`) requirements.
    Raises ValueError on anything else (the caller answers 400 BadRequest)."""
    text = (text or "").strip()
    if not text:
        return Selector()
    reqs: list[Requirement] = []
    for raw in _split_top_level(text):
        part = raw.strip()
        if m := _SET_RE.match(part):
            values = frozenset(v.strip() for v in m.group(3).split(",") if v.strip())
            reqs.append(Requirement(m.group(1), m.group(2), values))
        elif m := _CMP_RE.match(part):
            key, op, value = m.groups()
            reqs.append(Requirement(key, "notin" if op == "!=" else "in", frozenset({value})))
        elif m := _EXISTS_RE.match(part):
            reqs.append(Requirement(m.group(2), "!exists" if m.group(1) else "exists"))
        else:
            raise ValueError(f"cannot parse label selector requirement {part!r}")
    return Selector(tuple(reqs))


# --------------------------------------------------------------------------- API objects


def metric_labels(body: Mapping[str, Any]) -> dict[str, str]:
    """The labels a model's metrics carry: its own metadata labels, then ours (which win, so
    `prefixrouter.io/model=NAME` always means the model of that name)."""
    meta = body.get("metadata") or {}
    return {**(meta.get("labels") or {}),
            MODEL_LABEL: meta.get("name", ""), NAMESPACE_LABEL: meta.get("namespace", "")}


def quantity(value: float) -> str:
    """A Kubernetes quantity string: whole numbers plain, fractions in milli-units."""
    if float(value).is_integer():
        return str(int(value))
    return f"{round(value * 1000)}m"


def rfc3339(unix_seconds: float) -> str:
    return datetime.fromtimestamp(unix_seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def metric_items(metric: str,
                 models: Iterable[tuple[Mapping[str, str], Sequence[RouterFigures]]],
                 selector: Selector, *, now: float,
                 stale_after: float = STALE_AFTER_SECONDS) -> list[dict[str, Any]]:
    """ExternalMetricValue items of `metric` for the (labels, published) pairs the selector
    picks; models without fresh figures are left out, never reported as zero."""
    items: list[dict[str, Any]] = []
    for labels, published in models:
        if not selector.matches(labels):
            continue
        t = totals(published, now=now, stale_after=stale_after)
        if t is None:
            continue
        items.append({
            "metricName": metric,
            "metricLabels": dict(labels),
            "timestamp": rfc3339(t.updated_at),
            "value": quantity(value(t, metric)),
        })
    return items


def value_list(items: list[dict[str, Any]]) -> dict[str, Any]:
    return {"kind": "ExternalMetricValueList", "apiVersion": GROUP_VERSION, "metadata": {},
            "items": items}


def api_group() -> dict[str, Any]:
    version = {"groupVersion": GROUP_VERSION, "version": VERSION}
    return {"kind": "APIGroup", "apiVersion": "v1", "name": GROUP, "versions": [version],
            "preferredVersion": version}


def api_group_list() -> dict[str, Any]:
    group = api_group()
    del group["kind"], group["apiVersion"]
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [group]}


def api_resource_list() -> dict[str, Any]:
    # The shape custom-metrics-apiserver (prometheus-adapter, KEDA) serves: one namespaced
    # resource per metric name, read with `get`.
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": GROUP_VERSION,
            "resources": [{"name": m, "singularName": "", "namespaced": True,
                           "kind": "ExternalMetricValueList", "verbs": ["get"]}
                          for m in METRICS]}


# kube-apiserver's OpenAPI aggregation downloads /openapi/v2 and /openapi/v3 from every
# aggregated API server; a 404 is logged as an error and retried with backoff forever. We
# publish no schemas (the metric values are the only objects, and nothing validates them), so
# these documents are valid and empty.
OPENAPI_INFO = {"title": "prefix-metrics-adapter", "version": GROUP_VERSION}
OPENAPI_V3_PATH = f"/openapi/v3/apis/{GROUP_VERSION}"


def openapi_v2() -> dict[str, Any]:
    return {"swagger": "2.0", "info": dict(OPENAPI_INFO), "paths": {}, "definitions": {}}


def openapi_v3_discovery() -> dict[str, Any]:
    return {"paths": {f"apis/{GROUP_VERSION}": {"serverRelativeURL": OPENAPI_V3_PATH}}}


def openapi_v3() -> dict[str, Any]:
    return {"openapi": "3.0.0", "info": dict(OPENAPI_INFO), "paths": {},
            "components": {"schemas": {}}}


def status(code: int, reason: str, message: str) -> dict[str, Any]:
    """A Kubernetes Status body: what kubectl and the HPA controller understand as an error."""
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code}
