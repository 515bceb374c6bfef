"""The PrefixRoutedModel spec as typed Python.

The API server has already applied the CRD's defaults and validation by the time the operator
reads a spec; the defaults are repeated here so rendering works on a partial spec too (unit
tests, older objects) and a unit test keeps the two in step with crds/prefixroutedmodel.yaml.
Extra keys are ignored rather than rejected: the schema, not the operator, is the gatekeeper.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel


class _Spec(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore",
                              frozen=True)


class SecretKeyRef(_Spec):
    name: str
    key: str


class HfTokenRef(SecretKeyRef):
    key: str = "token"


class PasswordRef(SecretKeyRef):
    key: str = "password"


class ModelSpec(_Spec):
    name: str
    source: str
    revision: str | None = None
    hf_token_secret_ref: HfTokenRef | None = None


class EnvVar(_Spec):
    name: str
    value: str = ""


class EngineSpec(_Spec):
    type: Literal["vllm", "sglang", "custom"] = "vllm"
    image: str | None = None
    args: tuple[str, ...] = ()
    port: int = 8000
    health_path: str = "/health"
    startup_timeout_seconds: int = 1800
    env: tuple[EnvVar, ...] = ()


class Toleration(_Spec):
    key: str | None = None
    operator: str | None = None
    value: str | None = None
    effect: str | None = None
    toleration_seconds: int | None = None


class ResourcesSpec(_Spec):
    gpus: int = 1
    gpu_resource_name: str = "nvidia.com/gpu"
    cpu: str = "4"
    memory: str = "32Gi"
    shared_memory_size: str = "8Gi"
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: tuple[Toleration, ...] = ()


class TenantSpec(_Spec):
    weight: float = 1.0
    band: str | None = None


class QueueSpec(_Spec):
    """The routers' dispatch queue (router settings `queue`)."""

    max_in_flight: int = 0
    max_waiting: int = 4
    reserve: int = 0
    tenants: dict[str, TenantSpec] = Field(default_factory=dict)


class RouterSpec(_Spec):
    replicas: int = 2
    image: str | None = None
    block_size: int = 16
    bytes_per_token: float = 4.0
    load_bound: float = 0.5
    load_slack: float = 6.0
    load_cost_tokens: float = 64.0
    step_wait_tokens_per_ms: float = 30.0
    max_owners: int = 0
    ttl_seconds: int = 600
    kv_capacity_tokens: int = 0
    index: Literal["approx", "corrected", "events"] | None = None
    tokenizer: str | None = None
    queue: QueueSpec = Field(default_factory=QueueSpec)
    cpu: str = "500m"
    memory: str = "512Mi"


class CacheStoreSpec(_Spec):
    type: Literal["managed", "external"] = "managed"
    url: str | None = None
    password_secret_ref: PasswordRef | None = None
    max_memory_mi_b: int = Field(default=512, alias="maxMemoryMiB")


class AutoscalingSpec(_Spec):
    enabled: bool = False
    target_cache_pressure: float = 0.8
    target_load: float = 8.0
    scale_down_stabilization_seconds: int = 300


class PrefixRoutedModelSpec(_Spec):
    replicas: int = 1
    min_replicas: int = 1
    max_replicas: int = 4
    model: ModelSpec
    engine: EngineSpec = Field(default_factory=EngineSpec)
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec)
    router: RouterSpec = Field(default_factory=RouterSpec)
    cache_store: CacheStoreSpec = Field(default_factory=CacheStoreSpec)
    autoscaling: AutoscalingSpec = Field(default_factory=AutoscalingSpec)


class Model(BaseModel):
    """What rendering needs of one PrefixRoutedModel object: identity plus the typed spec."""

    model_config = ConfigDict(frozen=True)

    name: str
    namespace: str
    uid: str
    generation: int
    spec: PrefixRoutedModelSpec

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> Model:
        meta = body["metadata"]
        return cls(
            name=meta["name"],
            namespace=meta["namespace"],
            uid=meta.get("uid", ""),
            generation=int(meta.get("generation", 1)),
            spec=PrefixRoutedModelSpec.model_validate(body.get("spec") or {}),
        )

    @property
    def key(self) -> str:
        """The model's namespace in the cache store and in the routers' config."""
        return f"{self.namespace}/{self.name}"
