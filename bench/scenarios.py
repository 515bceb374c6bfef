"""Scenarios as data: which routers (setups) meet which workloads at which rates, how often,
in what order, what the report shows and the rules it judges. bench/runner.py runs any of them,
bench/report.py writes any of their reports; `python -m bench --help` lists them."""

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
    """One router configuration in front of the fleet: our router with a policy and settings
    (a YAML file given to every `prefix-router` process), or an anchor."""

    name: str
    router: str = "prefix"  # our policy, or a name in ANCHORS
    settings: Mapping[str, Any] = field(default_factory=dict)
    replicas: int = 1  # router processes; requests spread over them as a Service would
    store: str = "local"  # "redis": a fresh redis-server shared by the replicas
    compared: bool = False  # in `bench compare`, every router side by side
    # environment of its router processes (e.g. PYTHONPATH: a patched copy of the router, A/B)
    env: Mapping[str, str] = field(default_factory=dict)


# What feeds our router's prefix index (README "Router"). In every mode the router is told
# the engines' tokenizer (token-aligned blocks: the simulators' `--tokenizer tiny`) and that
# they report cached tokens on every answer (vLLM with --enable-prompt-tokens-details), so the
# modes differ only in what feeds the index.
INDEXES = ("approx", "corrected", "events")
MODES = tuple(f"prefix-{m}" for m in INDEXES)
TOKENIZER = os.path.relpath(TINY_TOKENIZER)


def index_settings(mode: str) -> dict[str, Any]:
    return {"index": mode, "tokenizer": TOKENIZER, "cached_tokens_reported": True}


# One line here adds a router to every comparison (an anchor: its entry in ANCHORS).
SETUPS: dict[str, Setup] = {
    **{f"prefix-{m}": Setup(f"prefix-{m}", settings=index_settings(m)) for m in INDEXES},
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
    """A name in SETUPS, or `name,key=value[,key=value]`: that setup with more router
    settings (values read as YAML; a dotted key nests: `store.near_cache_ttl_ms=0`); a key
    `env.NAME` sets its routers' environment instead (`env.PYTHONPATH=/tmp/patched`)."""
    if isinstance(spec, Setup):
        return spec
    name, *pairs = spec.split(",")
    if name not in SETUPS:
        raise ValueError(f"unknown setup {name!r}; choose from {', '.join(SETUPS)}")
    base = SETUPS[name]
    if not pairs:
        return base
    if base.router in ANCHORS:
        raise ValueError(f"{spec!r}: settings apply to our router only")
    settings = json.loads(json.dumps(base.settings))  # a deep copy to add to
    env = dict(base.env)
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
    return replace(base, name=spec, settings=settings, env=env)


def speaks_tokens(s: Setup) -> bool:
    """The setup's router keys prefixes by the simulators' token ids (an index mode's
    settings): the simulators must run in tokenizer mode, with their KV events."""
    return s.settings.get("tokenizer") == TOKENIZER


@dataclass(frozen=True)
class Rule:
    """An acceptance rule on every point it selects (`where`: field -> value or tuple of values):
    figure `key` over the point's `over` figure, or over the same figure at the `vs` point (the
    judged one with those fields changed; of several, the best); "best": no `vs` point better
    outside the spreads. `bound` None: shown, not judged. `text` may name {workload}, {rate}..."""

    text: str
    key: str
    where: Mapping[str, Any]
    op: str = "<="  # "<=", ">=", "<", "within" (|x - 1| <= bound), "best"
    bound: float | None = None
    vs: Mapping[str, Any] | None = None
    over: str | None = None
    high: bool = False  # higher is better
    saturation: bool = False  # not judged where the load balancers are past saturation
    # judged only where the point with these fields changed is below `bound` on the same
    # figure (over `over`): "corrected >= 0.90 x oracle wherever approx alone falls below"
    below: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class Scenario:
    name: str
    help: str  # one line for `python -m bench --help`
    title: str = ""
    method: str = ""  # the report's first paragraph: how the figures were measured
    out: str = ""  # results folder under bench/results ("{rate:g}" makes one per rate)
    kind: str = "routing"  # "routing" (runner.py), "overhead", "autoscale"
    workloads: tuple[str, ...] = ("system-prompts",)
    setups: tuple[str | Setup, ...] = ("prefix",)
    rates: tuple[float, ...] | None = (24.0,)  # None: each workload's staircase (Spec.rates)
    seconds: float = 60.0
    repeats: int = 1  # rounds; every setup once per round, so host drift hits all alike
    staircase: bool = False  # the rates back to back in one load per setup, caches kept
    fresh_fleet: bool = False  # new simulators for every run (else reset between setups)
    drain_s: float = 120.0  # after the load, for the requests in flight
    replicas: int = 8
    profile: str = PROFILE
    time_scale: float = 1.0
    kv_capacity: int | None = None  # per simulator; None: the workload's (capacity.py)
    capacity_factor: float = 1.0  # routers are told this x the simulators' KV capacity
    engine: str = "sim"  # "llama": llama-server processes (bench/harness/llama.py), fresh a run
    engine_config: Mapping[str, Any] = field(default_factory=dict)  # llama: ServerConfig(**it)
    seed: int = 7
    session_header: bool = False  # X-Session-ID on every request (vllm consistent_hash)
    api: str = "chat"  # "completions": the rendered prompt to /v1/completions
    clients: tuple[str, ...] = ("loadgen",)  # "inference-perf": the same requests, its client
    requests: int | None = None  # a fixed count of sessions instead of rate x seconds
    tag: str = ""  # tells runs of the same points apart (files and tables)
    sample_s: float = 0.0  # timeline: the engines' counters every sample_s
    first_replicas: int | None = None  # timeline: routers start on these, find the rest...
    join_at: float | None = None  # ...this far into the run (a fraction; file discovery)
    redis_down: tuple[float, float] | None = None  # timeline: Redis killed, back empty (same)
    # Engines that drift from what the router is told (issue 22). kv_events: the simulators
    # speak vLLM's protocol: tokenizer mode (`--tokenizer tiny`, capacities scaled to its
    # tokens), cached tokens reported as vLLM does, KV events on ports of their own (set
    # whenever a setup's router keys by their tokens: speaks_tokens)
    kv_events: bool = False
    kv_shares: tuple[float, ...] = ()  # simulator k's capacity: kv_capacity x kv_shares[k]
    restart: tuple[int, float] | None = None  # simulator k killed and started again at f
    shape: Shape | None = None  # the rate over the run (harness/shapes.py)
    ws_share: float | None = None  # capacity such that the working set is this of the fleet's
    rules: tuple[Rule, ...] = ()
    columns: tuple[str, ...] = ()
    group_by: tuple[str, ...] = ("workload",)
    plot: str = ""  # "rate": TTFT and hit rate against the rate; "timeline"
    report: str = "README.md"
    parts: tuple[str, ...] = ()  # a suite: the scenarios it runs and reports together
    quick: Mapping[str, Any] = field(default_factory=dict)  # overrides of --quick

    def rates_of(self, workload: str) -> tuple[float, ...]:
        return self.rates or WORKLOADS[workload].rates


COLUMNS = ("router", "engine_hit_rate", "oracle_hit_rate", "ttft_p50_ms", "ttft_p90_ms",
           "ttft_p99_ms", "e2e_p50_ms", "throughput_rps", "output_tokens_per_s", "errors",
           "imbalance")
STEP_COLUMNS = ("rate", "router", "engine_hit_rate", "ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms",
                "output_tokens_per_s", "errors", "unfinished", "queued_at_end", "imbalance",
                "engine_ttft_mean_ms", "requests_sent")
FLEET = ("8 `engine-sim` replicas, profile `llama-3.1-70b-h100` (Llama-3.1-70B on 4 x H100, "
         "derivation in `sim/engine_sim/profiles.py`), real time, KV capacity per replica from "
         "`bench/harness/workloads.py` (system-prompts: 24k tokens = 0.19 of its 128k-token "
         "working set; the fleet holds 192k). Requests: streaming chat, Poisson arrivals; "
         "TTFT = time to the first content token at the client. Every hit rate is measured at "
         "the simulated engines (their own counters), never claimed by the router")
OVERHEAD_COLUMNS = ("router", "added_p50_ms", "added_p99_ms", "direct_p50_ms", "routed_p50_ms",
                    "routed_p99_ms", "max_rps", "direct_max_rps", "rss_mb", "rss_mb_1m_entries",
                    "errors")
SP_PREFIX = {"scenario": "routing", "workload": "system-prompts", "router": "prefix"}
SHARING = tuple(w for w in WORKLOADS if w != "unique")


# The real-engine scenario's fleet (docs/real-engine.md): 3 llama-servers, each 2 slots and a
# 16 MiB host prompt cache. few-prompts' requests take ~2,190 tokens with their answers, 4.3 MiB
# of KV (2,048 bytes a token): K = 3 host entries, and a server holds 2 + 3 - 1 = 4 whole
# prompts (bench/harness/llama.py, prompts_held), the fleet 12: its 8 system prompts are more
# than one server holds and fewer than the fleet holds. Our router is told 4 prompts' tokens.
LLAMA_SERVERS = {"slots": 2, "cache_ram_mib": 16, "ctx_per_slot": 4096, "threads": 1}
LLAMA_KV_TOKENS = 4 * 2200
PREFIX_TOKENS = Setup("prefix", settings={"tokenizer": "sim/engine_sim/data/tiny-tokenizer"})
LLAMA_FLEET = (
    "3 `llama-server` processes (llama.cpp b11434 built here, `hack/llama/`; a 3.8M-parameter "
    "random-weight llama with the repo's tiny tokenizer, `--threads 1` each), each with 2 slots "
    "(`--parallel 2`, 4,096 tokens each) and a 16 MiB host prompt cache (`--cache-ram 16`): "
    "about 4 of this workload's whole prompts a server, 12 for the fleet. Workload `few-prompts`: "
    "8 system prompts of ~2,020 tokens (Zipf 1.1: the most popular takes 36% of requests, the "
    "least 4%), user turns of ~55-160 tokens, answers of 16-64 tokens; single-turn streaming "
    "chat, Poisson arrivals, the same request sequence for every router. Fresh servers (empty "
    "caches) for every run; each round runs every router once, so a drift of the host hits "
    "them alike. The CPU is the engine: 2 cores shared by the 3 servers, the router and the "
    "load generator. Engine hit rate: the servers' own counters, `llamacpp:prompt_tokens_cached_"
    "total` over it plus `llamacpp:prompt_tokens_total` (computed), deltas over the run; "
    "imbalance: max/mean of the prompt tokens each server took (llama-server counts no "
    "requests). Throughput: requests completed over the run's wall time including the drain. "
    "Our router (`prefix`) keys prefixes by the engine's token ids (`tokenizer`: the tiny "
    "tokenizer), index `corrected` (the default), told 8,800 tokens a server; sglang-router "
    "0.3.2 cache_aware with its documented defaults; round-robin is our router's profile. Why "
    "ours trailed sglang here, measured, and the two fixes: `causes.md` beside this file")


def _best(ours: str) -> tuple[Rule, ...]:
    return tuple(
        Rule(f"{{workload}} at {{rate:g}} req/s: {ours} {what} of every router not ours", key,
             {"router": ours, "workload": SHARING}, "best", 0,
             {"router": tuple(n for n in COMPARED if n not in OURS)},
             high=high, saturation=True)
        for what, key, high in (("best engine hit rate", "engine_hit_rate", True),
                                ("best TTFT p99", "ttft_p99_ms", False)))


SCENARIOS: dict[str, Scenario] = {s.name: s for s in (
    Scenario(
        "demo", "system-prompts through prefix, round-robin and least-loaded (`make demo`)",
        "Demo", FLEET, "../.logs/demo", setups=("prefix", "round-robin", "least-loaded"),
        seconds=45.0, fresh_fleet=True, columns=COLUMNS),
    Scenario(
        "routing", "issue 2's routing figures: system-prompts and unique, 24 req/s, 90 s",
        "Routing: every router on the same requests", FLEET, "routing",
        workloads=("system-prompts", "unique"),
        setups=("prefix", "round-robin", "least-loaded", "random", "chwbl"), seconds=90.0,
        repeats=3, fresh_fleet=True, columns=COLUMNS, quick={"seconds": 30.0, "repeats": 1}),
    Scenario(
        "sweep", "system-prompts at 12 and 32 req/s through prefix and two load balancers",
        "system-prompts: rate sweep", FLEET, "sweep-{rate:g}",
        setups=("prefix", "round-robin", "least-loaded"), rates=(12.0, 32.0), fresh_fleet=True,
        columns=("rate", *COLUMNS), plot="rate", quick={"seconds": 20.0}),
    Scenario(
        "overhead", "what one router adds to a direct call, its max req/s and its memory",
        "Router overhead", "Small non-streaming completions (max_tokens 1) to one zero-latency "
        "simulator, direct and through the router, open loop at the same Poisson rate, then "
        "`max_rps`: 64 closed-loop clients. Added p50 / p99: the router's percentile minus the "
        "direct one's. RSS (first round, our router on its own table): a running prefix-router "
        "whose table unique 2,048-token prompts filled to 1,000,000 (block, backend) entries, "
        "as its own /metrics counts them",
        "overhead", kind="overhead", workloads=("",), rates=(500.0,), seconds=20.0,
        replicas=1, profile="zero", kv_capacity=1_000_000,
        columns=OVERHEAD_COLUMNS, group_by=(), quick={"seconds": 10.0}),
    Scenario(
        "overhead-tokens", "issue 22: the router's overhead with token-aligned blocks, each "
        "index mode", "Router overhead with token-aligned blocks", "Non-streaming chat "
        "completions (max_tokens 1) of about 2,000 tokens of the tiny tokenizer (a 1,800-token "
        "system prompt shared by all, about 200 tokens of their own) to one zero-latency "
        "simulator in vLLM's token mode with KV events, direct and through the router (told the "
        "tokenizer: it renders the chat template and tokenizes every prompt), open loop at the "
        "same Poisson rate, then `max_rps`: 64 closed-loop clients. Added p50 / p99: the "
        "router's percentile minus the direct one's. RSS (first round): a router of the same "
        "mode whose table unique prompts filled to 1,000,000 (block, backend) entries, as its "
        "own /metrics counts them (in `events` mode, from the simulator's BlockStored events)",
        "overhead-tokens", kind="overhead", workloads=("",), setups=MODES, rates=(500.0,),
        seconds=20.0, replicas=1, profile="zero", kv_capacity=20_000_000, kv_events=True,
        columns=OVERHEAD_COLUMNS, group_by=(), quick={"seconds": 10.0}, rules=(
            Rule("{router}: added p50 < 1.5 ms", "added_p50_ms", {}, "<", 1.5),
            Rule("{router}: added p99 < 5 ms", "added_p99_ms", {}, "<", 5.0))),
    Scenario(
        "suite", "the committed figures of bench/results/README.md: routing, sweep, overhead",
        "Benchmark results", FLEET + " (points under routing/, sweep-*/, overhead/)", "",
        parts=("routing", "sweep", "overhead"),
        rules=(
            Rule("system-prompts: prefix engine hit rate >= 0.80", "engine_hit_rate", SP_PREFIX,
                 ">=", 0.80),
            Rule("system-prompts: prefix hit rate >= 0.95 x oracle", "engine_hit_rate",
                 SP_PREFIX, ">=", 0.95, over="oracle_hit_rate"),
            Rule("system-prompts: prefix imbalance <= 1.3", "imbalance", SP_PREFIX, "<=", 1.3),
            Rule("system-prompts: prefix TTFT p50 <= 0.23 x round-robin", "ttft_p50_ms",
                 SP_PREFIX, "<=", 0.23, {"router": "round-robin"}),
            Rule("(diagnostic) the same ratio at the engines (arrival to first token)",
                 "engine_ttft_p50_ms", SP_PREFIX, vs={"router": "round-robin"}),
            Rule("unique: prefix TTFT p50 within 5% of least-loaded", "ttft_p50_ms",
                 {**SP_PREFIX, "workload": "unique"}, "<=", 1.05, {"router": "least-loaded"}),
            Rule("overhead: added p50 < 1 ms at 500 req/s", "added_p50_ms",
                 {"scenario": "overhead", "router": "prefix"}, "<", 1.0),
            Rule("overhead: added p99 < 5 ms at 500 req/s", "added_p99_ms",
                 {"scenario": "overhead", "router": "prefix"}, "<", 5.0),
            Rule("overhead: RSS with 1,000,000 table entries < 250 MB", "rss_mb_1m_entries",
                 {"scenario": "overhead", "router": "prefix"}, "<", 250.0))),
    Scenario(
        "compare", "every router and anchor side by side on every workload (`make bench`)",
        "Side by side: ours, common policies and the anchor routers (issue 5)",
        "Per workload, 8 `engine-sim` replicas started once; for each router the simulators are "
        "drained and reset (caches emptied, counters zeroed), the router started, and our load "
        "generator sends the same request sequence as an ascending staircase of rates, back to "
        "back (steps after the first start from the caches the lower rates warmed), then waits "
        "at most a short drain. Engine hit rate: the simulators' own counters between the "
        "step's boundaries. TTFT: requests sent in the step that completed; `unfinished` were "
        "cut by the drain. A rate is past saturation when both load balancers are (TTFT p50 "
        "over 1 s, over 5% failed, or a request per replica queued at the step's end); rules "
        "are not judged there. Every request carries `X-Session-ID` (vllm-router's "
        "consistent_hash needs it, no other router reads it). The same requests from a "
        "third-party client: `python -m bench client-check`",
        "compare/full", workloads=tuple(w for w, spec in WORKLOADS.items() if spec.compared),
        setups=COMPARED, rates=None, seconds=11.0, staircase=True,
        drain_s=8.0, session_header=True, columns=STEP_COLUMNS, plot="rate",
        rules=(*_best("prefix"), *_best("prefix-3x-redis"), Rule(
            "unique at {rate:g} req/s: {router} TTFT p50 <= 1.05 x the best load balancer's",
            "ttft_p50_ms", {"router": OURS, "workload": "unique"}, "<=", 1.05,
            {"router": LOAD_BALANCERS}, saturation=True)),
        quick={"workloads": ("system-prompts", "unique"), "rates": (12.0, 32.0),
               "seconds": 4.0, "drain_s": 3.0, "out": "compare/quick"}),
    Scenario(
        "long-point", "one workload and rate, long, router setups in turn, round after round",
        "Long points: one workload and rate, router setups in turn, round after round",
        "From an emptied fleet, each setup in turn, round after round, on the same request "
        "sequence: a routing difference told from the luck of one short sample. Cells: median "
        "(min-max) over the rounds. A setup is a router name or `prefix,key=value`: our router "
        "with those settings", "long-point", workloads=("multi-turn",),
        setups=("prefix", "sglang-cache_aware"), rates=(32.0,), seconds=30.0, repeats=2,
        drain_s=30.0, session_header=True, group_by=("workload", "rate", "tag"),
        columns=("router", "engine_hit_rate", "ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms",
                 "imbalance", "requests_ok")),
    Scenario(
        "shared-store", "1 router, 3 routers on one Redis, 3 routers with local tables",
        "Shared store", "Each setup in front of a fresh fleet, the same request sequence. "
        + FLEET, "shared-store", workloads=("system-prompts", "customers"),
        setups=("prefix", "prefix-3x-redis", "prefix-3x-local"), fresh_fleet=True,
        columns=("router", "engine_hit_rate", "imbalance", "ttft_p50_ms", "ttft_p99_ms",
                 "errors", "redis_round_trips_per_request",
                 "redis_timer_round_trips_per_request"), report="shared-store.md",
        rules=(Rule("{workload}: 3 routers on Redis: hit rate >= 0.97 x 1 router",
                    "engine_hit_rate", {"router": "prefix-3x-redis"}, ">=", 0.97,
                    {"router": "prefix"}),
               Rule("{workload}: 3 routers on Redis: imbalance <= 1.3", "imbalance",
                    {"router": "prefix-3x-redis"}, "<=", 1.3))),
    Scenario(
        "fault", "3 routers on Redis; redis-server killed mid-run, back empty; recovery",
        "Redis killed and restarted empty under 3 routers", "redis-server gets SIGKILL a third "
        "into the run and a new, EMPTY one starts on the same port half way (a restarted pod "
        "without persistence). Recovery: from Redis's return to the first window whose hit rate "
        "is back to 90% of its mean before the kill", "shared-store",
        setups=("prefix-3x-redis",), seconds=120.0, sample_s=5.0, redis_down=(1 / 3, 0.5),
        columns=("router", "requests_sent", "errors", "recovery_s", "engine_hit_rate"),
        plot="timeline", report="fault.md", tag="fault",  # beside shared-store's points
        rules=(Rule("no request failed", "errors", {}, "<=", 0),
               Rule("hit rate back within 30 s of Redis's return", "recovery_s", {}, "<=", 30))),
    Scenario(
        "scale-out", "4 replicas become 8 mid-run (file discovery), prefix and load balancers",
        "Scale-out: 4 replicas become 8 a third into the run", "The routers find their "
        "backends in a file; a third into the run it gains 4 more simulators, as an HPA "
        "scale-out adds pods to a Service. The "
        "engines' counters every 5 s: the new replicas' share of requests, the hit rate, the "
        "TTFT p50 of the requests sent in the window", "scale-out",
        setups=("prefix", "round-robin", "least-loaded"), rates=(16.0,), seconds=90.0,
        sample_s=5.0, first_replicas=4, join_at=1 / 3, plot="timeline", report="scale-out.md",
        columns=("router", "seconds_to_40pct", "after_join_hit_rate", "after_join_new_share",
                 "after_join_ttft_p50_ms", "errors")),
    Scenario(
        "client-check", "the same requests from our load generator and from inference-perf",
        "Two clients, one request sequence (issue 5)", "Both clients send the same requests "
        "in the same order (streaming completions, the chat template's rendering of the "
        "workload's messages) at the same Poisson rate through the same router to 8 "
        "simulators emptied before each run. Engine figures are the simulators' own; "
        "`path_p50_ms` = client TTFT p50 - engine TTFT p50 (client, router and network)",
        "client-check", setups=("prefix", "round-robin"), rates=(8.0,), requests=240,
        api="completions", clients=("loadgen", "inference-perf"), drain_s=300.0,
        columns=("router", "client", "requests_ok", "engine_hit_rate", "ttft_p50_ms",
                 "ttft_p90_ms", "ttft_p99_ms", "engine_ttft_p50_ms", "engine_ttft_p90_ms",
                 "engine_ttft_p99_ms", "path_p50_ms"),
        rules=(Rule("{router}: inference-perf's TTFT p50 within 5% of our load generator's",
                    "ttft_p50_ms", {"client": "inference-perf"}, "within", 0.05,
                    {"client": "loadgen"}),)),
    Scenario(
        "real-engine", "3 llama-servers with bounded prompt caches: prefix, round-robin, sglang",
        "A real engine: 3 llama-servers with bounded prompt caches (issue 22)", LLAMA_FLEET,
        "real-engine", workloads=("few-prompts",),
        setups=(PREFIX_TOKENS, "round-robin", "sglang-cache_aware"), rates=(4.0, 8.0),
        seconds=45.0, repeats=3, fresh_fleet=True, drain_s=60.0, replicas=3, engine="llama",
        engine_config=LLAMA_SERVERS, kv_capacity=LLAMA_KV_TOKENS,
        group_by=("workload", "rate"),
        columns=("router", "engine_hit_rate", "ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms",
                 "throughput_rps", "output_tokens_per_s", "errors", "imbalance",
                 "requests_ok"),
        rules=(Rule("{workload} at {rate:g} req/s: prefix TTFT p50 below sglang cache_aware's",
                    "ttft_p50_ms", {"router": "prefix"}, "<", 1.0,
                    {"router": "sglang-cache_aware"}),
               Rule("{workload} at {rate:g} req/s: prefix engine hit rate at least sglang "
                    "cache_aware's", "engine_hit_rate", {"router": "prefix"}, ">=", 1.0,
                    {"router": "sglang-cache_aware"}, high=True),
               Rule("{workload} at {rate:g} req/s: prefix throughput over sglang cache_aware's",
                    "throughput_rps", {"router": "prefix"}, vs={"router": "sglang-cache_aware"},
                    high=True),
               Rule("{workload} at {rate:g} req/s: prefix TTFT p50 below round-robin's",
                    "ttft_p50_ms", {"router": "prefix"}, "<", 1.0,
                    {"router": "round-robin"})),
        quick={"seconds": 20.0, "repeats": 1}),
    Scenario(
        "autoscale", "cache pressure -> real HPA -> operator -> kwok pods, end to end",
        "Autoscaling on cache pressure, end to end", "", "autoscale", kind="autoscale"),
)}

# Issue 22: engines that drift from what the router is told, each case in the three index
# modes on the same simulators and the same requests (bench/results/drift/).
DRIFT_FLEET = (
    "8 `engine-sim` replicas speaking vLLM's protocol: the repository's tiny Hugging Face "
    "tokenizer and Llama-3-like chat template (`--tokenizer tiny`), "
    "`--enable-prompt-tokens-details` (cached tokens reported only when nonzero, as vLLM "
    "does), KV events on vLLM's wire (map encoding) with a replay socket, each on ports of its "
    "own, preemption by recompute; profile `llama-3.1-70b-h100`, real time. KV capacity per "
    "replica: the workload's, in the tokenizer's tokens (system-prompts: 24,000 4-byte tokens "
    "x 1.34 = 32,272, 0.19 of the working set; the fleet holds 1.5 x it). The same simulators "
    "for every router (drained and reset between), the same requests. The routers: our "
    "`prefix` policy, its index fed by its own decisions (`prefix-approx`), by them checked "
    "against the cached tokens the engines report (`prefix-corrected`) or by the engines' KV "
    "events (`prefix-events`), each told the tokenizer (token-aligned blocks) and that the "
    "engines report cached tokens; `events.endpoints` names each simulator's ports. Hit "
    "rates: the simulators' own counters; oracle: one LRU cache as large as the whole fleet, "
    "fed the same requests and answers in the same tokens; TTFT: at the client, streaming; "
    "router figures (predicted hit rate, corrections, mean |predicted - reported| cached "
    "tokens) from the router's /metrics")
DRIFT_COLUMNS = ("router", "engine_hit_rate", "oracle_hit_rate", "hit_over_oracle",
                 "ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms", "errors", "preemptions",
                 "router_predicted_hit_rate", "index_corrections_over",
                 "index_corrections_under", "prediction_error_mean_tokens")
DRIFT_RULES = (
    Rule("{scenario}: events hit rate >= 0.97 x oracle", "engine_hit_rate",
         {"router": "prefix-events"}, ">=", 0.97, over="oracle_hit_rate"),
    Rule("{scenario}: corrected hit rate >= 0.90 x oracle (judged where approx is below)",
         "engine_hit_rate", {"router": "prefix-corrected"}, ">=", 0.90, over="oracle_hit_rate",
         below={"router": "prefix-approx"}),
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
           "F = 1: nothing gets worse", "system-prompts at 24 req/s for 90 s (the routing "
           "suite's point), routers told the simulators' real capacity, in each index mode "
           "and through round-robin on the same token-mode fleet, judged by the routing "
           "suite's rules", "f1", setups=(*MODES, "round-robin"), rules=(
               Rule("{scenario}: {router}: engine hit rate >= 0.80", "engine_hit_rate", SP_F1,
                    ">=", 0.80),
               Rule("{scenario}: {router}: hit rate >= 0.95 x oracle", "engine_hit_rate",
                    SP_F1, ">=", 0.95, over="oracle_hit_rate"),
               Rule("{scenario}: {router}: imbalance <= 1.3", "imbalance", SP_F1, "<=", 1.3),
               Rule("{scenario}: {router}: TTFT p50 <= 0.23 x round-robin", "ttft_p50_ms",
                    SP_F1, "<=", 0.23, {"router": "round-robin"}))),
    _drift("drift-f2", "issue 22: routers told 2 x the engines' KV capacity",
           "F = 2: the router believes twice the engines' memory", "Routers told 2 x the "
           "simulators' KV capacity (64,544 tokens of 32,272): an index that believes it "
           "blindly predicts blocks the engines evicted long ago", "f2", capacity_factor=2.0),
    _drift("drift-f05", "issue 22: routers told half the engines' KV capacity",
           "F = 0.5: the router believes half the engines' memory", "Routers told 0.5 x the "
           "simulators' KV capacity (16,136 tokens of 32,272): an index that believes it "
           "forgets blocks the engines still hold", "f05", capacity_factor=0.5),
    _drift("drift-mixed", "issue 22: engines of mixed KV capacities, routers told the mean",
           "Engines of mixed capacities", "The simulators' capacities are 0.5, 0.5, 0.75, "
           "0.75, 1.25, 1.25, 1.5 and 1.5 x 32,272 tokens (the same fleet total); the routers "
           "are told the mean for every engine", "mixed",
           kv_shares=(0.5, 0.5, 0.75, 0.75, 1.25, 1.25, 1.5, 1.5)),
    _drift("drift-restart", "issue 22: one engine restarted mid-run, its cache empty",
           "One engine restarted mid-run", "Half way into the run simulator 0 gets SIGKILL "
           "and a new process starts on the same ports with the same flags: its cache empty, "
           "its event sequence from 0 (its counters from before are added to the new "
           "process's). Requests it had in flight fail (errors)", "restart", restart=(0, 0.5)),
    _drift("drift-bursts", "issue 22: bursts of 5 x the rate that make engines preempt",
           "Bursts that force preemption", "12 req/s, and 60 req/s for 5 s every 15 s (from "
           "10 s in): the running sequences of a burst outgrow an engine's KV cache, so it "
           "preempts (recomputes) some, and their blocks may be evicted in between",
           "bursts", rates=(12.0,), shape=Bursts(15.0, 5.0, 5.0, 10.0), rules=(*DRIFT_RULES, Rule(
               "{scenario}: the engines preempted under {router}", "preemptions",
               {"scenario": "drift-bursts"}, ">", 0))),
    _drift("drift-llmd", "issue 22: llm-d's published shape on 8 replicas, a rate ramp",
           "llm-d's shape: 150 customers x 5 users, working set 73% of the fleet's KV",
           "llm-d's published benchmark (llm-d.ai/blog/kvcache-wins-you-can-see, appendix "
           "A.2): 150 customers with a 6,000-token context each, 5 users a customer with a "
           "1,200-token query each (750 distinct prompts, drawn at random), on 8 replicas whose "
           "KV capacity makes the working set (150 x 6,000 + 750 x 1,200 = 1.8M tokens) 73.2% "
           "of the fleet's (theirs: 307,328 tokens an instance; 1.8M / (8 x 307,328) = 0.732); "
           "Poisson arrivals ramped linearly from 0.1 x to 1 x the rate over the run (theirs: 3 "
           "to 60 QPS). Contexts and queries are sized in the tiny tokenizer's tokens; outputs "
           "64-256 tokens. llm-d's TTFT p90 (8 vLLM pods of Qwen3-32B on 2 H100s each): 0.542 s "
           "with precise (KV-event) scheduling, 31.083 s with approximate; ours are simulated "
           "on one 2-core host, theirs measured on GPUs", "llmd", workloads=("llm-d",),
           ws_share=0.732, shape=Ramp(0.1, 1.0), rates=(30.0,), seconds=120.0),
)
SCENARIOS.update({s.name: s for s in DRIFT})
SCENARIOS["drift"] = Scenario(
    "drift", "issue 22's drift set: every case in the three index modes (bench/results/drift)",
    "Engines that drift: the index fed by decisions, reported cached tokens, or KV events",
    DRIFT_FLEET, "", parts=tuple(s.name for s in DRIFT), report="drift/README.md",
    columns=("scenario", *DRIFT_COLUMNS[:7], "preemptions"))
