"""Operator settings: images and timings, from flags or PREFIX_OPERATOR_* environment variables.

Timings are settings (not constants) so the integration tests can run the same operator with
second-scale timers instead of minute-scale ones.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields, replace

ROUTER_IMAGE = "ghcr.io/prefixrouter/prefix-router:0.1.0"
# Pinned so that a model's pods never change under it when an upstream tag moves.
VLLM_IMAGE = "vllm/vllm-openai:v0.11.0"
SGLANG_IMAGE = "lmsysorg/sglang:v0.5.4"
REDIS_IMAGE = "redis:7.4.2-alpine"

ENV_PREFIX = "PREFIX_OPERATOR_"


@dataclass(frozen=True)
class OperatorConfig:
    router_image: str = ROUTER_IMAGE
    vllm_image: str = VLLM_IMAGE
    sglang_image: str = SGLANG_IMAGE
    redis_image: str = REDIS_IMAGE
    # Periodic full reconcile: the backstop for drift that no watch event reported.
    resync_seconds: float = 60.0
    # Routing figures (hit rate, cache pressure) in status: a modest rate, never per request.
    figures_seconds: float = 15.0
    # Finalizer: attempts to clear the model's cache-store keys before letting deletion go.
    cleanup_attempts: int = 5
    cleanup_backoff_seconds: float = 2.0
    # One Redis round trip's budget; the store may be unreachable from the operator's network.
    store_timeout_seconds: float = 2.0
    # Engine pod deletion costs (cost_writer.py): patches a minute per model on average, and
    # at once; 0 leaves the choice to the ReplicaSet controller.
    deletion_cost_patches_per_minute: float = 6.0
    deletion_cost_burst: float = 10.0
    # Test-only, as the router's discovery.address_override_annotation: a pod carrying this
    # annotation is the engine the routers reach at its host:port (kwok pods are not).
    engine_address_annotation: str = ""
    # Delay before retrying a reconcile that hit a temporary API error.
    retry_backoff_seconds: float = 5.0

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> OperatorConfig:
        env = os.environ if environ is None else environ
        values: dict[str, object] = {}
        for f in fields(cls):
            raw = env.get(ENV_PREFIX + f.name.upper())
            if raw is None or raw == "":
                continue
            default = getattr(cls, f.name)
            values[f.name] = type(default)(raw)
        return cls(**values)  # type: ignore[arg-type]

    def with_overrides(self, **overrides: object) -> OperatorConfig:
        return replace(self, **{k: v for k, v in overrides.items() if v is not None})
