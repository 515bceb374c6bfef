"""Prometheus metrics under vLLM's names (V1 engine), labelled with model_name."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

_TTFT = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
_E2E = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0)


class _CacheResets(Collector):
    """Times the engine's whole prefix cache was emptied (/reset_prefix_cache, /reset): what a
    router reads to drop what it believed the engine held. vLLM exports no such counter."""

    def __init__(self, engine) -> None:
        self._engine = engine

    def collect(self) -> Iterator[CounterMetricFamily]:
        yield CounterMetricFamily("engine_sim_prefix_cache_resets",
                                  "Times the whole prefix cache was emptied",
                                  value=self._engine.cache_resets)


class EngineMetrics:
    def __init__(self, model: str, engine) -> None:  # engine: engine.Engine
        r = self.registry = CollectorRegistry()
        # process_start_time_seconds and the rest, as vLLM serves them (prometheus_client's
        # default registry there): a restart behind the same address shows as a new start
        ProcessCollector(registry=r)
        r.register(_CacheResets(engine))
        labels = ["model_name"]
        self.running = Gauge(
            "vllm:num_requests_running", "Requests in the running batch", labels, registry=r
        )
        self.waiting = Gauge("vllm:num_requests_waiting", "Requests waiting", labels, registry=r)
        self.kv = Gauge("vllm:kv_cache_usage_perc", "KV-cache usage (1 = 100%)", labels, registry=r)
        self.kv_old = Gauge(
            "vllm:gpu_cache_usage_perc", "KV-cache usage (pre-V1 name)", labels, registry=r
        )
        self.queries = Counter(
            "vllm:prefix_cache_queries", "Prefix-cache queried tokens", labels, registry=r
        )
        self.hits = Counter("vllm:prefix_cache_hits", "Prefix-cache hit tokens", labels, registry=r)
        self.prompt = Counter("vllm:prompt_tokens", "Prefill tokens processed", labels, registry=r)
        # counted as each token is made, as vLLM counts them every engine step (a router reads
        # the engine's progress from it while a long answer is generated)
        r.register(_Generated(model, engine))
        self.success = Counter(
            "vllm:request_success",
            "Finished requests",
            ["model_name", "finished_reason"],
            registry=r,
        )
        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds",
            "Time to first token",
            labels,
            buckets=_TTFT,
            registry=r,
        )
        self.e2e = Histogram(
            "vllm:e2e_request_latency_seconds",
            "End-to-end request latency",
            labels,
            buckets=_E2E,
            registry=r,
        )
        self.preemptions = Counter(
            "vllm:num_preemptions", "Requests preempted (recompute)", labels, registry=r
        )
        self.sleep_state = Gauge(
            "vllm:engine_sleep_state", "Engine sleep state (1 on the state it is in)",
            ["model_name", "sleep_state"], registry=r,
        )
        for i, state in enumerate(("awake", "weights_offloaded", "discard_all")):
            self.sleep_state.labels(model, state).set_function(
                lambda i=i: 1.0 if engine.sleep_level == i else 0.0)
        self.decode_steps = Gauge(
            "engine_sim_decode_steps", "Engine steps that only decoded", registry=r
        )
        self.decode_seconds = Gauge(
            "engine_sim_decode_step_seconds", "Wall time of those steps, in all", registry=r
        )
        self.decode_steps.set_function(lambda: engine.counters.decode_steps)
        self.decode_seconds.set_function(lambda: engine.counters.decode_step_seconds)
        m = model
        self.running.labels(m).set_function(lambda: len(engine.running))
        self.waiting.labels(m).set_function(lambda: len(engine.waiting))
        self.kv.labels(m).set_function(lambda: engine.cache.usage_fraction())
        self.kv_old.labels(m).set_function(lambda: engine.cache.usage_fraction())
        self._m = m

    def admitted(self, prompt_tokens: int, cached_tokens: int) -> None:
        self.queries.labels(self._m).inc(prompt_tokens)
        self.hits.labels(self._m).inc(cached_tokens)
        self.prompt.labels(self._m).inc(prompt_tokens)

    def preempted(self) -> None:
        self.preemptions.labels(self._m).inc()

    def first_token(self, seconds: float) -> None:
        self.ttft.labels(self._m).observe(seconds)

    def finished(self, seconds: float, generated: int, reason: str) -> None:
        self.success.labels(self._m, reason).inc()
        self.e2e.labels(self._m).observe(seconds)


class _Generated(Collector):
    def __init__(self, model: str, engine) -> None:  # engine: engine.Engine
        self._model = model
        self._engine = engine

    def collect(self) -> Iterator[CounterMetricFamily | HistogramMetricFamily]:
        counters = self._engine.counters
        c = CounterMetricFamily(
            "vllm:generation_tokens", "Generation tokens", labels=["model_name"]
        )
        c.add_metric([self._model], counters.generation_tokens)
        yield c
        # one bucket: the steps and their tokens are what is read of it
        h = HistogramMetricFamily(
            "vllm:iteration_tokens_total", "Tokens per engine step", labels=["model_name"]
        )
        h.add_metric([self._model], [("+Inf", counters.steps)], counters.step_tokens)
        yield h
