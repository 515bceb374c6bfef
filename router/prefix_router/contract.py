"""The contract between the data plane and the control plane, in one place.

The router writes, and the operator and its metrics adapter read, the same Redis keys and the
same figure fields; the operator renders the router's settings file. Both sides import this
module, so a name changes here or nowhere.

Redis key layout, all under `prefixrouter:<model_key>:` (model_key is `<namespace>/<name>` of
the PrefixRoutedModel, so the operator's finalizer can delete a model's keys by prefix; keys
carry block hashes in hex, never prompt text):
  o:<model>:<hash>        HASH  backend -> last use (unix s): the owners of one prefix block
  lru:<model>:<backend>   ZSET  hash scored by last use: the backend's capacity model
  be:<model>              SET   backends with an lru set for the model
  ws:<bucket>             HLL   block hashes requested in one working-set bucket (a union
                                across router replicas, not a sum)
  h:<model>:<hash>        HASH  chains sent and not yet answered whose first block is <hash>:
                                "<router> <backend> <last block> <blocks>" -> "<unix s>
                                <backend> <chain>" (redis/holds.py)
  load:<router id>        HASH  i:<backend> -> this router's requests in flight there,
                                p:<backend> -> its prompt tokens dispatched there whose
                                prefill has not finished (expires: a dead router's load
                                disappears by itself)
  routers                 ZSET  router id scored by its last heartbeat
  models                  SET   model names with ownership here (for dropping a backend)
  router:<router id>      HASH  the router's figures over the window (RouterFigures)
  resp:<id hash>          STRING  the engine holding a stored Responses API response
                                (response_ids.py), expiring with `response_ttl_s`
  value:<router id>       HASH  engine URL -> prefill tokens a second only it would save,
                                from this router's requests (EngineValues)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields

# the settings file the operator renders for the router
from .config import RouterSettings as RouterSettings

KEY_PREFIX = "prefixrouter:"
OWNERS_INFIX = "o:"
LRU_INFIX = "lru:"
HOLDS_INFIX = "h:"
BACKENDS_INFIX = "be:"
WORKING_SET_INFIX = "ws:"
LOAD_INFIX = "load:"
ROUTERS_KEY = "routers"
MODELS_KEY = "models"
FIGURES_INFIX = "router:"
RESPONSE_INFIX = "resp:"
ENGINE_VALUES_INFIX = "value:"

# The working set is the distinct blocks requested within the window, counted in buckets.
WORKING_SET_BUCKET_S = 10
WORKING_SET_WINDOW_S = 60

# Every Prometheus series the router exports, and every external metric the adapter serves,
# starts with this: one name per figure whichever path (Prometheus or our adapter) carries it.
METRIC_PREFIX = "prefix_router_"
WORKING_SET_METRIC = METRIC_PREFIX + "working_set_tokens"
IN_FLIGHT_METRIC = METRIC_PREFIX + "in_flight"
# the dispatch queue's demand: requests waiting for an engine with room, the oldest's wait
QUEUED_METRIC = METRIC_PREFIX + "queued"
OLDEST_WAIT_METRIC = METRIC_PREFIX + "queue_oldest_wait_seconds"
# in flight + queued: the load an autoscaler sees, waiting demand included (the adapter's)
DEMAND_METRIC = METRIC_PREFIX + "demand"


def store_prefix(model_key: str) -> str:
    """Every Redis key of one PrefixRoutedModel starts with this."""
    return f"{KEY_PREFIX}{model_key}:"


class StoreKeys:
    """The keys of one model key's routers (see the layout above)."""

    __slots__ = ("prefix",)

    def __init__(self, model_key: str) -> None:
        self.prefix = store_prefix(model_key)

    def owners_prefix(self, model: str) -> str:
        """Followed by a block hash in 16 hex digits: that block's owners."""
        return f"{self.prefix}{OWNERS_INFIX}{model}:"

    def holds_prefix(self, model: str) -> str:
        """Followed by a block hash in 16 hex digits: the chains sent that start with it."""
        return f"{self.prefix}{HOLDS_INFIX}{model}:"

    def lru(self, model: str, backend: str) -> str:
        return f"{self.prefix}{LRU_INFIX}{model}:{backend}"

    def backends(self, model: str) -> str:
        return f"{self.prefix}{BACKENDS_INFIX}{model}"

    def working_set(self, bucket: int) -> str:
        return f"{self.prefix}{WORKING_SET_INFIX}{bucket}"

    def working_set_window(self, now: float) -> list[str]:
        """The buckets of the window that ends at `now` (unix seconds)."""
        b = int(now // WORKING_SET_BUCKET_S)
        n = WORKING_SET_WINDOW_S // WORKING_SET_BUCKET_S
        return [self.working_set(b - i) for i in range(n)]

    def load(self, router_id: str) -> str:
        return f"{self.prefix}{LOAD_INFIX}{router_id}"

    @property
    def routers(self) -> str:
        return self.prefix + ROUTERS_KEY

    @property
    def models(self) -> str:
        return self.prefix + MODELS_KEY

    def figures(self, router_id: str) -> str:
        return f"{self.prefix}{FIGURES_INFIX}{router_id}"

    def response(self, id_hash: int) -> str:
        """The holder of one stored response, by the 64-bit hash of its id."""
        return f"{self.prefix}{RESPONSE_INFIX}{id_hash:016x}"

    @property
    def figures_prefix(self) -> str:
        """Followed by a router id: that router's figures."""
        return self.prefix + FIGURES_INFIX

    def engine_values(self, router_id: str) -> str:
        return f"{self.prefix}{ENGINE_VALUES_INFIX}{router_id}"

    @property
    def engine_values_prefix(self) -> str:
        """Followed by a router id: that router's engine values."""
        return self.prefix + ENGINE_VALUES_INFIX


@dataclass(frozen=True, slots=True)
class RouterFigures:
    """What one router publishes about one model, over the working-set window."""

    prompt_tokens: float = 0.0  # prompt tokens routed in the window
    cached_tokens: float = 0.0  # of which predicted to hit a cached prefix
    working_set_tokens: float = 0.0  # the model-wide working set (the shared count)
    in_flight: float = 0.0  # requests in flight through this router now
    queued: float = 0.0  # requests waiting in this router's dispatch queue now
    oldest_wait_s: float = 0.0  # seconds the oldest of them has waited
    updated_at: float = 0.0  # unix seconds of the publication
    # the engines this router routes to, by how its index knows them (index/__init__.py):
    # EXACT (KV events in sequence) and DEGRADED; the rest are ESTIMATED
    engines: float = 0.0
    engines_exact: float = 0.0
    engines_degraded: float = 0.0

    def as_hash(self) -> dict[str, float]:
        return asdict(self)

    @classmethod
    def from_hash(cls, h: Mapping[str, object]) -> RouterFigures:
        """Tolerant of missing or garbled fields (a field another version did not write)."""
        values: dict[str, float] = {}
        for f in fields(cls):
            try:
                values[f.name] = float(h.get(f.name, 0) or 0)  # type: ignore[arg-type]
            except (TypeError, ValueError):
                values[f.name] = 0.0
        return cls(**values)


# The field of an EngineValues hash that is not an engine (engine fields are URLs).
UPDATED_AT_FIELD = "@updated_at"


@dataclass(frozen=True, slots=True)
class EngineValues:
    """What one router publishes per engine (fleet_value.py): prefill tokens a second that
    would be recomputed if that engine went, from the requests through this router whose
    longest match is on that engine alone. The routers' values add up."""

    values: Mapping[str, float]  # engine base URL -> tokens a second
    updated_at: float = 0.0  # unix seconds of the publication

    def as_hash(self) -> dict[str, float]:
        return {**self.values, UPDATED_AT_FIELD: self.updated_at}

    @classmethod
    def from_hash(cls, h: Mapping[str, object]) -> EngineValues:
        """Garbled fields are skipped (one bad entry must not hide the others)."""
        values: dict[str, float] = {}
        updated_at = 0.0
        for name, raw in h.items():
            try:
                v = float(raw)  # type: ignore[arg-type]
            except (TypeError, ValueError):
                continue
            if name == UPDATED_AT_FIELD:
                updated_at = v
            else:
                values[str(name)] = v
        return cls(values, updated_at)
