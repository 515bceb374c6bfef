"""Scenarios as data: which routers (setups) meet which workloads at which rates, how often,
what the report shows and the rules it judges. runner.py runs any of them, report.py writes
any of their reports; `python -m bench --help` lists them."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import yaml

from engine_sim.hf_tokenizer import TINY_TOKENIZER

from .harness.anchors import ANCHORS
from .harness.capacity import PROFILE
from .harness.shapes import Bursts, Ramp, Shape
from .harness.workloads import WORKLOADS


@dataclass(frozen=True)
class Setup:
    """Our router with a policy and settings (a YAML file every process gets), or an anchor."""

    name: str
    router: str = "prefix"  # our policy, or a name in ANCHORS
    settings: Mapping[str, Any] = field(default_factory=dict)
    replicas: int = 1  # router processes; requests spread over them as a Service would
    store: str = "local"  # "redis": a fresh redis-server shared by the replicas
    compared: bool = False  # in `bench compare`
    env: Mapping[str, str] = field(default_factory=dict)  # e.g. PYTHONPATH of an A/B copy


# What feeds the index (README "Router"); every mode is told the engines' tokenizer and that
# they report cached tokens, so the modes differ only in that.
INDEXES = ("approx", "corrected", "events")
MODES = tuple(f"prefix-{m}" for m in INDEXES)
TOKENIZER = os.path.relpath(TINY_TOKENIZER)

# One line here adds a router to every comparison (an anchor: its entry in ANCHORS).
SETUPS: dict[str, Setup] = {
    **{f"prefix-{m}": Setup(f"prefix-{m}", settings={
        "index": m, "tokenizer": TOKENIZER, "cached_tokens_reported": True}) for m in INDEXES},
    "prefix": Setup("prefix", compared=True),
    "prefix-3x-redis": Setup("prefix-3x-redis", replicas=3, store="redis", compared=True),
    "prefix-3x-local": Setup("prefix-3x-local", replicas=3),
    "prefix-redis": Setup("prefix-redis", store="redis"),
    **{p: Setup(p, p, compared=True) for p in ("round-robin", "least-loaded", "chwbl")},
    "random": Setup("random", "random"),
    **{a: Setup(a, a, compared=True) for a in ANCHORS},
}
OURS = ("prefix", "prefix-3x-redis")  # judged against every other compared router
COMPARED = tuple(n for n, s in SETUPS.items() if s.compared)
LOAD_BALANCERS = ("round-robin", "least-loaded")


def setup(spec: str | Setup) -> Setup:
    """A name in SETUPS, or `name,key=value,...`: more router settings (YAML values; dotted
    keys nest), or with `env.NAME=value` its routers' environment."""
    if isinstance(spec, Setup):
        return spec
    name, *pairs = spec.split(",")
    if name not in SETUPS:
        raise ValueError(f"unknown setup {name!r}; choose from {', '.join(SETUPS)}")
    base = SETUPS[name]
    if pairs and base.router in ANCHORS:
        raise ValueError(f"{spec!r}: settings apply to our router only")
    settings, env = json.loads(json.dumps(base.settings)), dict(base.env)  # deep copies
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"{spec!r}: settings are key=value")
        if key.startswith("env."):
            env[key[4:]] = value
            continue
        *path, leaf = key.split(".")
        node = settings
        for part in path:
            node = node.setdefault(part, {})
        node[leaf] = yaml.safe_load(value)
    return replace(base, name=spec, settings=settings, env=env) if pairs else base


def speaks_tokens(s: Setup) -> bool:
    """Keys prefixes by the simulators' token ids: they must run in token mode, with events."""
    return s.settings.get("tokenizer") == TOKENIZER


@dataclass(frozen=True)
class Rule:
    """Figure `key` of every point matching `where` (field -> value or tuple), over its `over`
    figure or over the same figure at the `vs` point (the best of several); op "best": no `vs`
    point better outside the spreads. `bound` None: shown, not judged."""

    text: str  # may name {workload}, {rate}, {router}, {scenario}
    key: str
    where: Mapping[str, Any]
    op: str = "<="  # "<=", ">=", "<", ">", "within" (|x - 1| <= bound), "best"
    bound: float | None = None
    vs: Mapping[str, Any] | None = None
    over: str | None = None
    high: bool = False  # higher is better
    saturation: bool = False  # not judged where the load balancers are past saturation


@dataclass(frozen=True)
class Scenario:
    name: str
    help: str  # its line in `python -m bench --help`
    title: str = ""
    method: str = ""  # the report's first paragraph
    out: str = ""  # folder under bench/results ("{rate:g}": one per rate)
    kind: str = "routing"  # or "overhead", "autoscale"
    workloads: tuple[str, ...] = ("system-prompts",)
    setups: tuple[str | Setup, ...] = ("prefix",)
    rates: tuple[float, ...] | None = (24.0,)  # None: each workload's staircase
    seconds: float = 60.0
    repeats: int = 1  # rounds, every setup once a round, so a drift of the host hits all alike
    staircase: bool = False  # the rates back to back in one load, caches kept
    fresh_fleet: bool = False  # new simulators for every run (else drained and reset)
    drain_s: float = 120.0
    replicas: int = 8
    profile: str = PROFILE
    time_scale: float = 1.0
    kv_capacity: int | None = None  # per simulator; None: the workload's (capacity.py)
    capacity_factor: float = 1.0  # routers are told this x the simulators' capacity
    engine: str = "sim"  # or "llama" (harness/llama.py)
    engine_config: Mapping[str, Any] = field(default_factory=dict)
    seed: int = 7
    session_header: bool = False  # X-Session-ID on every request (vllm consistent_hash)
    api: str = "chat"  # or "completions"
    clients: tuple[str, ...] = ("loadgen",)  # or "inference-perf": the same requests
    requests: int | None = None  # a fixed count of sessions instead of rate x seconds
    tag: str = ""  # tells runs of the same points apart
    sample_s: float = 0.0  # a timeline: the engines' counters every sample_s
    first_replicas: int | None = None  # routers find the rest at join_at (file discovery)
    join_at: float | None = None  # fractions of the run, as the next two
    redis_down: tuple[float, float] | None = None  # Redis killed, back empty
    restart: tuple[int, float] | None = None  # simulator k killed and started again
    kv_events: bool = False  # simulators in vLLM's token mode with KV events
    kv_shares: tuple[float, ...] = ()  # simulator k's capacity x kv_shares[k]
    cpu_tier: float = 0.0  # a CPU tier behind each simulator's GPU cache, x its capacity
    shape: Shape | None = None  # the rate over the run
    ws_share: float | None = None  # capacity such that the working set is this of the fleet's
    rules: tuple[Rule, ...] = ()
    columns: tuple[str, ...] = ()
    group_by: tuple[str, ...] = ("workload",)
    plot: str = ""  # "rate" or "timeline"
    report: str = "README.md"
    parts: tuple[str, ...] = ()  # a suite: the scenarios it runs and reports together
    quick: Mapping[str, Any] = field(default_factory=dict)  # what --quick overrides

    def rates_of(self, workload: str) -> tuple[float, ...]:
        return self.rates or WORKLOADS[workload].rates


COLUMNS = ("router", "engine_hit_rate", "oracle_hit_rate", "ttft_p50_ms", "ttft_p90_ms",
           "ttft_p99_ms", "e2e_p50_ms", "throughput_rps", "output_tokens_per_s", "errors",
           "imbalance")
STEP_COLUMNS = ("rate", "router", "engine_hit_rate", "ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms",
                "output_tokens_per_s", "errors", "unfinished", "queued_at_end", "imbalance",
                "engine_ttft_mean_ms", "requests_sent")
OVERHEAD_COLUMNS = ("router", "added_p50_ms", "added_p99_ms", "direct_p50_ms", "routed_p50_ms",
                    "routed_p99_ms", "max_rps", "direct_max_rps", "rss_mb", "rss_mb_1m_entries",
                    "errors")
FLEET = ("8 `engine-sim` replicas, profile `llama-3.1-70b-h100`, real time, KV capacity a replica "
         "from `bench/harness/capacity.py`. Streaming chat, Poisson arrivals, TTFT at the client; "
         "hit rates are the simulators' own counters, never the router's claim")
OVERHEAD = ("Small non-streaming requests (max_tokens 1) to one zero-latency simulator, direct "
            "and through the router at the same Poisson rate; added p50 / p99: routed minus "
            "direct percentile. `max_rps`: 64 closed-loop clients. RSS with 1M entries (first "
            "round): a router whose table unique prompts filled to 1,000,000 (block, backend) "
            "entries, as its /metrics counts them")
SP_PREFIX = {"scenario": "routing", "workload": "system-prompts", "router": "prefix"}
SHARING = tuple(w for w in WORKLOADS if w != "unique")

# real-engine (docs/real-engine.md): 3 llama-servers, 2 slots and a 16 MiB prompt cache each:
# about 4 of few-prompts' ~2,200-token prompts a server, so its 8 system prompts fit the fleet
# but not one server. Our router is told 4 prompts' tokens.
LLAMA_SERVERS = {"slots": 2, "cache_ram_mib": 16, "ctx_per_slot": 4096, "threads": 1}
LLAMA_KV_TOKENS = 4 * 2200
PREFIX_TOKENS = Setup("prefix", settings={"tokenizer": TOKENIZER})
LLAMA_FLEET = (
    "3 `llama-server` processes (llama.cpp b11434, a random-weight llama with the repo's tiny "
    "tokenizer; docs/real-engine.md), 2 slots and a 16 MiB prompt cache each, fresh every run. "
    "Hit rate: the servers' cached over total prompt tokens. `prefix` keys by the engine's "
    "token ids, told 8,800 tokens a server; sglang-router 0.3.2 cache_aware with its defaults")


def _best(ours: str) -> tuple[Rule, ...]:
    return tuple(
        Rule(f"{{workload}} at {{rate:g}} req/s: {ours} {what} of every router not ours", key,
             {"router": ours, "workload": SHARING}, "best", 0,
             {"router": tuple(n for n in COMPARED if n not in OURS)}, high=high, saturation=True)
        for what, key, high in (("best engine hit rate", "engine_hit_rate", True),
                                ("best TTFT p99", "ttft_p99_ms", False)))


SCENARIOS: dict[str, Scenario] = {s.name: s for s in (
    Scenario("demo", "system-prompts through prefix, round-robin and least-loaded (`make demo`)",
             "Demo", FLEET, "../.logs/demo", setups=("prefix", "round-robin", "least-loaded"),
             seconds=45.0, fresh_fleet=True, columns=COLUMNS),
    Scenario("routing", "issue 2's routing figures: system-prompts and unique, 24 req/s, 90 s",
             "Routing: every router on the same requests", FLEET, "routing",
             workloads=("system-prompts", "unique"),
             setups=("prefix", "round-robin", "least-loaded", "random", "chwbl"), seconds=90.0,
             repeats=3, fresh_fleet=True, columns=COLUMNS, quick={"seconds": 30.0, "repeats": 1}),
    Scenario("sweep", "system-prompts at 12 and 32 req/s through prefix and two load balancers",
             "system-prompts: rate sweep", FLEET, "sweep-{rate:g}",
             setups=("prefix", "round-robin", "least-loaded"), rates=(12.0, 32.0),
             fresh_fleet=True, columns=("rate", *COLUMNS), plot="rate", quick={"seconds": 20.0}),
    Scenario("overhead", "what one router adds to a direct call, its max req/s and its memory",
             "Router overhead", OVERHEAD, "overhead", kind="overhead", workloads=("",),
             rates=(500.0,), seconds=20.0, replicas=1, profile="zero", kv_capacity=1_000_000,
             columns=OVERHEAD_COLUMNS, group_by=(), quick={"seconds": 10.0}),
    Scenario("overhead-tokens", "issue 22: the overhead with token-aligned blocks, each index "
             "mode", "Router overhead with token-aligned blocks", OVERHEAD.replace(
                 "Small non-streaming requests", "Chat requests of ~2,000 tiny-tokenizer tokens "
                 "(a shared 1,800-token system prompt), non-streaming").replace(
                 "one zero-latency simulator", "one zero-latency simulator in token mode with "
                 "KV events (the router renders and tokenizes every prompt)"),
             "overhead-tokens", kind="overhead", workloads=("",), setups=MODES, rates=(500.0,),
             seconds=20.0, replicas=1, profile="zero", kv_capacity=20_000_000, kv_events=True,
             columns=OVERHEAD_COLUMNS, group_by=(), quick={"seconds": 10.0}, rules=(
                 Rule("{router}: added p50 < 1.5 ms", "added_p50_ms", {}, "<", 1.5),
                 Rule("{router}: added p99 < 5 ms", "added_p99_ms", {}, "<", 5.0))),
    Scenario("suite", "the committed figures of bench/results/README.md: routing, sweep, overhead",
             "Benchmark results", FLEET + " (points under routing/, sweep-*/, overhead/)", "",
             parts=("routing", "sweep", "overhead"), rules=(
                 Rule("system-prompts: prefix engine hit rate >= 0.80", "engine_hit_rate",
                      SP_PREFIX, ">=", 0.80),
                 Rule("system-prompts: prefix hit rate >= 0.95 x oracle", "engine_hit_rate",
                      SP_PREFIX, ">=", 0.95, over="oracle_hit_rate"),
                 Rule("system-prompts: prefix imbalance <= 1.3", "imbalance", SP_PREFIX, "<=",
                      1.3),
                 Rule("system-prompts: prefix TTFT p50 <= 0.23 x round-robin", "ttft_p50_ms",
                      SP_PREFIX, "<=", 0.23, {"router": "round-robin"}),
                 Rule("(diagnostic) the same ratio at the engines (arrival to first token)",
                      "engine_ttft_p50_ms", SP_PREFIX, vs={"router": "round-robin"}),
                 Rule("unique: prefix TTFT p50 within 5% of least-loaded", "ttft_p50_ms",
                      {**SP_PREFIX, "workload": "unique"}, "<=", 1.05,
                      {"router": "least-loaded"}),
                 Rule("overhead: added p50 < 1 ms at 500 req/s", "added_p50_ms",
                      {"scenario": "overhead", "router": "prefix"}, "<", 1.0),
                 Rule("overhead: added p99 < 5 ms at 500 req/s", "added_p99_ms",
                      {"scenario": "overhead", "router": "prefix"}, "<", 5.0),
                 Rule("overhead: RSS with 1,000,000 table entries < 250 MB", "rss_mb_1m_entries",
                      {"scenario": "overhead", "router": "prefix"}, "<", 250.0))),
    Scenario(
        "compare", "every router and anchor side by side on every workload (`make bench`)",
        "Side by side: ours, common policies and the anchor routers (issue 5)",
        "8 simulators a workload, emptied before each router; the same requests as a staircase "
        "of rates back to back (later steps start warm). A rate is past saturation (not judged) "
        "when both load balancers are: TTFT p50 over 1 s, over 5% failed, or a request a "
        "replica queued at the step's end. `X-Session-ID` on every request (consistent_hash)",
        "compare/full", workloads=tuple(w for w, spec in WORKLOADS.items() if spec.compared),
        setups=COMPARED, rates=None, seconds=11.0, staircase=True, drain_s=8.0,
        session_header=True, columns=STEP_COLUMNS, plot="rate",
        rules=(*_best("prefix"), *_best("prefix-3x-redis"), Rule(
            "unique at {rate:g} req/s: {router} TTFT p50 <= 1.05 x the best load balancer's",
            "ttft_p50_ms", {"router": OURS, "workload": "unique"}, "<=", 1.05,
            {"router": LOAD_BALANCERS}, saturation=True)),
        quick={"workloads": ("system-prompts", "unique"), "rates": (12.0, 32.0),
               "seconds": 4.0, "drain_s": 3.0, "out": "compare/quick"}),
    Scenario(
        "long-point", "one workload and rate, long, router setups in turn, round after round",
        "Long points: one workload and rate, router setups in turn, round after round",
        "From an emptied fleet, each setup in turn, round after round, on the same requests; "
        "a setup is a router name or `prefix,key=value` (our router with those settings)",
        "long-point", workloads=("multi-turn",), setups=("prefix", "sglang-cache_aware"),
        rates=(32.0,), seconds=30.0, repeats=2, drain_s=30.0, session_header=True,
        group_by=("workload", "rate", "tag"), columns=(
            "router", "engine_hit_rate", "ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms",
            "imbalance", "requests_ok")),
    Scenario(
        "shared-store", "1 router, 3 routers on one Redis, 3 routers with local tables",
        "Shared store", "Each setup in front of a fresh fleet, the same requests. " + FLEET,
        "shared-store", workloads=("system-prompts", "customers"),
        setups=("prefix", "prefix-3x-redis", "prefix-3x-local"), fresh_fleet=True, columns=(
            "router", "engine_hit_rate", "imbalance", "ttft_p50_ms", "ttft_p99_ms", "errors",
            "redis_round_trips_per_request", "redis_timer_round_trips_per_request"),
        report="shared-store.md", rules=(
            Rule("{workload}: 3 routers on Redis: hit rate >= 0.97 x 1 router",
                 "engine_hit_rate", {"router": "prefix-3x-redis"}, ">=", 0.97,
                 {"router": "prefix"}),
            Rule("{workload}: 3 routers on Redis: imbalance <= 1.3", "imbalance",
                 {"router": "prefix-3x-redis"}, "<=", 1.3))),
    Scenario(
        "fault", "3 routers on Redis; redis-server killed mid-run, back empty; recovery",
        "Redis killed and restarted empty under 3 routers", "redis-server gets SIGKILL a third "
        "into the run and a new, empty one starts on its port half way (a pod restarted "
        "without persistence). Recovery: from Redis's return to the first window whose hit "
        "rate is back to 90% of its mean before the kill", "shared-store",
        setups=("prefix-3x-redis",), seconds=120.0, sample_s=5.0, redis_down=(1 / 3, 0.5),
        columns=("router", "requests_sent", "errors", "recovery_s", "engine_hit_rate"),
        plot="timeline", report="fault.md", tag="fault",  # beside shared-store's points
        rules=(Rule("no request failed", "errors", {}, "<=", 0),
               Rule("hit rate back within 30 s of Redis's return", "recovery_s", {}, "<=", 30))),
    Scenario(
        "scale-out", "4 replicas become 8 mid-run (file discovery), prefix and load balancers",
        "Scale-out: 4 replicas become 8 a third into the run", "The routers find their backends "
        "in a file, which gains 4 more simulators a third into the run (as an HPA adds pods). "
        "Every 5 s: the new replicas' share of requests, the hit rate, the TTFT p50 of the "
        "requests sent in the window", "scale-out",
        setups=("prefix", "round-robin", "least-loaded"), rates=(16.0,), seconds=90.0,
        sample_s=5.0, first_replicas=4, join_at=1 / 3, plot="timeline", report="scale-out.md",
        columns=("router", "seconds_to_40pct", "after_join_hit_rate", "after_join_new_share",
                 "after_join_ttft_p50_ms", "errors")),
    Scenario(
        "client-check", "the same requests from our load generator and from inference-perf",
        "Two clients, one request sequence (issue 5)", "Both clients send the same requests in "
        "the same order (streaming completions of the chat template's rendering) at the same "
        "Poisson rate through the same router to 8 emptied simulators. `path_p50_ms`: client "
        "TTFT p50 - engine TTFT p50 (client, router and network)", "client-check",
        setups=("prefix", "round-robin"), rates=(8.0,), requests=240, api="completions",
        clients=("loadgen", "inference-perf"), drain_s=300.0, columns=(
            "router", "client", "requests_ok", "engine_hit_rate", "ttft_p50_ms", "ttft_p90_ms",
            "ttft_p99_ms", "engine_ttft_p50_ms", "engine_ttft_p90_ms", "engine_ttft_p99_ms",
            "path_p50_ms"),
        rules=(Rule("{router}: inference-perf's TTFT p50 within 5% of our load generator's",
                    "ttft_p50_ms", {"client": "inference-perf"}, "within", 0.05,
                    {"client": "loadgen"}),)),
    Scenario(
        "real-engine", "3 llama-servers with bounded prompt caches: prefix, round-robin, sglang",
        "A real engine: 3 llama-servers with bounded prompt caches (issue 22)", LLAMA_FLEET,
        "real-engine", workloads=("few-prompts",),
        setups=(PREFIX_TOKENS, "round-robin", "sglang-cache_aware"), rates=(4.0, 8.0),
        seconds=45.0, repeats=3, fresh_fleet=True, drain_s=60.0, replicas=3, engine="llama",
        engine_config=LLAMA_SERVERS, kv_capacity=LLAMA_KV_TOKENS, group_by=("workload", "rate"),
        columns=("router", "engine_hit_rate", "ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms",
                 "throughput_rps", "output_tokens_per_s", "errors", "imbalance", "requests_ok"),
        rules=tuple(Rule(f"{{workload}} at {{rate:g}} req/s: prefix {what}", key,
                         {"router": "prefix"}, op, 1.0 if op else None, {"router": vs},
                         high=high) for what, key, op, vs, high in (
            ("TTFT p50 below sglang cache_aware's", "ttft_p50_ms", "<", "sglang-cache_aware",
             False),
            ("engine hit rate at least sglang cache_aware's", "engine_hit_rate", ">=",
             "sglang-cache_aware", True),
            ("throughput over sglang cache_aware's", "throughput_rps", "", "sglang-cache_aware",
             True),
            ("TTFT p50 below round-robin's", "ttft_p50_ms", "<", "round-robin", False))),
        quick={"seconds": 20.0, "repeats": 1}),
    Scenario("autoscale", "cache pressure -> real HPA -> operator -> kwok pods, end to end",
             "Autoscaling on cache pressure, end to end", "", "autoscale", kind="autoscale"),
)}

# Issue 22: engines that drift from what the router is told, each case in the three index
# modes on the same simulators and requests (bench/results/drift/).
DRIFT_FLEET = (
    "8 `engine-sim` replicas in vLLM's token mode (tiny tokenizer, cached tokens reported, KV "
    "events), the same requests for every router: `prefix` with its index fed by its decisions "
    "(`prefix-approx`), corrected by the cached tokens engines report (`prefix-corrected`) or "
    "by their KV events (`prefix-events`). Oracle: one LRU cache as large as the fleet")
DRIFT_COLUMNS = ("router", "engine_hit_rate", "oracle_hit_rate", "hit_over_oracle",
                 "ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms", "errors", "preemptions",
                 "router_predicted_hit_rate", "index_corrections_over",
                 "index_corrections_under", "prediction_error_mean_tokens")
DRIFT_RULES = (
    Rule("{scenario}: events hit rate >= 0.97 x oracle", "engine_hit_rate",
         {"router": "prefix-events"}, ">=", 0.97, over="oracle_hit_rate"),
    Rule("{scenario}: corrected hit rate >= 0.90 x oracle", "engine_hit_rate",
         {"router": "prefix-corrected"}, ">=", 0.90, over="oracle_hit_rate"),
    Rule("(shown) {scenario}: approx hit rate / oracle", "engine_hit_rate",
         {"router": "prefix-approx"}, over="oracle_hit_rate"),
)
SP_F1 = {"scenario": "drift-f1", "router": MODES}


def _drift(name: str, help: str, title: str, what: str, out: str, **kw: Any) -> Scenario:
    base: dict[str, Any] = {
        "workloads": ("system-prompts",), "setups": MODES, "rates": (24.0,), "seconds": 90.0,
        "kv_events": True, "columns": DRIFT_COLUMNS, "group_by": (), "rules": DRIFT_RULES}
    return Scenario(name, help, title, what, f"drift/{out}", **{**base, **kw})


DRIFT = (
    _drift("drift-f1", "issue 22 at F = 1: the routing point in the three index modes",
           "F = 1: nothing gets worse", "system-prompts at 24 req/s for 90 s, routers told the "
           "real capacity, each index mode and round-robin, judged by the routing suite's rules",
           "f1", setups=(*MODES, "round-robin"), rules=(
               Rule("{scenario}: {router}: engine hit rate >= 0.80", "engine_hit_rate", SP_F1,
                    ">=", 0.80),
               Rule("{scenario}: {router}: hit rate >= 0.95 x oracle", "engine_hit_rate",
                    SP_F1, ">=", 0.95, over="oracle_hit_rate"),
               Rule("{scenario}: {router}: imbalance <= 1.3", "imbalance", SP_F1, "<=", 1.3),
               Rule("{scenario}: {router}: TTFT p50 <= 0.23 x round-robin", "ttft_p50_ms",
                    SP_F1, "<=", 0.23, {"router": "round-robin"}))),
    _drift("drift-f2", "issue 22: routers told 2 x the engines' KV capacity",
           "F = 2: the router believes twice the engines' memory", "Routers told 2 x the "
           "simulators' capacity: a blind index predicts blocks evicted long ago", "f2",
           capacity_factor=2.0),
    _drift("drift-f05", "issue 22: routers told half the engines' KV capacity",
           "F = 0.5: the router believes half the engines' memory", "Routers told 0.5 x the "
           "simulators' capacity: a blind index forgets blocks the engines still hold", "f05",
           capacity_factor=0.5),
    _drift("drift-mixed", "issue 22: engines of mixed KV capacities, routers told the mean",
           "Engines of mixed capacities", "Capacities 0.5, 0.5, 0.75, 0.75, 1.25, 1.25, 1.5, "
           "1.5 x 32,272 tokens (the same total); the routers are told the mean", "mixed",
           kv_shares=(0.5, 0.5, 0.75, 0.75, 1.25, 1.25, 1.5, 1.5)),
    _drift("drift-restart", "issue 22: one engine restarted mid-run, its cache empty",
           "One engine restarted mid-run", "Half way, simulator 0 gets SIGKILL and starts again "
           "on its ports: cache empty, event sequence from 0 (counters carried over); its "
           "requests in flight fail (errors)", "restart", restart=(0, 0.5)),
    _drift("drift-bursts", "issue 22: bursts of 5 x the rate that make engines preempt",
           "Bursts that force preemption", "12 req/s, and 60 req/s for 5 s every 15 s from 10 s "
           "in: a burst's sequences outgrow an engine's cache, so it preempts", "bursts",
           rates=(12.0,), shape=Bursts(15.0, 5.0, 5.0, 10.0), rules=(*DRIFT_RULES, Rule(
               "{scenario}: the engines preempted under {router}", "preemptions",
               {"scenario": "drift-bursts"}, ">", 0))),
    _drift("drift-llmd", "issue 22: llm-d's published shape on 8 replicas, a rate ramp",
           "llm-d's shape: 150 customers x 5 users, working set 73% of the fleet's KV",
           "llm-d.ai/blog/kvcache-wins-you-can-see (A.2): 150 6,000-token contexts x 5 users' "
           "1,200-token queries, a rate ramp from 0.1 x. Theirs on GPUs: TTFT p90 0.542 s "
           "precise, 31.083 s approximate", "llmd", workloads=("llm-d",),
           ws_share=0.732, shape=Ramp(0.1, 1.0), rates=(30.0,), seconds=120.0),
)
SCENARIOS.update({s.name: s for s in DRIFT})
GPU_ONLY = "prefix-events,events.tier_costs={}"  # today's scoring: CPU-tier events not counted
SCENARIOS["cpu-offload"] = Scenario(
    "cpu-offload", "issue 36: engines with a CPU tier 4 x their GPU cache, scored by tier or "
    "by the GPU alone", "CPU offloading: a lower tier's hits scored at their load cost",
    "8 `engine-sim` replicas in vLLM's token mode with KV events, each with a CPU tier of 4 x "
    "its GPU cache (`--kv-offloading-tokens`: a GPU eviction moves the block there, with "
    "events for both media; a CPU hit costs its load, 1.6 us a token against 79 us of "
    "prefill). The GPU caches hold a quarter of the working set (the customers workload: 150 "
    "contexts x 5 users), the CPU tiers (4 x) about all of it. `prefix-events` scores a "
    "CPU-tier block at 1 - 1/22 of a GPU hit (RouterSettings.events.tier_costs); `"
    + GPU_ONLY + "` counts GPU blocks only, as before issue 36. Hit rate: prompt tokens the "
    "engines did not prefill (GPU hits and CPU loads) over all; cpu: the CPU loads' share",
    "cpu-offload", workloads=("customers",),
    setups=("prefix-events", GPU_ONLY), rates=(10.0,), seconds=120.0, repeats=2,
    fresh_fleet=True, kv_events=True, ws_share=4.0, cpu_tier=4.0, group_by=(),
    columns=("router", "engine_hit_rate", "engine_cpu_hit_rate", "ttft_p50_ms", "ttft_p90_ms",
             "ttft_p99_ms", "throughput_rps", "errors", "imbalance"),
    rules=(Rule("CPU-tier scoring: engine hit rate >= GPU-only's", "engine_hit_rate",
                {"router": "prefix-events"}, ">=", 1.0, {"router": GPU_ONLY}),
           Rule("CPU-tier scoring: TTFT p50 <= GPU-only's", "ttft_p50_ms",
                {"router": "prefix-events"}, "<=", 1.0, {"router": GPU_ONLY})),
    quick={"seconds": 30.0, "repeats": 1})

# Issue 36: agent sessions, the traffic a router that renders chats differently from the
# engines misses (bench/results/agentic/)
SCENARIOS["agentic"] = Scenario(
    "agentic", "issue 36: agent sessions (tools, tool calls, content parts, images), the three "
    "index modes", "Agent sessions: tools, tool calls, content parts and images",
    DRIFT_FLEET.replace("the same requests", "agent sessions (workload `agentic`), the same "
                        "requests"), "agentic", workloads=("agentic",), setups=MODES,
    rates=(16.0,), seconds=90.0, kv_events=True, columns=DRIFT_COLUMNS, group_by=(),
    rules=DRIFT_RULES)
# Issue 37: chat with images, each image its own blocks of the key (bench/results/multimodal/)
SCENARIOS["multimodal"] = Scenario(
    "multimodal", "issue 37: chat with images (some shared), image blocks keyed by the image",
    "Chat with images: an image's blocks keyed by the image, as vLLM keys them",
    "8 `engine-sim` replicas in vLLM's token mode (tiny tokenizer, cached tokens reported, KV "
    "events), chat with images (workload `multimodal`: 8 system prompts, an image of 200 by "
    "Zipf(1.1), 5 questions), the same requests for every router: `prefix` with its index "
    "corrected by the cached tokens engines report (`prefix-corrected`) or fed by their KV "
    "events (`prefix-events`), `prefix` on byte blocks (no tokenizer), round-robin for scale. "
    "Oracle: one LRU cache as large as the fleet, its blocks keyed as the simulators' are",
    "multimodal", workloads=("multimodal",),
    setups=("prefix-events", "prefix-corrected", "prefix", "round-robin"), rates=(16.0,),
    seconds=60.0, kv_events=True, columns=DRIFT_COLUMNS, group_by=(),
    rules=(Rule("multimodal: events hit rate >= 0.95 x oracle", "engine_hit_rate",
                {"router": "prefix-events"}, ">=", 0.95, over="oracle_hit_rate"),
           Rule("multimodal: corrected hit rate >= 0.95 x oracle", "engine_hit_rate",
                {"router": "prefix-corrected"}, ">=", 0.95, over="oracle_hit_rate"),
           Rule("(shown) multimodal: byte blocks' hit rate / oracle", "engine_hit_rate",
                {"router": "prefix"}, over="oracle_hit_rate"),
           Rule("(shown) multimodal: round-robin's hit rate / oracle", "engine_hit_rate",
                {"router": "round-robin"}, over="oracle_hit_rate")),
    quick={"seconds": 20.0})
SCENARIOS["drift"] = Scenario(
    "drift", "issue 22's drift set: every case in the three index modes (bench/results/drift)",
    "Engines that drift: the index fed by decisions, reported cached tokens, or KV events",
    DRIFT_FLEET, "", parts=tuple(s.name for s in DRIFT), report="drift/README.md",
    columns=("scenario", *DRIFT_COLUMNS[:7], "preemptions"))
