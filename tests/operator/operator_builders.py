"""Builders for the operator's unit tests: PrefixRoutedModel bodies as the API server
would hand them over (defaults applied by the models, not by hand)."""

from __future__ import annotations

from typing import Any

from prefix_operator.spec import Model

UID = "0f1e2d3c-aaaa-bbbb-cccc-000000000001"


def body(name: str = "llama", namespace: str = "ml", generation: int = 1,
         **spec: Any) -> dict[str, Any]:
    spec.setdefault("model", {"name": "llama-3-8b", "source": "meta-llama/Llama-3.1-8B"})
    return {
        "apiVersion": "prefixrouter.io/v1alpha1",
        "kind": "PrefixRoutedModel",
        "metadata": {"name": name, "namespace": namespace, "uid": UID,
                     "generation": generation},
        "spec": spec,
    }


def model(**spec: Any) -> Model:
    return Model.from_body(body(**spec))


FULL_SPEC: dict[str, Any] = {
    "replicas": 3,
    "minReplicas": 2,
    "maxReplicas": 6,
    "model": {"name": "qwen", "source": "pvc://weights/qwen2.5-7b", "revision": "main",
              "hfTokenSecretRef": {"name": "hf", "key": "tok"}},
    "engine": {"type": "vllm", "image": "registry.local/vllm:custom", "port": 9000,
               "args": ["--max-model-len", "8192"], "startupTimeoutSeconds": 600,
               "env": [{"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"}]},
    "resources": {"gpus": 2, "cpu": "8", "memory": "64Gi", "sharedMemorySize": "16Gi",
                  "nodeSelector": {"gpu": "a100"},
                  "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists",
                                   "effect": "NoSchedule"}]},
    "router": {"replicas": 3, "image": "registry.local/router:dev", "blockSize": 32,
               "loadBound": 0.5, "loadSlack": 4, "loadCostTokens": 100, "maxOwners": 3,
               "stepWaitTokensPerMs": 25,
               "ttlSeconds": 120,
               "kvCapacityTokens": 500000, "bytesPerToken": 3.5, "cpu": "1",
               "memory": "1Gi"},
    "cacheStore": {"type": "external", "url": "redis://redis.shared:6379/2",
                   "passwordSecretRef": {"name": "redis-auth", "key": "pw"}},
    "autoscaling": {"enabled": True, "targetCachePressure": 0.7, "targetLoad": 4,
                    "scaleDownStabilizationSeconds": 120},
}
