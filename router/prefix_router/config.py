"""Router settings: one pydantic model, loaded from a YAML file and overridden by flags.

The same keys are rendered by the operator into the router's ConfigMap, so the names here are
the contract between the control plane and the data plane.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Literal, get_args

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

# What one (block, backend) entry of the index costs in a running router: a dict entry and an
# ordered-dict node (bench/results/overhead: 1,000,000 entries took 188 MB).
INDEX_ENTRY_BYTES = 200

# Prometheus' own default port; the operator's router pods name it `metrics`.
METRICS_PORT = 9090

PolicyName = Literal["prefix", "round-robin", "random", "least-loaded", "chwbl"]
POLICIES: tuple[str, ...] = get_args(PolicyName)


def base_urls(entries: Iterable[str]) -> list[str]:
    """Backend base URLs: blank entries skipped, no trailing slash, http:// assumed."""
    urls = (e.strip().rstrip("/") for e in entries)
    return [u if "://" in u else "http://" + u for u in urls if u]


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
        return base_urls(v)

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
    # Longest a write (new ownership) waits for a round trip that goes anyway (a lookup, a
    # change of this router's load) to carry it to the store before it is sent on its own:
    # other routers see this router's records at most this late.
    write_delay_ms: float = Field(default=100.0, ge=0)
    max_entries_per_model: int = Field(default=2_000_000, ge=1000)
    # This router's name in the store (its load, heartbeat and figures); default: the host
    # name and a random suffix, so a restarted pod never inherits its predecessor's lease.
    router_id: str | None = None
    # The periods of the store's jobs (redis/): how soon a change of this router's load
    # reaches the others (a request sent goes at once; a prefill is ~100 ms, so the rest
    # within a few ms), the heartbeat that renews its lease of `load_lease_s` and reads the
    # others' load and the shared capacity model, the figures for the autoscaler, and
    # reconnection tries while Redis is away.
    flush_period_ms: float = Field(default=5.0, gt=0)
    heartbeat_period_s: float = Field(default=0.5, gt=0)
    load_lease_s: float = Field(default=3.0, gt=0)
    figures_period_s: float = Field(default=1.0, gt=0)
    reconnect_period_s: float = Field(default=0.5, gt=0)

    @model_validator(mode="after")
    def _redis_needs_url(self) -> StoreSettings:
        if self.mode == "redis" and not self.url:
            raise ValueError("store.mode=redis needs store.url")
        return self


class EventSettings(_Strict):
    """Where the engines publish their KV events (index: events; docs/kv-events.md)."""

    # On every engine's address (pods): vLLM's --kv-events-config endpoint and
    # replay_endpoint ports; replay_port null: no replay socket.
    port: int = Field(default=5557, ge=1, le=65535)
    replay_port: int | None = Field(default=5558, ge=1, le=65535)
    topic: str = ""
    # Per engine base URL, "tcp://host:port[,tcp://host:replay_port]", where the rule above
    # does not fit (several engines on one host).
    endpoints: dict[str, str] = Field(default_factory=dict)
    replay_timeout_s: float = Field(default=2.0, gt=0)
    # A routing decision's own entry stands until the engine's events confirm it, or this
    # long: an engine that never reports a block (its tokens differ from the router's) is
    # not believed to hold it for longer.
    speculative_s: float = Field(default=10.0, gt=0)
    # A lower KV tier's hit (an engine with CPU offloading: vLLM's OffloadingConnector,
    # LMCache) costs loading its blocks, in prefill tokens a token (index/tiers.py); a medium
    # not listed is not counted as a hit ({}: GPU only). CPU: 1/22, the largest TTFT
    # speed-up of a CPU hit over recomputing the prompt published for vLLM's offloading
    # connector (H100, "2-22x faster time-to-first-token": blog.vllm.ai/2026/01/08/
    # kv-offloading-connector.html): a load costs at least that share of the prefill.
    tier_costs: dict[str, float] = Field(default_factory=lambda: {"CPU": 1 / 22})
    # A router that starts reports ready once it has read every joined engine's replay (it
    # routes its first requests on the fleet's caches), or after this long whatever came.
    ready_wait_s: float = Field(default=10.0, ge=0)


class HealthSettings(_Strict):
    # The engines' health endpoint (vLLM and SGLang: /health; llama.cpp's server: /health,
    # llama-cpp-python's: /v1/models); 200 means ready.
    path: str = Field(default="/health", pattern=r"^/")
    probe_interval_s: float = Field(default=2.0, gt=0)
    probe_timeout_s: float = Field(default=1.0, gt=0)
    # consecutive failures (probe or request) before a backend is ejected
    eject_after_failures: int = Field(default=3, ge=1)
    # minimum time an ejected backend stays out before a successful probe re-admits it
    readmit_after_s: float = Field(default=5.0, ge=0)
    metrics_poll_interval_s: float = Field(default=1.0, gt=0)
    # An engine whose progress counters (tokens, steps on its /metrics) stand still this long
    # while this router has requests waiting there is hung: ejected at once, and the requests
    # waiting there go to another engine (progress.py). vLLM moves them every engine step.
    stall_after_s: float = Field(default=10.0, gt=0)


class BandSettings(_Strict):
    """One priority band of the dispatch queue (scheduling/queue.py)."""

    name: str = Field(min_length=1)
    # A request of this band that waits longer than this is refused: 429 with Retry-After.
    budget_s: float = Field(default=30.0, gt=0)
    # Refused with 429 at once, rather than queued, when every engine is saturated.
    sheddable: bool = False


class TenantSettings(_Strict):
    """A tenant's share of a saturated fleet and its default band."""

    weight: float = Field(default=1.0, gt=0)
    band: str | None = None


def _default_bands() -> list[BandSettings]:
    return [BandSettings(name="high"), BandSettings(name="standard"),
            BandSettings(name="sheddable", budget_s=5.0, sheddable=True)]  # fmt: skip


class QueueSettings(_Strict):
    """The dispatch queue: where requests wait while every engine for them is saturated
    (scheduling/queue.py, saturation.py, fairness.py)."""

    enabled: bool = True
    # An engine is saturated when its requests in flight reach its running capacity plus
    # this many waiting at the engine. Its capacity is what it was running while its own
    # waiting queue was not empty (its /metrics gauges), or `max_in_flight` when set.
    max_waiting: int = Field(default=4, ge=0)
    max_in_flight: int = Field(default=0, ge=0)  # 0: learned from the engine's gauges
    # Engine slots kept free while the fleet is saturated and a tenant under its fair share
    # (or a band above one waiting) is active: a tenant over its share is released only
    # beyond them, so the under-share one's next request starts at once instead of waiting
    # for a slot to free. Each costs up to a slot's throughput (bench/results/tenants).
    reserve: int = Field(default=0, ge=0)
    # A queued request whose prefix an engine holds waits up to this long for one of the
    # engines holding its longest prefix to have room (others with room meanwhile take the
    # requests behind it); after it, any engine with room. 0: the first engine with room,
    # a miss wherever its prefix is held (bench/results/tenants/late-binding).
    owner_wait_s: float = Field(default=2.0, ge=0)
    # Bounds of what waits: beyond either a request is refused (429) at once.
    max_requests: int = Field(default=10_000, ge=1)
    max_bytes: int = Field(default=256 * 2**20, ge=1024)
    # Priority bands, highest first; a request's band comes from `band_header` (set by a
    # trusted gateway), else its tenant's entry, else `default_band`.
    bands: list[BandSettings] = Field(default_factory=_default_bands, min_length=1)
    default_band: str = "standard"
    band_header: str | None = "x-priority-band"
    # The tenant: this header's value (default: salt_header), else a hash of the
    # Authorization key (`key:` + 16 hex digits of its sha256), else one tenant for all.
    tenant_header: str | None = None
    tenants: dict[str, TenantSettings] = Field(default_factory=dict)
    # A request's cost is its prompt tokens plus its max_tokens, or this when it sets none.
    default_decode_tokens: int = Field(default=256, ge=1)

    @model_validator(mode="after")
    def _bands_known(self) -> QueueSettings:
        names = [b.name for b in self.bands]
        if len(set(names)) != len(names):
            raise ValueError("queue.bands: band names must be distinct")
        for band in [self.default_band, *(t.band for t in self.tenants.values() if t.band)]:
            if band not in names:
                raise ValueError(f"queue: band {band!r} is not in queue.bands ({names})")
        return self


class RouterSettings(_Strict):
    """Every setting of the router. The reasons behind the measured defaults, with the runs
    that measured them, are in bench/results/router-settings/README.md."""

    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    # Served model names; empty means "whatever the backends serve" (learned from /v1/models).
    models: list[str] = Field(default_factory=list)
    policy: PolicyName = "prefix"
    # Hash block size in tokens; equal to the engine's KV block size so block boundaries agree.
    block_size: int = Field(default=16, ge=1, le=4096)
    # Estimated bytes of canonical prompt per token, where no tokenizer is given: the first
    # estimate, then learned from the token counts the engines report (sizing.py).
    bytes_per_token: float = Field(default=4.0, gt=0)
    # The model's tokenizer files (a directory with tokenizer.json and tokenizer_config.json,
    # the Hugging Face layout): prefixes are then keyed by the engine's own token ids, in
    # blocks of block_size tokens, so a block boundary is the engine's (tokens.py).
    tokenizer: str | None = None
    # Bounded load: no backend above ceil((1 + load_bound) x mean in flight), or above
    # mean + load_slack where that is higher. Below 0.5, brief bursts on a hot prefix's owners
    # made new copies of it, each a full prefill and KV space taken from colder prefixes.
    load_bound: float = Field(default=0.5, ge=0, le=10)
    # An absolute floor under the bound: at low load the relative bound alone is a handful of
    # requests, and each copy of a hot prefix costs more than the few decoding sequences it
    # spares its owner.
    load_slack: float = Field(default=6.0, ge=0)
    # chwbl's own bound: KubeAI's default load factor of 1.25, so the baseline is KubeAI's.
    chwbl_load_bound: float = Field(default=0.25, ge=0, le=10)
    # The scorers' weights, all in prefill tokens (scheduling/scorers/): one request in
    # flight costs load_cost_tokens; pending prefill tokens count at pending_weight; the
    # blocks a placement evicts count at evict_weight x their heat; each millisecond a request
    # would wait for the engine step in progress costs step_wait_tokens_per_ms (0 = off).
    load_cost_tokens: float = Field(default=64.0, ge=0)
    pending_weight: float = Field(default=0.5, ge=0)
    evict_weight: float = Field(default=1.0, ge=0)
    step_wait_tokens_per_ms: float = Field(default=30.0, ge=0)
    # At most this many owners recorded per block (0 = no limit).
    max_owners: int = Field(default=0, ge=0)
    ttl_seconds: float = Field(default=600.0, gt=0)
    # Per model-server replica KV capacity in tokens (0 = unknown: no capacity eviction).
    kv_capacity_tokens: int = Field(default=0, ge=0)
    # The engines report their cached prompt tokens on every answer, so an answer without the
    # count says none were cached (vLLM with --enable-prompt-tokens-details omits it when 0).
    # Off: a missing count is unknown (llama.cpp's server, vLLM without the flag).
    cached_tokens_reported: bool = False
    # What feeds the prefix index besides the router's own decisions: `corrected` learns from
    # the cached tokens engines report what each really holds (index/learning.py); `events`
    # adds the engines' KV events; `approx` is the decisions alone (for comparison).
    index: Literal["approx", "corrected", "events"] = "corrected"
    # An engine that leaves hands each prefix only it held to one successor, its rendezvous
    # heir (fleet_value.py), so the prefix's followers meet there. Off only to measure what
    # the handoff is worth (bench lifecycle's scale-down without it).
    handoff: bool = True
    # The prefix index's memory, whatever the capacity setting and whatever clients send:
    # past it the largest backends' oldest entries go (about 200 bytes an entry).
    index_memory_mb: float = Field(default=192.0, ge=1)
    # Prompts longer than this are refused (400) before they touch the index, where the
    # engines do not say their own max_model_len (vLLM's /v1/models does).
    max_prompt_tokens: int = Field(default=131_072, ge=1)
    # Tenant isolation: the header a trusted gateway sets to the tenant's salt. It salts the
    # prefix key and, with salt_header_wins, replaces any cache_salt in the body, which the
    # engine isolates its cache by too (a client must not pick another tenant's salt).
    salt_header: str | None = "x-cache-salt"
    salt_header_wins: bool = True
    # Session affinity (scheduling/scorers/session_affinity.py): a request naming its session
    # in this header is worth session_weight_tokens on the engine that served that session
    # last (0 = off); the last engines of at most max_sessions sessions are remembered. 256 is
    # four requests in flight (load_cost_tokens): a starting figure, not yet measured.
    # Stored Responses API responses: which engine holds each (response_ids.py), for at
    # most response_ttl_s and max_response_ids ids (about 100 bytes an id), shared with the
    # other router replicas through the store.
    response_ttl_s: float = Field(default=86_400.0, gt=0)
    max_response_ids: int = Field(default=500_000, ge=1)
    session_header: str | None = "x-session-id"
    session_weight_tokens: float = Field(default=256.0, ge=0)
    max_sessions: int = Field(default=100_000, ge=1)
    # Routing details for clients: x-routed-to and x-route-reason headers, engine addresses
    # in error messages. Off: a tenant must not learn that someone else sent a prefix.
    expose_routing: bool = False
    # /metrics on a port of its own: its series name every engine's URL, which a client of
    # the API must not learn. null: on the API port (where no client reaches that port);
    # 0: any free port, as for a router whose `port` is 0 when this is not given.
    metrics_port: int | None = Field(default=METRICS_PORT, ge=0, le=65535)
    # A connection that completes no request in this long (a silent client, headers sent a
    # byte at a time, an idle keep-alive) is closed; a body must arrive within body_timeout_s.
    keepalive_timeout_s: float = Field(default=15.0, gt=0)
    body_timeout_s: float = Field(default=60.0, gt=0)
    model_key: str = "default"
    max_body_bytes: int = Field(default=8 * 1024 * 1024, ge=1024)
    connect_timeout_s: float = Field(default=2.0, gt=0)
    # Longest an engine may stay silent on a request it took (prefill can be long under load).
    upstream_timeout_s: float = Field(default=300.0, gt=0)
    # A stream whose first token takes longer than this counts against its engine (the
    # request still waits up to upstream_timeout_s): a hung engine that answers its health
    # probes leaves the rotation after a few, instead of holding every request for minutes.
    first_token_budget_s: float = Field(default=60.0, gt=0)
    max_attempts: int = Field(default=3, ge=1, le=10)
    # Shutdown: after SIGTERM the router reports not ready and keeps serving for
    # drain_grace_s (until its Service stops sending: in a pod, a preStop pause does this
    # too), then closes its listener and gives the requests in flight up to
    # shutdown_timeout_s (long streams) before it cuts them.
    drain_grace_s: float = Field(default=0.0, ge=0)
    shutdown_timeout_s: float = Field(default=120.0, ge=0)
    log_level: str = "info"
    log_decisions: bool = False
    discovery: DiscoverySettings = Field(default_factory=DiscoverySettings)
    store: StoreSettings = Field(default_factory=StoreSettings)
    health: HealthSettings = Field(default_factory=HealthSettings)
    events: EventSettings = Field(default_factory=EventSettings)
    queue: QueueSettings = Field(default_factory=QueueSettings)

    @model_validator(mode="after")
    def _free_port_free_metrics(self) -> RouterSettings:
        # a router on any free port (tests, several on one host) must not take a fixed one
        if self.port == 0 and "metrics_port" not in self.model_fields_set:
            self.metrics_port = 0
        if self.metrics_port == self.port != 0:
            raise ValueError(f"metrics_port {self.metrics_port} is the API port: another, or "
                             "null for /metrics on the API port")
        return self

    @model_validator(mode="after")
    def _events_need_tokens(self) -> RouterSettings:
        if self.index == "events" and not self.tokenizer:
            raise ValueError("index=events needs tokenizer: the engines' events name token ids")
        return self

    @property
    def max_table_entries(self) -> int:
        return max(1000, int(self.index_memory_mb * 2**20 / INDEX_ENTRY_BYTES))

    @property
    def block_bytes(self) -> int:
        return max(1, round(self.block_size * self.bytes_per_token))


def load_settings(path: str | Path | None, overrides: dict | None = None) -> RouterSettings:
    """Read YAML (if given), apply flat overrides (dotted keys allowed), validate."""
    data: dict = {}
    if path:
        loaded = yaml.safe_load(Path(path).read_text()) or {}
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
