"""The router's Prometheus metrics (one registry per router, so tests can run several)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from .contract import OLDEST_WAIT_METRIC, QUEUED_METRIC, WORKING_SET_METRIC

if TYPE_CHECKING:
    from .store import StoreStats

_LATENCY = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_TOKENS = (0, 16, 64, 256, 1024, 4096, 16384)


class _WorkingSet(Collector):
    """The model's working set in tokens, or no sample at all while it is unknown (no shared
    store, not counted yet, or Redis away): an autoscaler must hold on a missing value, never
    scale on a made-up or outdated one. A plain Gauge always has a sample."""

    def __init__(self) -> None:
        self.tokens: float | None = None

    def collect(self) -> Iterator[GaugeMetricFamily]:
        g = GaugeMetricFamily(
            WORKING_SET_METRIC,
            "Tokens of the distinct prefix blocks the model's routers were asked for within the "
            "working-set window (a HyperLogLog union in the shared store x block size): the "
            "figure the metrics adapter serves under the same name. The same "
            "on every router of a model; absent while unknown.",
        )
        if self.tokens is not None:
            g.add_metric([], self.tokens)
        yield g


@dataclass(frozen=True, slots=True)
class EventStream:
    """One engine's KV-event stream as of a scrape."""

    backend: str
    applied: int  # events applied to the index
    skipped: int  # stored blocks not placed
    held: int  # blocks the index holds for it
    full_at: int  # the most blocks it held since it first evicted (0: it has not yet)


# (per engine, batches that did not decode, times an engine's entries were dropped)
EventStats = tuple[list[EventStream], int, int]


class _KvEvents(Collector):
    """The engines' KV-event streams, read at each scrape; no samples without `index: events`.
    Without these a user cannot tell an index fed by events from one whose events never
    come."""

    def __init__(self) -> None:
        self.read: Callable[[], EventStats] | None = None

    def collect(self) -> Iterator[Metric]:
        if self.read is None:
            return
        streams, errors, resets = self.read()
        per = [
            CounterMetricFamily("prefix_router_kv_events", "KV events applied to the index",
                                labels=["backend"]),
            CounterMetricFamily(
                "prefix_router_kv_event_blocks_skipped", "stored blocks the index could not "
                "place: parent not known (stored before the router listened, or evicted) or "
                "another block size", labels=["backend"]),
            GaugeMetricFamily("prefix_router_engine_cached_blocks",
                              "blocks the engine holds, as its KV events tell", labels=["backend"]),
            GaugeMetricFamily(
                "prefix_router_engine_full_blocks", "blocks the engine held when it evicted: "
                "its capacity as learned from its KV events (0 until its first eviction)",
                labels=["backend"]),
        ]  # fmt: skip
        for s in streams:
            for family, value in zip(per, (s.applied, s.skipped, s.held, s.full_at), strict=True):
                family.add_metric([s.backend], value)
        yield from per
        yield CounterMetricFamily("prefix_router_kv_event_decode_errors",
                                  "KV-event messages or batches that did not decode", value=errors)
        yield CounterMetricFamily(
            "prefix_router_kv_event_resets", "times an engine's entries were dropped: it "
            "restarted, or events were lost beyond its replay buffer", value=resets)


class _IndexStates(Collector):
    """Each engine's index state (index/__init__.py) as of a scrape: 1 on its state, 0 on the
    others, so a query can count the engines known EXACT, ESTIMATED or DEGRADED."""

    def __init__(self) -> None:
        self.read: Callable[[], dict[str, str]] | None = None

    def collect(self) -> Iterator[GaugeMetricFamily]:
        from .index import STATES

        g = GaugeMetricFamily(
            "prefix_router_index_state", "how the index knows an engine's entries: EXACT (KV "
            "events in sequence), ESTIMATED (routing decisions, corrected by reported cached "
            "tokens), DEGRADED (an events gap, a restart suspected, the store unreachable)",
            labels=["backend", "state"])  # fmt: skip
        for backend, state in (self.read() if self.read is not None else {}).items():
            for s in STATES:
                g.add_metric([backend, s], 1.0 if s == state else 0.0)
        yield g


class _Queue(Collector):
    """The dispatch queue's demand, read at each scrape (scheduling/queue.py)."""

    def __init__(self) -> None:
        self.read: Callable[[], tuple[int, float]] | None = None

    def collect(self) -> Iterator[Metric]:
        queued, oldest = self.read() if self.read is not None else (None, None)
        yield GaugeMetricFamily(QUEUED_METRIC, "requests waiting in the router's dispatch queue "
                                "for an engine with room", value=queued)
        yield GaugeMetricFamily(OLDEST_WAIT_METRIC, "seconds the oldest request in the "
                                "dispatch queue has waited", value=oldest)


class RouterMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter(
            "prefix_router_requests",
            "Requests by backend and outcome",
            ["backend", "outcome"],
            registry=r,
        )
        self.decisions = Counter(
            "prefix_router_routing_decisions",
            "Routing decisions: hit, miss, replicated, balanced, overflow",
            ["policy", "decision"],
            registry=r,
        )
        self.retries = Counter(
            "prefix_router_retries",
            "Attempts moved to another backend before the first byte",
            registry=r,
        )
        self.prompt_tokens = Counter(
            "prefix_router_prompt_tokens", "Estimated prompt tokens routed", registry=r
        )
        self.predicted_cached = Counter(
            "prefix_router_predicted_cached_tokens",
            "Prompt tokens the router predicted the chosen backend had cached",
            registry=r,
        )
        self.reported_cached = Counter(
            "prefix_router_reported_cached_tokens",
            "usage.prompt_tokens_details.cached_tokens reported by engines",
            registry=r,
        )
        self.reported_prompt = Counter(
            "prefix_router_reported_prompt_tokens",
            "usage.prompt_tokens reported by engines (for requests that reported usage)",
            registry=r,
        )
        self.prediction_error = Histogram(
            "prefix_router_cache_prediction_error_tokens",
            "|predicted - reported| cached tokens per request (index drift)",
            buckets=_TOKENS,
            registry=r,
        )
        self.corrections = Counter(
            "prefix_router_index_corrections",
            "Answers whose reported cached tokens differed from the index's prediction by a "
            "block or more: over (the engine held less) or under (it held more)",
            ["direction"],
            registry=r,
        )
        self.hit_ratio = Gauge(
            "prefix_router_estimated_hit_ratio",
            "Predicted cached tokens / prompt tokens since start",
            registry=r,
        )
        self.ttft = Histogram(
            "prefix_router_ttft_seconds",
            "Time from request arrival to the upstream's first byte",
            buckets=_LATENCY,
            registry=r,
        )
        self.overhead = Histogram(
            "prefix_router_decision_seconds",
            "Time spent parsing, hashing, looking up and choosing",
            buckets=(0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01),
            registry=r,
        )
        self.in_flight = Gauge(
            "prefix_router_backend_in_flight",
            "Requests this router has in flight on a backend",
            ["backend"],
            registry=r,
        )
        self.healthy = Gauge(
            "prefix_router_backend_healthy", "1 if taking traffic", ["backend"], registry=r
        )
        # the step rhythm the router reads from each backend's streams (steps.py)
        self.step = Gauge(
            "prefix_router_backend_step_seconds",
            "a backend's usual engine step, from its streamed tokens",
            ["backend"],
            registry=r,
        )
        self.step_lead = Gauge(
            "prefix_router_backend_step_lead_seconds",
            "sending to a backend plus hearing back from it: how far the rhythm the router "
            "sees lags the engine's",
            ["backend"],
            registry=r,
        )
        self.table_entries = Gauge(
            "prefix_router_table_entries", "(block, backend) ownership entries", registry=r
        )
        self.store_degraded = Gauge(
            "prefix_router_store_degraded", "1 while routing on local state only", registry=r
        )
        # a Gauge mirroring the store's own count (prometheus_client's Counter cannot be set)
        self.store_round_trips = Gauge(
            "prefix_router_store_round_trips",
            "round trips to the shared store since start",
            ["kind"],  # request: lookups and write-back flushes; timer: load and figures
            registry=r,
        )
        self.store_budget = Gauge(
            "prefix_router_store_budget_seconds",
            "the shared-store lookup budget now (adapts to the typical lookup time)",
            registry=r,
        )
        self.store_slow_lookups = Gauge(
            "prefix_router_store_slow_lookups",
            "lookups routed on local state because the shared store was over its budget",
            registry=r,
        )
        self._working_set = _WorkingSet()
        r.register(self._working_set)
        self._events = _KvEvents()
        r.register(self._events)
        self._states = _IndexStates()
        r.register(self._states)
        self.engine_drops = Counter(
            "prefix_router_engine_cache_drops",
            "Times an engine was found emptied behind its address (restart: a new process; "
            "sleep/wake; reset: its cache reset; shortfall: answers far below the prediction "
            "in a row) and its index entries dropped",
            ["backend", "reason"],
            registry=r,
        )
        self._queue = _Queue()
        r.register(self._queue)
        self.queue_decisions = Counter(
            "prefix_router_queue_decisions",
            "Dispatch queue decisions (queued, released, refused) by reason and band",
            ["decision", "reason", "band"],
            registry=r,
        )
        self.queue_wait = Histogram(
            "prefix_router_queue_wait_seconds", "Time released requests waited in the queue",
            buckets=_LATENCY, registry=r,
        )
        self._prompt_sum = 0.0
        self._pred_sum = 0.0
        self._children: dict[tuple[int | str, ...], object] = {}

    # labels() costs a lock and a tuple build per call; the hot path reuses the children,
    # keyed by the metric object itself (its name is not public API).
    def _child(self, metric, *labels: str):
        key = (id(metric), *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def count_request(self, backend: str, outcome: str) -> None:
        self._child(self.requests, backend, outcome).inc()

    def count_decision(self, policy: str, reason: str) -> None:
        self._child(self.decisions, policy, reason).inc()

    def count_correction(self, direction: str) -> None:
        self._child(self.corrections, direction).inc()

    def set_inflight(self, backend: str, value: float) -> None:
        self._child(self.in_flight, backend).set(value)

    def set_rhythm(self, backend: str, step: float | None, lead: float | None) -> None:
        if step is not None:
            self._child(self.step, backend).set(step)
        if lead is not None:
            self._child(self.step_lead, backend).set(lead)

    def show_store(self, entries: int, stats: StoreStats) -> None:
        """The index's size and the store's state, as of a scrape."""
        self.table_entries.set(entries)
        self.store_degraded.set(1 if stats.degraded else 0)
        self.store_round_trips.labels("request").set(stats.round_trips)
        self.store_round_trips.labels("timer").set(stats.timer_round_trips)
        self.store_slow_lookups.set(stats.slow_lookups)
        self.store_budget.set(stats.budget_s)
        # None: unknown, and the series shows no sample until a count comes
        self._working_set.tokens = stats.working_set_tokens

    def watch_states(self, read: Callable[[], dict[str, str]]) -> None:
        """Show each engine's index state, as `read` tells at a scrape."""
        self._states.read = read

    def count_drop(self, backend: str, reason: str) -> None:
        self.engine_drops.labels(backend, reason).inc()

    def count_queue(self, decision: str, reason: str, band: str) -> None:
        self._child(self.queue_decisions, decision, reason, band).inc()

    def watch_queue(self, read: Callable[[], tuple[int, float]]) -> None:
        """Show the dispatch queue's (requests waiting, oldest wait), as `read` tells."""
        self._queue.read = read

    def watch_events(self, read: Callable[[], EventStats]) -> None:
        """Show the engines' KV-event streams (index: events), as `read` tells at a scrape."""
        self._events.read = read

    def observe_prediction(self, prompt_tokens: float, predicted: float) -> None:
        self.prompt_tokens.inc(prompt_tokens)
        self.predicted_cached.inc(predicted)
        self._prompt_sum += prompt_tokens
        self._pred_sum += predicted
        if self._prompt_sum:
            self.hit_ratio.set(self._pred_sum / self._prompt_sum)

    def observe_usage(self, predicted: float, prompt: int, cached: int) -> None:
        self.reported_cached.inc(cached)
        self.reported_prompt.inc(prompt)
        self.prediction_error.observe(abs(predicted - cached))
