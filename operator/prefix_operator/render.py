"""The bodies of everything a PrefixRoutedModel owns, as plain dicts: pure, no I/O.

Each function returns one object's content without apiVersion, kind and metadata, which
children.py adds from its table (the one place that says what a model owns). Each object is
rendered whole and applied with server-side apply, so re-rendering is the way to repair drift
and to roll a spec change: an object whose rendering did not change is a no-op on the API server
(no new generation, no rollout).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import yaml

from prefix_router.contract import (
    DEMAND_METRIC,
    IN_FLIGHT_METRIC,
    WORKING_SET_METRIC,
    RouterSettings,
)

from . import API_VERSION, KIND
from .config import OperatorConfig
from .external_metrics import NAMESPACE_LABEL
from .naming import (
    CACHE_STORE,
    CONFIG_HASH_ANNOTATION,
    MODEL_LABEL,
    MODEL_SERVER,
    REDIS_PORT,
    ROUTER,
    ROUTER_METRICS_PORT,
    ROUTER_PORT,
    labels,
    model_server_name,
    router_name,
    selector_labels,
    store_url,
)
from .spec import Model

Body = dict[str, Any]

ROUTER_CONFIG_DIR = "/etc/prefix-router"
ROUTER_CONFIG_FILE = "router.yaml"
ROUTER_CACHE_DIR = "/var/cache/prefix-router"
MODELS_MOUNT = "/models"
HF_HOME = "/root/.cache/huggingface"
REDIS_PASSWORD_ENV = "REDIS_PASSWORD"

# A router pod being replaced leaves the Service's endpoints when it starts terminating, and
# kube-proxy needs a moment to stop sending it new connections: the preStop pause holds SIGTERM
# back that long, then the router drains (readiness off, listener open through its grace
# period) and the streams it still carries finish within the termination grace period.
ROUTER_PRESTOP_SECONDS = 5
ROUTER_TERMINATION_GRACE_SECONDS = 120
# The router image's user (the Dockerfile's uid/gid 10001, as the chart runs its pods): nothing
# is written at run time, so the root filesystem is read-only and no capability is kept.
ROUTER_POD_SECURITY = {"runAsNonRoot": True, "runAsUser": 10001, "runAsGroup": 10001,
                       "seccompProfile": {"type": "RuntimeDefault"}}
ROUTER_CONTAINER_SECURITY = {"runAsNonRoot": True, "allowPrivilegeEscalation": False,
                             "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]}}

# Env names the operator sets on the engine container; user env must not shadow them.
ENGINE_ENV = (
    "PREFIXROUTER_MODEL_NAME",
    "PREFIXROUTER_MODEL_SOURCE",
    "PREFIXROUTER_ENGINE_PORT",
    "PREFIXROUTER_BLOCK_SIZE",
    "HF_HOME",
    "HF_TOKEN",
)

# RouterSpec fields that shape the router's Deployment; every other one is the router setting
# of the same name (router_settings).
ROUTER_DEPLOYMENT_FIELDS = frozenset({"replicas", "image", "cpu", "memory"})
# Router settings the operator derives from the engine when the spec leaves them unset.
ROUTER_DERIVED_FIELDS = frozenset({"index", "tokenizer"})
# Where vLLM publishes its KV events (--kv-events-config) and serves their replay.
KV_EVENTS_PORT = 5557
KV_REPLAY_PORT = 5558


# --------------------------------------------------------------------------- model servers


def engine_model_arg(model: Model) -> str:
    """What the engine loads: a Hugging Face id, or a path under the PVC mount."""
    source = model.spec.model.source
    if source.startswith("pvc://"):
        _, _, path = source[len("pvc://"):].partition("/")
        return f"{MODELS_MOUNT}/{path}".rstrip("/")
    return source.removeprefix("hf://")


def pvc_claim(model: Model) -> str | None:
    source = model.spec.model.source
    if not source.startswith("pvc://"):
        return None
    return source[len("pvc://"):].partition("/")[0]


def engine_image(model: Model, cfg: OperatorConfig) -> str:
    engine = model.spec.engine
    if engine.image:
        return engine.image
    return cfg.sglang_image if engine.type == "sglang" else cfg.vllm_image


def engine_command_args(model: Model) -> tuple[list[str] | None, list[str]]:
    """(command, args) of the engine container; command None keeps the image's entrypoint."""
    spec = model.spec
    engine = spec.engine
    served = spec.model.name
    block = str(spec.router.block_size)
    gpus = spec.resources.gpus
    if engine.type == "vllm":
        # Prefix caching and a block size equal to the router's: the router's block hashes then
        # line up with the engine's KV blocks, which is what makes a predicted hit a real one.
        # The cached tokens of each answer, and the KV events, tell the routers what it holds.
        events = {"enable_kv_cache_events": True, "publisher": "zmq",
                  "endpoint": f"tcp://*:{KV_EVENTS_PORT}",
                  "replay_endpoint": f"tcp://*:{KV_REPLAY_PORT}"}  # fmt: skip
        args = [engine_model_arg(model), "--served-model-name", served,
                "--host", "0.0.0.0", "--port", str(engine.port),
                "--enable-prefix-caching", "--block-size", block,
                "--enable-prompt-tokens-details",
                "--kv-events-config", json.dumps(events, separators=(",", ":"))]
        if gpus > 1:
            args += ["--tensor-parallel-size", str(gpus)]
        if spec.model.revision:
            args += ["--revision", spec.model.revision]
        return ["vllm", "serve"], args + list(engine.args)
    if engine.type == "sglang":
        # SGLang's radix cache is its prefix cache (on by default); --page-size is its block.
        args = ["--model-path", engine_model_arg(model), "--served-model-name", served,
                "--host", "0.0.0.0", "--port", str(engine.port), "--page-size", block]
        if gpus > 1:
            args += ["--tp-size", str(gpus)]
        if spec.model.revision:
            args += ["--revision", spec.model.revision]
        return ["python3", "-m", "sglang.launch_server"], args + list(engine.args)
    return None, list(engine.args)


def _kv_event_ports(model: Model) -> list[dict[str, Any]]:
    if model.spec.engine.type != "vllm":
        return []
    return [{"name": "kv-events", "containerPort": KV_EVENTS_PORT, "protocol": "TCP"},
            {"name": "kv-replay", "containerPort": KV_REPLAY_PORT, "protocol": "TCP"}]


def _engine_env(model: Model) -> list[dict[str, Any]]:
    spec = model.spec
    env: list[dict[str, Any]] = [
        # Custom images read these; vLLM and SGLang get the same facts as arguments.
        {"name": "PREFIXROUTER_MODEL_NAME", "value": spec.model.name},
        {"name": "PREFIXROUTER_MODEL_SOURCE", "value": engine_model_arg(model)},
        {"name": "PREFIXROUTER_ENGINE_PORT", "value": str(spec.engine.port)},
        {"name": "PREFIXROUTER_BLOCK_SIZE", "value": str(spec.router.block_size)},
    ]
    if pvc_claim(model) is None:
        env.append({"name": "HF_HOME", "value": HF_HOME})
    ref = spec.model.hf_token_secret_ref
    if ref is not None:
        env.append({"name": "HF_TOKEN",
                    "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}})
    env += [{"name": e.name, "value": e.value} for e in spec.engine.env]
    return env


def _probe(path: str, port: str, *, period: int, failures: int, timeout: int = 5,
           initial: int = 0) -> dict[str, Any]:
    probe: dict[str, Any] = {
        "httpGet": {"path": path, "port": port},
        "periodSeconds": period,
        "failureThreshold": failures,
        "timeoutSeconds": timeout,
    }
    if initial:
        probe["initialDelaySeconds"] = initial
    return probe


ENGINE_ROLLOUT = {"maxSurge": 1, "maxUnavailable": 0}


def model_server_deployment(model: Model, cfg: OperatorConfig) -> Body:
    spec = model.spec
    res = spec.resources
    engine = spec.engine
    command, args = engine_command_args(model)
    requests: dict[str, str] = {"cpu": res.cpu, "memory": res.memory}
    limits: dict[str, str] = {"memory": res.memory}
    if res.gpus > 0:
        # Extended resources must be requested and limited alike.
        requests[res.gpu_resource_name] = str(res.gpus)
        limits[res.gpu_resource_name] = str(res.gpus)
    container: dict[str, Any] = {
        "name": "engine",
        "image": engine_image(model, cfg),
        "args": args,
        "env": _engine_env(model),
        "ports": [{"name": "http", "containerPort": engine.port, "protocol": "TCP"},
                  *_kv_event_ports(model)],
        "resources": {"requests": requests, "limits": limits},
        # Model download and loading can take many minutes: the startup probe allows
        # startupTimeoutSeconds before liveness starts counting.
        "startupProbe": _probe(engine.health_path, "http", period=10,
                               failures=max(1, -(-engine.startup_timeout_seconds // 10))),
        "readinessProbe": _probe(engine.health_path, "http", period=5, failures=3),
        "livenessProbe": _probe(engine.health_path, "http", period=10, failures=6),
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}],
    }
    if command is not None:
        container["command"] = command
    volumes: list[dict[str, Any]] = [
        # /dev/shm is 64Mi by default; tensor-parallel workers and NCCL need far more.
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": res.shared_memory_size}},
    ]
    claim = pvc_claim(model)
    if claim is not None:
        volumes.append({"name": "model", "persistentVolumeClaim": {"claimName": claim,
                                                                   "readOnly": True}})
        container["volumeMounts"].append({"name": "model", "mountPath": MODELS_MOUNT,
                                          "readOnly": True})
    else:
        volumes.append({"name": "model-cache", "emptyDir": {}})
        container["volumeMounts"].append({"name": "model-cache", "mountPath": HF_HOME})
    pod_spec: dict[str, Any] = {
        "containers": [container],
        "volumes": volumes,
        # Service links would inject e.g. VLLM_PORT=tcp://... for a Service named vllm, which
        # vLLM reads as its own setting and crashes on.
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": 60,
    }
    if res.node_selector:
        pod_spec["nodeSelector"] = dict(res.node_selector)
    if res.tolerations:
        pod_spec["tolerations"] = [t.model_dump(by_alias=True, exclude_none=True)
                                   for t in res.tolerations]
    return {"spec": {
        "replicas": spec.replicas,
        "selector": {"matchLabels": selector_labels(model, MODEL_SERVER)},
        # One new engine Ready before each old one goes (the old in deletion-cost order): of
        # the strategies measured on a rolling update, it lost the least hit rate and TTFT
        # (bench/results/lifecycle/README.md), for one spare GPU set during the roll.
        "strategy": {"type": "RollingUpdate", "rollingUpdate": dict(ENGINE_ROLLOUT)},
        "template": {"metadata": {"labels": labels(model, MODEL_SERVER)}, "spec": pod_spec},
    }}


def model_server_service(model: Model, cfg: OperatorConfig) -> Body:
    # Headless: the routers pick the replica themselves, from this Service's EndpointSlices.
    return {"spec": {
        "clusterIP": "None",
        "selector": selector_labels(model, MODEL_SERVER),
        "ports": [{"name": "http", "port": model.spec.engine.port, "targetPort": "http",
                   "protocol": "TCP"}],
    }}


def _pdb(model: Model, component: str) -> Body:
    # maxUnavailable 1 (not minAvailable) so that a single-replica component never blocks a
    # node drain forever, while a drain still takes replicas one at a time.
    return {"spec": {"maxUnavailable": 1,
                     "selector": {"matchLabels": selector_labels(model, component)}}}


def model_server_pdb(model: Model, cfg: OperatorConfig) -> Body:
    return _pdb(model, MODEL_SERVER)


def router_pdb(model: Model, cfg: OperatorConfig) -> Body:
    return _pdb(model, ROUTER)


# --------------------------------------------------------------------------- router


def router_settings(model: Model) -> RouterSettings:
    """The router's settings: the spec's router settings and the wiring the operator decides.
    Nothing else is set, so every other setting keeps the router's own default. A spec field
    the router does not know fails here (its settings forbid extra keys), at render time."""
    spec = model.spec
    store: dict[str, Any] = {"mode": "redis", "url": store_url(model)}
    if spec.cache_store.type == "external" and spec.cache_store.password_secret_ref:
        store["password_env"] = REDIS_PASSWORD_ENV
    tokenizer = router_tokenizer(model)
    vllm = spec.engine.type == "vllm"
    index = spec.router.index or ("events" if vllm and tokenizer else "corrected")
    derived: dict[str, Any] = {"index": index}
    if tokenizer:
        derived["tokenizer"] = tokenizer
    return RouterSettings.model_validate({
        **spec.router.model_dump(exclude=ROUTER_DEPLOYMENT_FIELDS | ROUTER_DERIVED_FIELDS),
        **derived,
        # vLLM with --enable-prompt-tokens-details leaves the count out when it is 0
        "cached_tokens_reported": vllm,
        "health": {"path": spec.engine.health_path},
        "events": {"port": KV_EVENTS_PORT, "replay_port": KV_REPLAY_PORT},
        "host": "0.0.0.0",
        "port": ROUTER_PORT,
        "metrics_port": ROUTER_METRICS_PORT,
        "models": [spec.model.name],
        "policy": "prefix",
        "model_key": model.key,
        "discovery": {"mode": "kubernetes", "namespace": model.namespace,
                      "service": model_server_name(model), "port": spec.engine.port},
        "store": store,
    })


def router_tokenizer(model: Model) -> str | None:
    """The tokenizer the routers key prefixes with: the spec's, else, for vLLM and SGLang, the
    model's own (its Hugging Face repository, or its directory on the PVC, mounted into the
    router pods too). None: byte blocks."""
    spec = model.spec
    if spec.router.tokenizer:
        return spec.router.tokenizer
    if spec.engine.type == "custom":
        return None
    if pvc_claim(model) is not None:
        return engine_model_arg(model)
    revision = f"@{spec.model.revision}" if spec.model.revision else ""
    return f"hf://{engine_model_arg(model)}{revision}"


def router_config_text(model: Model) -> str:
    """router.yaml: only the settings router_settings set (exclude_unset)."""
    settings = router_settings(model).model_dump(mode="json", exclude_unset=True)
    return yaml.safe_dump(settings, sort_keys=True)


def config_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def router_configmap(model: Model, cfg: OperatorConfig) -> Body:
    return {"data": {ROUTER_CONFIG_FILE: router_config_text(model)}}


def router_deployment(model: Model, cfg: OperatorConfig) -> Body:
    spec = model.spec
    r = spec.router
    env: list[dict[str, Any]] = []
    ref = spec.cache_store.password_secret_ref
    if spec.cache_store.type == "external" and ref is not None:
        env.append({"name": REDIS_PASSWORD_ENV,
                    "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}})
    # The tokenizer: fetched from the hub at start (with the model's token, into a cache
    # volume), or read from the model's PVC, mounted read-only.
    tokenizer = router_tokenizer(model)
    mounts = [{"name": "config", "mountPath": ROUTER_CONFIG_DIR, "readOnly": True},
              {"name": "cache", "mountPath": ROUTER_CACHE_DIR}]
    volumes: list[dict[str, Any]] = [
        {"name": "config", "configMap": {"name": router_name(model)}},
        {"name": "cache", "emptyDir": {"sizeLimit": "256Mi"}},
    ]
    env.append({"name": "PREFIX_ROUTER_CACHE", "value": ROUTER_CACHE_DIR})
    hf = spec.model.hf_token_secret_ref
    if tokenizer and tokenizer.startswith("hf://") and hf is not None:
        env.append({"name": "HF_TOKEN",
                    "valueFrom": {"secretKeyRef": {"name": hf.name, "key": hf.key}}})
    claim = pvc_claim(model)
    if tokenizer and claim is not None and tokenizer.startswith(MODELS_MOUNT):
        mounts.append({"name": "models", "mountPath": MODELS_MOUNT, "readOnly": True})
        volumes.append({"name": "models",
                        "persistentVolumeClaim": {"claimName": claim, "readOnly": True}})
    container: dict[str, Any] = {
        "name": "router",
        "image": r.image or cfg.router_image,
        "command": ["prefix-router"],
        "args": ["--config", f"{ROUTER_CONFIG_DIR}/{ROUTER_CONFIG_FILE}"],
        "ports": [{"name": "http", "containerPort": ROUTER_PORT, "protocol": "TCP"},
                  {"name": "metrics", "containerPort": ROUTER_METRICS_PORT, "protocol": "TCP"}],
        "resources": {"requests": {"cpu": r.cpu, "memory": r.memory},
                      "limits": {"memory": r.memory}},
        "livenessProbe": _probe("/healthz", "http", period=10, failures=3, timeout=2),
        "readinessProbe": _probe("/readyz", "http", period=2, failures=2, timeout=2),
        "lifecycle": {"preStop": {"sleep": {"seconds": ROUTER_PRESTOP_SECONDS}}},
        "securityContext": ROUTER_CONTAINER_SECURITY,
        "volumeMounts": mounts,
    }
    if env:
        container["env"] = env
    template_meta = {
        "labels": labels(model, ROUTER),
        # The router reads its config once at start: a changed config rolls the routers
        # (and only them) through this hash.
        "annotations": {CONFIG_HASH_ANNOTATION: config_hash(router_config_text(model))},
    }
    return {"spec": {
        "replicas": r.replicas,
        "selector": {"matchLabels": selector_labels(model, ROUTER)},
        "strategy": {"type": "RollingUpdate",
                     "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
        "template": {"metadata": template_meta, "spec": {
            "serviceAccountName": router_name(model),
            "securityContext": ROUTER_POD_SECURITY,
            "terminationGracePeriodSeconds": ROUTER_TERMINATION_GRACE_SECONDS,
            "containers": [container],
            "volumes": volumes,
            "enableServiceLinks": False,
        }},
    }}


def router_service(model: Model, cfg: OperatorConfig) -> Body:
    return {"spec": {
        "type": "ClusterIP",
        "selector": selector_labels(model, ROUTER),
        # `metrics` for Prometheus (the chart's ServiceMonitor); expose only `http` to clients
        "ports": [{"name": "http", "port": ROUTER_PORT, "targetPort": "http", "protocol": "TCP"},
                  {"name": "metrics", "port": ROUTER_METRICS_PORT, "targetPort": "metrics",
                   "protocol": "TCP"}],
    }}


def router_service_account(model: Model, cfg: OperatorConfig) -> Body:
    return {}


def router_role(model: Model, cfg: OperatorConfig) -> Body:
    # Discovery of model-server replicas is a watch on EndpointSlices, nothing more.
    return {"rules": [{"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
                       "verbs": ["get", "list", "watch"]}]}


def router_role_binding(model: Model, cfg: OperatorConfig) -> Body:
    return {"roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                        "name": router_name(model)},
            "subjects": [{"kind": "ServiceAccount", "name": router_name(model),
                          "namespace": model.namespace}]}


# --------------------------------------------------------------------------- cache store


def redis_deployment(model: Model, cfg: OperatorConfig) -> Body:
    mib = model.spec.cache_store.max_memory_mi_b
    container = {
        "name": "redis",
        "image": cfg.redis_image,
        # The ownership table is a cache that routers rebuild from traffic: no persistence,
        # and LRU eviction instead of write errors when it fills.
        "args": ["--save", "", "--appendonly", "no", "--maxmemory", f"{mib}mb",
                 "--maxmemory-policy", "allkeys-lru"],
        "ports": [{"name": "redis", "containerPort": REDIS_PORT, "protocol": "TCP"}],
        "resources": {"requests": {"cpu": "100m", "memory": f"{mib + mib // 4}Mi"},
                      "limits": {"memory": f"{mib + mib // 4}Mi"}},
        "readinessProbe": {"exec": {"command": ["redis-cli", "ping"]}, "periodSeconds": 5,
                           "timeoutSeconds": 2},
        "livenessProbe": {"tcpSocket": {"port": "redis"}, "periodSeconds": 10,
                          "failureThreshold": 3},
    }
    return {"spec": {
        "replicas": 1,
        "selector": {"matchLabels": selector_labels(model, CACHE_STORE)},
        # Never two Redis pods for one model: routers would split their table between them.
        "strategy": {"type": "Recreate"},
        "template": {"metadata": {"labels": labels(model, CACHE_STORE)},
                     "spec": {"containers": [container], "enableServiceLinks": False}},
    }}


def redis_service(model: Model, cfg: OperatorConfig) -> Body:
    return {"spec": {
        "type": "ClusterIP",
        "selector": selector_labels(model, CACHE_STORE),
        "ports": [{"name": "redis", "port": REDIS_PORT, "targetPort": "redis",
                   "protocol": "TCP"}],
    }}


# --------------------------------------------------------------------------- autoscaling


def _milli(value: float) -> str:
    return f"{round(value * 1000)}m"


def horizontal_pod_autoscaler(model: Model, cfg: OperatorConfig) -> Body:
    spec = model.spec
    a = spec.autoscaling
    selector = {"matchLabels": {NAMESPACE_LABEL: model.namespace, MODEL_LABEL: model.name}}
    # The adapter serves fleet-wide TOTALS and the targets are per replica (AverageValue):
    # the HPA asks for ceil(total / target) replicas, which is the capacity model itself —
    # enough replicas that the working set fits in targetCachePressure of their KV capacity,
    # and that each carries at most targetLoad requests in flight. No replica count enters
    # the metric, so it cannot disagree with the HPA's (a ratio over ready replicas would
    # during a rollout, and has no value at zero ready).
    working_set_per_replica = max(1, round(spec.router.kv_capacity_tokens
                                           * a.target_cache_pressure))
    metrics = [
        {"type": "External", "external": {
            "metric": {"name": WORKING_SET_METRIC, "selector": selector},
            "target": {"type": "AverageValue",
                       "averageValue": str(working_set_per_replica)}}},
        {"type": "External", "external": {
            "metric": {"name": IN_FLIGHT_METRIC, "selector": selector},
            "target": {"type": "AverageValue", "averageValue": _milli(a.target_load)}}},
        # the same target over in flight + queued (the HPA takes the largest): the demand
        # waiting in the routers' dispatch queues brings more replicas too
        {"type": "External", "external": {
            "metric": {"name": DEMAND_METRIC, "selector": selector},
            "target": {"type": "AverageValue", "averageValue": _milli(a.target_load)}}},
    ]
    return {"spec": {
        # The model itself is the target (scale subresource), so spec.replicas stays the one
        # source of truth for the model-server count.
        "scaleTargetRef": {"apiVersion": API_VERSION, "kind": KIND, "name": model.name},
        "minReplicas": max(1, spec.min_replicas),
        "maxReplicas": spec.max_replicas,
        "metrics": metrics,
        "behavior": {"scaleDown": {
            "stabilizationWindowSeconds": a.scale_down_stabilization_seconds}},
    }}
