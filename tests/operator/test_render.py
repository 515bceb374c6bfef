from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from operator_builders import FULL_SPEC, UID, model
from pydantic import ValidationError

from prefix_operator import children, kinds
from prefix_operator.children import possible_refs, ref_of, render_all
from prefix_operator.config import OperatorConfig
from prefix_operator.naming import CONFIG_HASH_ANNOTATION
from prefix_operator.render import (
    ROUTER_DEPLOYMENT_FIELDS,
    ROUTER_DERIVED_FIELDS,
    engine_command_args,
    router_config_text,
    router_settings,
)
from prefix_operator.spec import Model, PrefixRoutedModelSpec, RouterSpec
from prefix_router.contract import RouterSettings

CRD = Path(__file__).resolve().parents[2] / "crds" / "prefixroutedmodel.yaml"


def by_ref(objs: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(o["kind"], o["metadata"]["name"]): o for o in objs}


def container(deploy: dict[str, Any]) -> dict[str, Any]:
    return deploy["spec"]["template"]["spec"]["containers"][0]


def test_default_spec_renders_every_object_with_preset_names(cfg: OperatorConfig) -> None:
    objs = by_ref(render_all(model(), cfg))
    assert set(objs) == {
        ("ServiceAccount", "llama-router"), ("Role", "llama-router"),
        ("RoleBinding", "llama-router"), ("ConfigMap", "llama-router"),
        ("Service", "llama-model-server"), ("Service", "llama-router"),
        ("Service", "llama-redis"), ("Deployment", "llama-redis"),
        ("Deployment", "llama-model-server"), ("Deployment", "llama-router"),
        ("PodDisruptionBudget", "llama-model-server"),
        ("PodDisruptionBudget", "llama-router"),
    }
    for obj in objs.values():
        meta = obj["metadata"]
        assert meta["namespace"] == "ml"
        assert meta["labels"]["prefixrouter.io/model"] == "llama"
        assert meta["labels"]["app.kubernetes.io/managed-by"] == "prefix-operator"
        assert meta["labels"]["app.kubernetes.io/instance"] == "llama"
        assert meta["labels"]["app.kubernetes.io/part-of"] == "prefix-router"
        assert meta["labels"]["app.kubernetes.io/component"] in {
            "model-server", "router", "cache-store"}
        assert meta["ownerReferences"] == [{
            "apiVersion": "prefixrouter.io/v1alpha1", "kind": "PrefixRoutedModel",
            "name": "llama", "uid": UID, "controller": True, "blockOwnerDeletion": True}]


def test_rendering_is_deterministic(cfg: OperatorConfig) -> None:
    # Server-side apply is a no-op only if the same spec renders the same bytes.
    assert render_all(model(), cfg) == render_all(model(), cfg)


def test_default_vllm_model_server(cfg: OperatorConfig) -> None:
    d = by_ref(render_all(model(), cfg))[("Deployment", "llama-model-server")]
    assert d["spec"]["replicas"] == 1
    assert d["spec"]["selector"]["matchLabels"] == {
        "prefixrouter.io/model": "llama", "app.kubernetes.io/component": "model-server"}
    pod = d["spec"]["template"]["spec"]
    c = container(d)
    assert c["image"] == cfg.vllm_image and c["image"].startswith("vllm/vllm-openai:v")
    assert c["command"] == ["vllm", "serve"]
    assert c["args"][0] == "meta-llama/Llama-3.1-8B"
    args = c["args"]
    assert "--enable-prefix-caching" in args
    assert args[args.index("--block-size") + 1] == "16"
    assert args[args.index("--served-model-name") + 1] == "llama-3-8b"
    assert args[args.index("--port") + 1] == "8000"
    assert "--tensor-parallel-size" not in args  # one GPU
    assert c["resources"]["requests"] == {"cpu": "4", "memory": "32Gi", "nvidia.com/gpu": "1"}
    assert c["resources"]["limits"] == {"memory": "32Gi", "nvidia.com/gpu": "1"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    startup = c["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 1800
    assert {"name": "dshm", "mountPath": "/dev/shm"} in c["volumeMounts"]
    assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "8Gi"}} in pod["volumes"]
    assert pod["enableServiceLinks"] is False
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["HF_HOME"] == "/root/.cache/huggingface"


def test_engines_roll_one_new_ready_before_each_old_goes(cfg: OperatorConfig) -> None:
    """The strategy the rollout A/B chose (bench/results/lifecycle/README.md)."""
    d = by_ref(render_all(model(), cfg))[("Deployment", "llama-model-server")]
    assert d["spec"]["strategy"] == {"type": "RollingUpdate",
                                     "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}


def test_full_spec_model_server(cfg: OperatorConfig) -> None:
    d = by_ref(render_all(model(**FULL_SPEC), cfg))[("Deployment", "llama-model-server")]
    c = container(d)
    pod = d["spec"]["template"]["spec"]
    assert d["spec"]["replicas"] == 3
    assert c["image"] == "registry.local/vllm:custom"
    args = c["args"]
    assert args[0] == "/models/qwen2.5-7b"
    assert args[args.index("--block-size") + 1] == "32"
    assert args[args.index("--tensor-parallel-size") + 1] == "2"
    assert args[args.index("--revision") + 1] == "main"
    assert args[-2:] == ["--max-model-len", "8192"]  # user args come last
    assert c["ports"] == [{"name": "http", "containerPort": 9000, "protocol": "TCP"},
                          {"name": "kv-events", "containerPort": 5557, "protocol": "TCP"},
                          {"name": "kv-replay", "containerPort": 5558, "protocol": "TCP"}]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert c["startupProbe"]["failureThreshold"] == 60
    assert {"name": "model", "persistentVolumeClaim": {"claimName": "weights",
                                                       "readOnly": True}} in pod["volumes"]
    assert {"name": "model", "mountPath": "/models", "readOnly": True} in c["volumeMounts"]
    assert pod["nodeSelector"] == {"gpu": "a100"}
    assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists",
                                   "effect": "NoSchedule"}]
    env = {e["name"]: e for e in c["env"]}
    assert env["HF_TOKEN"]["valueFrom"] == {"secretKeyRef": {"name": "hf", "key": "tok"}}
    assert env["VLLM_LOGGING_LEVEL"]["value"] == "DEBUG"
    assert "HF_HOME" not in env  # weights come from the PVC


def test_sglang_and_custom_engines(cfg: OperatorConfig) -> None:
    sg = by_ref(render_all(model(engine={"type": "sglang"}, resources={"gpus": 4}), cfg))
    c = container(sg[("Deployment", "llama-model-server")])
    assert c["image"] == cfg.sglang_image and c["image"].startswith("lmsysorg/sglang:v")
    assert c["command"] == ["python3", "-m", "sglang.launch_server"]
    assert c["args"][c["args"].index("--page-size") + 1] == "16"
    assert c["args"][c["args"].index("--tp-size") + 1] == "4"
    assert "--disable-radix-cache" not in c["args"]

    cu = by_ref(render_all(model(engine={"type": "custom", "image": "me/engine:1",
                                         "args": ["serve"]}), cfg))
    c = container(cu[("Deployment", "llama-model-server")])
    assert "command" not in c  # the image's own entrypoint
    assert c["args"] == ["serve"]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["PREFIXROUTER_BLOCK_SIZE"] == "16"
    assert env["PREFIXROUTER_MODEL_NAME"] == "llama-3-8b"


def test_gpu_free_model_server_requests_no_gpu(cfg: OperatorConfig) -> None:
    d = by_ref(render_all(model(resources={"gpus": 0}), cfg))[("Deployment",
                                                               "llama-model-server")]
    assert "nvidia.com/gpu" not in container(d)["resources"]["requests"]


def test_headless_service_and_pdbs(cfg: OperatorConfig) -> None:
    objs = by_ref(render_all(model(engine={"port": 9000}), cfg))
    svc = objs[("Service", "llama-model-server")]
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["ports"][0]["port"] == 9000
    for name in ("llama-model-server", "llama-router"):
        pdb = objs[("PodDisruptionBudget", name)]
        assert pdb["spec"]["maxUnavailable"] == 1


def test_router_objects(cfg: OperatorConfig) -> None:
    objs = by_ref(render_all(model(), cfg))
    d = objs[("Deployment", "llama-router")]
    c = container(d)
    pod = d["spec"]["template"]["spec"]
    assert d["spec"]["replicas"] == 2
    assert c["image"] == cfg.router_image
    assert c["command"] == ["prefix-router"]
    assert c["args"] == ["--config", "/etc/prefix-router/router.yaml"]
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert [(p["name"], p["containerPort"]) for p in c["ports"]] == [("http", 8080),
                                                                       ("metrics", 9090)]
    assert pod["serviceAccountName"] == "llama-router"
    assert pod["volumes"] == [{"name": "config", "configMap": {"name": "llama-router"}},
                              {"name": "cache", "emptyDir": {"sizeLimit": "256Mi"}}]
    # managed store: no password; the tokenizer is fetched into the cache volume
    assert c["env"] == [{"name": "PREFIX_ROUTER_CACHE", "value": "/var/cache/prefix-router"}]
    role = objs[("Role", "llama-router")]
    assert role["rules"] == [{"apiGroups": ["discovery.k8s.io"],
                              "resources": ["endpointslices"],
                              "verbs": ["get", "list", "watch"]}]
    rb = objs[("RoleBinding", "llama-router")]
    assert rb["roleRef"]["name"] == "llama-router"
    assert rb["subjects"] == [{"kind": "ServiceAccount", "name": "llama-router",
                               "namespace": "ml"}]
    svc_ports = {p["name"]: p for p in objs[("Service", "llama-router")]["spec"]["ports"]}
    assert svc_ports["http"]["port"] == 8080
    # /metrics on a port of its own, as the router's config says: the API port shows no
    # engine addresses
    assert svc_ports["metrics"]["targetPort"] == "metrics"
    assert router_settings(model()).metrics_port == 9090


def test_router_config_follows_the_router_contract() -> None:
    m = model(**FULL_SPEC)
    cm_text = router_config_text(m)
    # The router's own settings model (extra keys forbidden) accepts what we render.
    settings = RouterSettings.model_validate(yaml.safe_load(cm_text))
    assert settings == router_settings(m)
    assert settings.block_size == 32
    assert settings.models == ["qwen"]
    assert settings.model_key == "ml/llama"
    assert settings.load_bound == 0.5 and settings.max_owners == 3
    assert settings.load_slack == 4 and settings.load_cost_tokens == 100
    assert settings.step_wait_tokens_per_ms == 25
    assert settings.ttl_seconds == 120 and settings.kv_capacity_tokens == 500000
    assert settings.discovery.mode == "kubernetes"
    assert settings.discovery.service == "llama-model-server"
    assert settings.discovery.port == 9000 and settings.discovery.namespace == "ml"
    assert settings.store.mode == "redis"
    assert settings.store.url == "redis://redis.shared:6379/2"
    assert settings.store.password_env == "REDIS_PASSWORD"
    assert settings.host == "0.0.0.0" and settings.port == 8080

    managed = router_settings(model())
    assert managed.store.model_dump(exclude_unset=True) == {
        "mode": "redis", "url": "redis://llama-redis.ml.svc:6379/0"}


def _router_setting_fields() -> set[str]:
    """The spec's router fields that pass to the router as they are."""
    return set(RouterSpec.model_fields) - ROUTER_DEPLOYMENT_FIELDS - ROUTER_DERIVED_FIELDS


def test_router_yaml_holds_only_what_the_spec_and_the_operator_set() -> None:
    """Everything else is left to the router's own defaults."""
    rendered = yaml.safe_load(router_config_text(model()))
    wiring = {"host", "port", "metrics_port", "models", "policy", "model_key", "discovery",
              "store", "health", "events", "cached_tokens_reported", "index",
              "tokenizer"}  # fmt: skip
    assert set(rendered) == _router_setting_fields() | wiring
    assert rendered["discovery"] == {"mode": "kubernetes", "namespace": "ml",
                                     "service": "llama-model-server", "port": 8000}


def test_every_router_setting_of_the_spec_is_the_routers_with_its_default() -> None:
    # The CRD defaults every field (test_python_defaults_match_the_crd keeps spec.py in step),
    # so a default that differs from the router's would override it in every deployment.
    router = RouterSettings.model_fields
    spec = RouterSpec.model_fields
    for name in sorted(_router_setting_fields()):
        assert name in router, f"spec.router.{name} is not a router setting"
        assert spec[name].default == router[name].default, \
            f"spec.router.{name}: default {spec[name].default!r}, the router's " \
            f"{router[name].default!r}"


def test_engines_tell_the_routers_what_they_hold() -> None:
    # vLLM: cached tokens on every answer, KV events on its ports, the model's tokenizer
    vllm = router_settings(model())
    assert vllm.index == "events" and vllm.cached_tokens_reported
    assert vllm.tokenizer and vllm.tokenizer.startswith("hf://")
    _command, args = engine_command_args(model())
    assert "--enable-prompt-tokens-details" in args
    events = json.loads(args[args.index("--kv-events-config") + 1])
    assert events["endpoint"].endswith(f":{vllm.events.port}")
    assert events["replay_endpoint"].endswith(f":{vllm.events.replay_port}")
    # a custom engine: what its answers report corrects the index; no tokenizer known
    custom = router_settings(
        model(engine={"type": "custom", "image": "x", "healthPath": "/v1/models"})
    )
    assert custom.index == "corrected" and custom.tokenizer is None
    assert custom.health.path == "/v1/models" and not custom.cached_tokens_reported


def test_a_spec_field_the_router_does_not_know_fails_at_render_time() -> None:
    class NewerRouterSpec(RouterSpec):
        no_such_setting: bool = True

    m = model()
    newer = Model(name=m.name, namespace=m.namespace, uid=m.uid, generation=m.generation,
                  spec=m.spec.model_copy(update={"router": NewerRouterSpec()}))
    with pytest.raises(ValidationError, match="no_such_setting"):
        router_settings(newer)


def test_external_store_password_and_no_managed_redis(cfg: OperatorConfig) -> None:
    objs = by_ref(render_all(model(**FULL_SPEC), cfg))
    assert ("Deployment", "llama-redis") not in objs
    assert ("Service", "llama-redis") not in objs
    c = container(objs[("Deployment", "llama-router")])
    assert c["image"] == "registry.local/router:dev"
    assert c["env"][0] == {"name": "REDIS_PASSWORD", "valueFrom": {
        "secretKeyRef": {"name": "redis-auth", "key": "pw"}}}


def test_router_config_change_rolls_only_the_router(cfg: OperatorConfig) -> None:
    a = by_ref(render_all(model(), cfg))
    b = by_ref(render_all(model(router={"loadBound": 0.75}), cfg))
    ann = CONFIG_HASH_ANNOTATION
    assert a[("Deployment", "llama-router")]["spec"]["template"]["metadata"]["annotations"][ann] \
        != b[("Deployment", "llama-router")]["spec"]["template"]["metadata"]["annotations"][ann]
    assert a[("Deployment", "llama-model-server")] == b[("Deployment", "llama-model-server")]


def test_managed_redis(cfg: OperatorConfig) -> None:
    objs = by_ref(render_all(model(cacheStore={"maxMemoryMiB": 1024}), cfg))
    d = objs[("Deployment", "llama-redis")]
    c = container(d)
    assert c["image"] == cfg.redis_image
    assert c["args"][c["args"].index("--maxmemory") + 1] == "1024mb"
    assert "allkeys-lru" in c["args"]
    assert d["spec"]["strategy"] == {"type": "Recreate"}
    assert objs[("Service", "llama-redis")]["spec"]["ports"][0]["port"] == 6379


def test_autoscaler_targets_the_model(cfg: OperatorConfig) -> None:
    objs = by_ref(render_all(model(**FULL_SPEC), cfg))
    hpa = objs[("HorizontalPodAutoscaler", "llama")]
    spec = hpa["spec"]
    assert spec["scaleTargetRef"] == {"apiVersion": "prefixrouter.io/v1alpha1",
                                      "kind": "PrefixRoutedModel", "name": "llama"}
    assert spec["minReplicas"] == 2 and spec["maxReplicas"] == 6
    targets = {m["external"]["metric"]["name"]: m["external"]["target"]
               for m in spec["metrics"]}
    # Totals over per-replica targets: 500000 KV tokens x 0.7 pressure, 4 in flight.
    assert targets == {
        "prefix_router_working_set_tokens": {"type": "AverageValue", "averageValue": "350000"},
        "prefix_router_in_flight": {"type": "AverageValue", "averageValue": "4000m"},
        "prefix_router_demand": {"type": "AverageValue", "averageValue": "4000m"}}
    for m in spec["metrics"]:
        assert m["external"]["metric"]["selector"] == {"matchLabels": {
            "prefixrouter.io/namespace": "ml", "prefixrouter.io/model": "llama"}}
    assert spec["behavior"]["scaleDown"]["stabilizationWindowSeconds"] == 120
    assert ("HorizontalPodAutoscaler", "llama") not in by_ref(render_all(model(), cfg))


def test_possible_children_cover_every_rendering(cfg: OperatorConfig) -> None:
    for spec in ({}, FULL_SPEC):
        m = model(**spec)
        assert {ref_of(o) for o in render_all(m, cfg)} <= set(possible_refs(m))
    # One row per object: no two children share a kind and a name.
    assert len(set(possible_refs(model()))) == len(children.CHILDREN)


def test_the_table_says_what_each_spec_owns(cfg: OperatorConfig) -> None:
    def owned(**spec: Any) -> set[tuple[str, str]]:
        return {(o["kind"], o["metadata"]["name"]) for o in render_all(model(**spec), cfg)}

    base = owned()
    assert ("HorizontalPodAutoscaler", "llama") not in base
    everything = owned(router={"kvCapacityTokens": 1000}, autoscaling={"enabled": True})
    assert everything - base == {("HorizontalPodAutoscaler", "llama")}
    external = owned(cacheStore={"type": "external", "url": "redis://r:6379/0"})
    assert base - external == {("Service", "llama-redis"), ("Deployment", "llama-redis")}
    # The conditional rows are exactly those, and they are the ones pruning may delete.
    assert {(c.kind.kind, c.name(model())) for c in children.CHILDREN if c.conditional} == {
        ("HorizontalPodAutoscaler", "llama"), ("Service", "llama-redis"),
        ("Deployment", "llama-redis")}
    assert ("services", "delete") in {(p[1], p[2]) for p in children.permissions()}
    assert ("roles", "delete") not in {(p[1], p[2]) for p in children.permissions()}
    # The children that feed a condition, and every kind watched once.
    assert {c.observed_as for c in children.OBSERVED} == {"model_server", "router", "redis",
                                                          "hpa"}
    assert len(children.WATCHED_KINDS) == len(set(children.WATCHED_KINDS)) == 8
    assert kinds.DEPLOYMENT in children.WATCHED_KINDS


def test_images_are_configurable() -> None:
    cfg = OperatorConfig.from_env({"PREFIX_OPERATOR_ROUTER_IMAGE": "r:1",
                                   "PREFIX_OPERATOR_VLLM_IMAGE": "v:1",
                                   "PREFIX_OPERATOR_RESYNC_SECONDS": "2.5"})
    assert cfg.resync_seconds == 2.5
    objs = by_ref(render_all(model(), cfg))
    assert container(objs[("Deployment", "llama-router")])["image"] == "r:1"
    assert container(objs[("Deployment", "llama-model-server")])["image"] == "v:1"


def _crd_defaults(schema: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, prop in (schema.get("properties") or {}).items():
        if "default" in prop and prop.get("type") != "object":
            out[key] = prop["default"]
        elif prop.get("type") == "object" and prop.get("properties"):
            out[key] = _crd_defaults(prop)
    return out


@pytest.mark.parametrize("section", ["", "engine", "resources", "router", "cacheStore",
                                     "autoscaling"])
def test_python_defaults_match_the_crd(section: str) -> None:
    crd = yaml.safe_load(CRD.read_text())
    spec_schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    crd_defaults = _crd_defaults(spec_schema)
    py = PrefixRoutedModelSpec.model_validate(
        {"model": {"name": "m", "source": "s"}}).model_dump(by_alias=True)
    if section:
        crd_defaults, py = crd_defaults[section], py[section]
    else:
        crd_defaults = {k: v for k, v in crd_defaults.items() if not isinstance(v, dict)}
    for key, value in crd_defaults.items():
        if isinstance(value, dict):
            continue
        assert py[key] == value, f"{section}.{key}: CRD {value!r} != Python {py[key]!r}"


def test_the_specs_tenant_table_reaches_the_routers_queue() -> None:
    s = router_settings(model(router={"queue": {"maxInFlight": 32, "reserve": 2, "tenants": {
        "gold": {"weight": 4, "band": "high"}, "batch": {"band": "sheddable"}}}}))
    q = s.queue
    assert q.max_in_flight == 32 and q.max_waiting == 4 and q.reserve == 2
    assert q.tenants["gold"].weight == 4 and q.tenants["gold"].band == "high"
    assert q.tenants["batch"].weight == 1 and q.tenants["batch"].band == "sheddable"
    with pytest.raises(ValidationError, match=r"not in queue\.bands"):
        router_settings(model(router={"queue": {"tenants": {"x": {"band": "platinum"}}}}))
