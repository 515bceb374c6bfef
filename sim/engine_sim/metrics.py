"""Prometheus metrics under vLLM's names, each labelled with `model_name` as vLLM V1 does.

Counters count tokens where vLLM's do (prefix_cache_queries/hits are prompt tokens looked up
and found at admission). Latency histograms are wall-clock seconds as a scraper sees them,
so with --time-scale 0.1 they read ten times shorter than the simulated figures. Counters
stay monotonic across POST /reset (only /stats is zeroed): a drop would read as a restart.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from .engine import Engine, EngineObserver, Request

# vLLM's bucket boundaries (vllm/v1/metrics/loggers.py), so dashboards built for vLLM work.
_TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
_REQUEST_LATENCY_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
    60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
_TPOT_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
    7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
_TOKEN_BUCKETS: tuple[float, ...] = (
    1,
    2,
    5,
    10,
    20,
    50,
    100,
    200,
    500,
    1000,
    2000,
    5000,
    10000,
    20000,
    50000,
)


class EngineMetrics(EngineObserver):
    def __init__(self, model_name: str, block_size: int, num_blocks: int) -> None:
        self.registry = r = CollectorRegistry()
        self.model = m = model_name

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, ["model_name"], registry=r)

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, ["model_name"], registry=r)

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, ["model_name"], buckets=buckets, registry=r)

        self.running = gauge(
            "vllm:num_requests_running", "Number of requests in model execution batches."
        )
        self.waiting = gauge(
            "vllm:num_requests_waiting", "Number of requests waiting to be processed."
        )
        self.kv_usage = gauge(
            "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."
        )
        # The V0 name, still read by older dashboards and autoscalers.
        self.gpu_usage = gauge(
            "vllm:gpu_cache_usage_perc", "GPU KV-cache usage. 1 means 100 percent usage."
        )
        self.queries = counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
        )
        self.hits = counter(
            "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens."
        )
        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = counter(
            "vllm:generation_tokens", "Number of generation tokens processed."
        )
        self.success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            ["model_name", "finished_reason"],
            registry=r,
        )
        self.ttft = histogram(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            _TTFT_BUCKETS,
        )
        self.tpot = histogram(
            "vllm:time_per_output_token_seconds",
            "Histogram of time per output token in seconds.",
            _TPOT_BUCKETS,
        )
        self.e2e = histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            _REQUEST_LATENCY_BUCKETS,
        )
        self.queue_time = histogram(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            _REQUEST_LATENCY_BUCKETS,
        )
        self.req_prompt = histogram(
            "vllm:request_prompt_tokens", "Number of prefill tokens processed.", _TOKEN_BUCKETS
        )
        self.req_generation = histogram(
            "vllm:request_generation_tokens",
            "Number of generation tokens processed.",
            _TOKEN_BUCKETS,
        )
        info = Gauge(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            ["block_size", "num_gpu_blocks", "enable_prefix_caching"],
            registry=r,
        )
        info.labels(str(block_size), str(num_blocks), "True").set(1)
        # Children resolved once: the hooks run per request on the engine's loop.
        self._queries = self.queries.labels(m)
        self._hits = self.hits.labels(m)
        self._prompt = self.prompt_tokens.labels(m)
        self._gen = self.generation_tokens.labels(m)
        self._success = self.success.labels(m, "length")
        self._ttft = self.ttft.labels(m)
        self._tpot = self.tpot.labels(m)
        self._e2e = self.e2e.labels(m)
        self._queue = self.queue_time.labels(m)
        self._req_prompt = self.req_prompt.labels(m)
        self._req_gen = self.req_generation.labels(m)

    def bind(self, engine: Engine) -> None:
        """Gauges read the engine at scrape time rather than being pushed on every step."""
        m = self.model
        self.running.labels(m).set_function(lambda: engine.num_running)
        self.waiting.labels(m).set_function(lambda: engine.num_waiting)
        self.kv_usage.labels(m).set_function(engine.cache.usage_fraction)
        self.gpu_usage.labels(m).set_function(engine.cache.usage_fraction)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    # ---- engine hooks -----------------------------------------------------------------

    def on_admitted(self, req: Request) -> None:
        self._queries.inc(req.prompt_tokens)
        self._hits.inc(req.cached_tokens)
        # vLLM V1 counts every prompt token here, cached or not.
        self._prompt.inc(req.prompt_tokens)
        if req.admitted_at is not None:
            self._queue.observe(req.admitted_at - req.arrival)

    def on_first_token(self, req: Request) -> None:
        if req.first_token_at is not None:
            self._ttft.observe(req.first_token_at - req.arrival)

    def on_tokens(self, count: int) -> None:
        # Per step rather than per request, so aborted requests' tokens count too, as in vLLM.
        self._gen.inc(count)

    def on_finished(self, req: Request) -> None:
        n = req.completion_tokens
        self._success.inc()
        self._req_prompt.observe(req.prompt_tokens)
        self._req_gen.observe(n)
        if req.finished_at is None:
            return
        self._e2e.observe(req.finished_at - req.arrival)
        if n > 1 and req.first_token_at is not None:
            self._tpot.observe((req.finished_at - req.first_token_at) / (n - 1))
