"""Router settings: one pydantic model, loaded from a YAML file and overridden by flags.

The same keys are rendered by the operator into the router's ConfigMap, so the names here are
the contract between the control plane and the data plane.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

PolicyName = Literal["prefix", "round-robin", "random", "least-loaded", "chwbl"]
POLICIES: tuple[str, ...] = ("prefix", "round-robin", "random", "least-loaded", "chwbl")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DiscoverySettings(_Strict):
    mode: Literal["static", "file", "kubernetes"] = "static"
    # static mode: backend base URLs such as http://127.0.0.1:8001
    backends: list[str] = Field(default_factory=list)
    # file mode: a file of base URLs, one per line, re-read when it changes
    file: str | None = None
    # kubernetes mode: EndpointSlices of this Service (ready endpoints only)
    namespace: str | None = None
    service: str | None = None
    port: int | None = None
    kubeconfig: str | None = None
    # Test-only: a pod annotation whose value replaces the endpoint address (host:port).
    address_override_annotation: str | None = None

    @field_validator("backends")
    @classmethod
    def _urls(cls, v: list[str]) -> list[str]:
        out = []
        for url in v:
            url = url.strip().rstrip("/")
            if not url:
                continue
            if "://" not in url:
                url = "http://" + url
            out.append(url)
        return out

    @model_validator(mode="after")
    def _kube_needs_service(self) -> DiscoverySettings:
        if self.mode == "kubernetes" and not self.service:
            raise ValueError("discovery.mode=kubernetes needs discovery.service")
        if self.mode == "file" and not self.file:
            raise ValueError("discovery.mode=file needs discovery.file")
        return self


class StoreSettings(_Strict):
    mode: Literal["local", "redis"] = "local"
    url: str | None = None
    password_env: str | None = None
    username: str | None = None
    # Per-request budget for a shared-store lookup; past it that request routes on local
    # state. The budget is `timeout_factor` x the recent typical lookup time, never below
    # `timeout_ms` nor above `timeout_max_ms`: "slow" means slow for this deployment, so a
    # busy host whose lookups all take 8 ms does not route every other request blind.
    timeout_ms: float = Field(default=5.0, gt=0)
    timeout_max_ms: float = Field(default=50.0, gt=0)
    timeout_factor: float = Field(default=4.0, ge=1)
    # Near-cache entries older than this are re-read from the store.
    near_cache_ttl_ms: float = Field(default=250.0, ge=0)
    # Longest a write (new ownership) waits for a lookup to carry it to the store before it
    # is sent on its own: other routers see this router's records at most this late.
    write_delay_ms: float = Field(default=100.0, ge=0)
    max_entries_per_model: int = Field(default=2_000_000, ge=1000)

    @model_validator(mode="after")
    def _redis_needs_url(self) -> StoreSettings:
        if self.mode == "redis" and not self.url:
            raise ValueError("store.mode=redis needs store.url")
        return self


class HealthSettings(_Strict):
    probe_interval_s: float = Field(default=2.0, gt=0)
    probe_timeout_s: float = Field(default=1.0, gt=0)
    # consecutive failures (probe or request) before a backend is ejected
    eject_after_failures: int = Field(default=3, ge=1)
    # minimum time an ejected backend stays out before a successful probe re-admits it
    readmit_after_s: float = Field(default=5.0, ge=0)
    metrics_poll_interval_s: float = Field(default=1.0, gt=0)


class RouterSettings(_Strict):
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    # Served model names; empty means "whatever the backends serve" (learned from /v1/models).
    models: list[str] = Field(default_factory=list)
    policy: PolicyName = "prefix"
    # Hash block size in tokens; equal to the engine's KV block size so block boundaries agree.
    block_size: int = Field(default=16, ge=1, le=4096)
    # Estimated bytes of canonical prompt per token (the estimate the capacity model runs on).
    bytes_per_token: float = Field(default=4.0, gt=0)
    # Bounded load: no backend above ceil((1 + load_bound) * mean in-flight), or above
    # mean + load_slack where that is higher (load_slack below says why). 0.5 measured
    # better than 0.25 on system-prompts (engine hit rate 0.82-0.83 vs 0.81, same TTFT p50 and
    # p99, imbalance 1.11; ad-hoc `bench run`s, not committed): at 0.25 brief bursts on a hot
    # prefix's owners made new copies of it, each one 2,000 tokens of prefill and of KV space
    # taken from colder prefixes. Re-run after the pending-load fix (bench/results/long-point,
    # tag retune, 3 rounds, 2026-12-05): 0.25, 0.5 and 1.0 within the rounds' spread (hit
    # 0.830/0.830/0.831, p50 45.3/45.2/46.1 ms), so 0.5 stays.
    load_bound: float = Field(default=0.5, ge=0, le=10)
    # An absolute floor under the bound: a backend may always hold mean + load_slack in flight.
    # 6 with load_cost_tokens 64 measured against 0 and 256 (bench/results/slack/): at low load
    # the relative bound alone is a handful of requests, and each copy of a hot prefix cost
    # more prefill and KV space than the few extra decoding sequences it spared its owner.
    # 12 gained little more hit rate but pushed system-prompts imbalance to 1.29-1.43.
    load_slack: float = Field(default=6.0, ge=0)
    # chwbl's own bound: KubeAI's default load factor of 1.25, so the baseline is KubeAI's.
    chwbl_load_bound: float = Field(default=0.25, ge=0, le=10)
    # Cost, in prefill tokens, of one request already in flight on a backend. 64 measured
    # better than 256 (bench/results/slack/): in the engines' batches an extra running
    # sequence delays the others little, while moving a conversation re-prefills its history.
    load_cost_tokens: float = Field(default=64.0, ge=0)
    # Weight of a backend's pending prefill tokens against the prefill tokens a match saves.
    # Kept over 1.0 on system-prompts (bench/results/long-point/, pending-weight runs): 1.0
    # gave TTFT p50 ~0.9 ms lower but hit rate 0.821 against 0.830 and p90 166 against 140 ms:
    # a pending prefill delays this request once, a miss also costs a new copy of the prefix.
    # Those runs predate 52bb234, before which a stream took its prefill off the pending load
    # twice. Re-run after it (long-point, tag pending-fixed, 3 rounds): 1.0 gave the same p50
    # (45.41 against 45.45 ms) with hit rate 0.817 against 0.832 and p90 187 against 156 ms.
    pending_weight: float = Field(default=0.5, ge=0)
    # Weight of the eviction a placement causes: tokens a backend must newly cache, times how
    # hot its coldest cached block still is relative to the other backends' (policy.py).
    # 1.0 measured better than 0 at load_bound 0.5 (hit rate 0.823-0.829 vs 0.820; ad-hoc
    # `bench run`s, not committed). Re-run (long-point, tag retune, 3 rounds, 2026-12-05): 0
    # gave hit rate 0.820 against 0.830 and TTFT p90 189 against 160 ms.
    evict_weight: float = Field(default=1.0, ge=0)
    # Cost, in prefill tokens, of each millisecond a request would wait on a backend for the
    # engine step in progress there to end (steps.py); 0 turns the step rhythm off. 12.6 would
    # be a millisecond of prefill on the Llama-3.1-70B / 4 x H100 profile (79 us a token); 30
    # weighs the wait above that because what it is weighed against among the holders of a
    # prefix is mostly the load term, a balance cost rather than time. Measured
    # (bench/results/long-point/, system-prompts, 24 req/s, 60 s, 3 rounds): 0 gave TTFT p50
    # 45.8 ms, 12.6 45.0; with replicate_rate 1, 30 gave 44.2 (twice) and 60 44.3.
    step_wait_tokens_per_ms: float = Field(default=30.0, ge=0)
    # Demand-driven copies: a shared prefix gets one more owner for every this many requests
    # a second it gets (0 = off: copies only when the owners reach the load bound). With a
    # shared store the demand is what this router sends times the live routers (a Service
    # spreads requests evenly), so the setting means the same for any number of routers.
    # More owners give its requests a choice of load and of engine step. Measured as above:
    # TTFT p50 44.2 ms with 1 (and a step wait of 30) against 44.7 with neither; the copies
    # cost a little hit rate (0.829 against 0.834) and so p90 (about 155 ms against
    # 130). 0.75 copied more for no better p50; 1.5 gave 44.6.
    replicate_rate: float = Field(default=1.0, ge=0)
    # Scale-out: a replica that joins gets one request of each of the hottest prefixes at once
    # (until they carry its fair share), instead of waiting for misses (router/warm.py).
    # Off by default: measured (bench/results/scale-out) the bounded-load rule alone moved
    # 40% of the traffic onto 4 new replicas within 5 s, and the hand-over raised TTFT p50 in
    # the 30 s after the join (131 against 56 ms).
    warm_start: bool = False
    # Hot-prefix replication: at most this many owners recorded per block (0 = no limit).
    max_owners: int = Field(default=0, ge=0)
    ttl_seconds: float = Field(default=600.0, gt=0)
    # Per model-server replica KV capacity in tokens (0 = unknown: no capacity eviction).
    kv_capacity_tokens: int = Field(default=0, ge=0)
    max_table_entries: int = Field(default=2_000_000, ge=1000)
    # Tenant isolation: header whose value salts the prefix hash (body field cache_salt wins).
    salt_header: str | None = "x-cache-salt"
    model_key: str = "default"
    max_body_bytes: int = Field(default=8 * 1024 * 1024, ge=1024)
    connect_timeout_s: float = Field(default=2.0, gt=0)
    # Time to wait for an upstream's first byte (prefill can be long under load).
    upstream_timeout_s: float = Field(default=300.0, gt=0)
    max_attempts: int = Field(default=3, ge=1, le=10)
    log_level: str = "info"
    log_decisions: bool = False
    discovery: DiscoverySettings = Field(default_factory=DiscoverySettings)
    store: StoreSettings = Field(default_factory=StoreSettings)
    health: HealthSettings = Field(default_factory=HealthSettings)

    @property
    def block_bytes(self) -> int:
        return max(1, round(self.block_size * self.bytes_per_token))


def load_settings(path: str | Path | None, overrides: dict | None = None) -> RouterSettings:
    """Read YAML (if given), apply flat overrides (dotted keys allowed), validate."""
    data: dict = {}
    if path:
        text = Path(path).read_text()
        loaded = yaml.safe_load(text) or {}
        if not isinstance(loaded, dict):
            raise ValueError(f"{path}: the config file must hold a mapping")
        data = loaded
    for key, value in (overrides or {}).items():
        if value is None:
            continue
        node = data
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return RouterSettings.model_validate(data)
