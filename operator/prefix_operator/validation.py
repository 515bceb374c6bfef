"""Checks of combinations the CRD schema cannot express (or cannot explain well).

A problem here never raises out of a handler: it becomes Ready=False with the problem's reason
and message, and nothing is applied until the spec is fixed (no crash loop, no half rollout).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .render import ENGINE_ENV
from .spec import Model

# Flags the operator sets itself; a second value in spec.engine.args would silently win (or
# lose) against ours, and a different block size would break prefix routing outright.
MANAGED_FLAGS: dict[str, frozenset[str]] = {
    "vllm": frozenset({
        "--model", "--served-model-name", "--host", "--port", "--block-size",
        "--enable-prefix-caching", "--no-enable-prefix-caching", "--tensor-parallel-size",
        "-tp", "--revision",
    }),
    "sglang": frozenset({
        "--model-path", "--model", "--served-model-name", "--host", "--port", "--page-size",
        "--disable-radix-cache", "--tp-size", "--tp", "--tensor-parallel-size", "--revision",
    }),
    "custom": frozenset(),
}


@dataclass(frozen=True)
class Problem:
    reason: str  # CamelCase, searchable
    message: str


def _flag(arg: str) -> str | None:
    if not arg.startswith("-"):
        return None
    return arg.split("=", 1)[0]


def validate(model: Model) -> list[Problem]:
    spec = model.spec
    problems: list[Problem] = []
    managed = MANAGED_FLAGS[spec.engine.type]
    clashes = sorted({f for a in spec.engine.args if (f := _flag(a)) and f in managed})
    if clashes:
        problems.append(Problem(
            "ConflictingEngineArgs",
            f"spec.engine.args sets {', '.join(clashes)}, which the operator manages for "
            f"engine {spec.engine.type} (use spec.model, spec.engine.port, "
            f"spec.router.blockSize and spec.resources.gpus instead)",
        ))
    reserved = sorted({e.name for e in spec.engine.env if e.name in ENGINE_ENV})
    if reserved:
        problems.append(Problem(
            "ReservedEngineEnv",
            f"spec.engine.env sets {', '.join(reserved)}, which the operator sets itself",
        ))
    if spec.router.kv_capacity_tokens and spec.router.kv_capacity_tokens < spec.router.block_size:
        problems.append(Problem(
            "KvCapacityBelowBlockSize",
            f"spec.router.kvCapacityTokens ({spec.router.kv_capacity_tokens}) is smaller than "
            f"one block (spec.router.blockSize={spec.router.block_size})",
        ))
    return problems


def check_store_secret(model: Model, secret: dict[str, Any] | None) -> Problem | None:
    """The external store's password Secret must exist and hold the key (else every router
    pod would fail to start with CreateContainerConfigError)."""
    store = model.spec.cache_store
    ref = store.password_secret_ref
    if store.type != "external" or ref is None:
        return None
    if secret is None:
        return Problem("StoreSecretNotFound",
                       f"Secret {ref.name} (spec.cacheStore.passwordSecretRef) does not exist "
                       f"in namespace {model.namespace}")
    data = {**(secret.get("data") or {}), **(secret.get("stringData") or {})}
    if ref.key not in data:
        return Problem("StoreSecretKeyMissing",
                       f"Secret {ref.name} has no key {ref.key!r} "
                       f"(spec.cacheStore.passwordSecretRef.key)")
    return None
