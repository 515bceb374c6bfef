"""Names, labels and selectors of the objects a PrefixRoutedModel owns: one place, so that
rendering, status lookups and the drift watchers agree on them."""

from __future__ import annotations

from .spec import Model

MODEL_LABEL = "prefixrouter.io/model"
COMPONENT_LABEL = "app.kubernetes.io/component"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "prefix-operator"
CONFIG_HASH_ANNOTATION = "prefixrouter.io/config-hash"

MODEL_SERVER = "model-server"
ROUTER = "router"
CACHE_STORE = "cache-store"

ROUTER_PORT = 8080
# The routers' /metrics, apart from their API: its series name every engine's address.
ROUTER_METRICS_PORT = 9090
REDIS_PORT = 6379


def model_server_name(model: Model) -> str:
    return f"{model.name}-model-server"


def router_name(model: Model) -> str:
    return f"{model.name}-router"


def redis_name(model: Model) -> str:
    return f"{model.name}-redis"


def hpa_name(model: Model) -> str:
    return model.name


def labels(model: Model, component: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "prefixroutedmodel",
        "app.kubernetes.io/instance": model.name,
        COMPONENT_LABEL: component,
        "app.kubernetes.io/part-of": "prefix-router",
        MANAGED_BY_LABEL: MANAGED_BY,
        MODEL_LABEL: model.name,
    }


def selector_labels(model: Model, component: str) -> dict[str, str]:
    """Deployment selectors are immutable: only labels that never change for a model."""
    return {MODEL_LABEL: model.name, COMPONENT_LABEL: component}


def selector_string(model: Model, component: str) -> str:
    return ",".join(f"{k}={v}" for k, v in selector_labels(model, component).items())


def router_url(model: Model) -> str:
    return f"http://{router_name(model)}.{model.namespace}.svc:{ROUTER_PORT}"


def managed_store_url(model: Model) -> str:
    return f"redis://{redis_name(model)}.{model.namespace}.svc:{REDIS_PORT}/0"


def store_url(model: Model) -> str:
    store = model.spec.cache_store
    if store.type == "external" and store.url:
        return store.url
    return managed_store_url(model)

