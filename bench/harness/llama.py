"""llama.cpp's `llama-server` as the bench's engine (Scenario.engine "llama"): the servers
started by hack/llama/llama_fleet.py's command line, their figures read from their own
`/metrics` (docs/real-engine.md), in the shape the simulators' /stats give, so the runner's
step figures apply to both.

What llama-server counts: `llamacpp:prompt_tokens_total` (prompt tokens computed, cached ones
excluded), `llamacpp:prompt_tokens_cached_total` (reused from its prompt cache),
`llamacpp:tokens_predicted_total`, and the gauges `requests_processing` (busy slots) and
`requests_deferred` (waiting for one). It counts no requests: where the simulators give
requests served per replica, the share of each server here is of prompt tokens served (cached
+ computed), which for prompts of one size is the share of requests."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import aiohttp

from . import figures
from .fleet import Fleet, free_port
from .loadgen import RunLog
from .stats import imbalance

REPO = Path(__file__).resolve().parents[2]
HACK_LLAMA = REPO / "hack" / "llama"
TOKENIZER_DIR = REPO / "sim" / "engine_sim" / "data" / "tiny-tokenizer"
MODEL = "tiny-llama"  # the alias the launcher gives the servers (ServerConfig.alias)

_COUNTERS = {
    "llamacpp:prompt_tokens_total": "computed_tokens",
    "llamacpp:prompt_tokens_cached_total": "cached_tokens",
    "llamacpp:tokens_predicted_total": "generation_tokens",
    "llamacpp:requests_processing": "running",
    "llamacpp:requests_deferred": "waiting",
    "llamacpp:n_decode_total": "decode_calls",
}


def _launcher() -> Any:
    """hack/llama/llama_fleet.py (scripts, not an installed package: imported from there)."""
    if str(HACK_LLAMA) not in sys.path:
        sys.path.insert(0, str(HACK_LLAMA))
    import llama_fleet

    return llama_fleet


def server_config(**settings: Any) -> Any:
    """llama_fleet.ServerConfig with `settings` (slots, cache_ram_mib, ctx_per_slot, ...)."""
    return _launcher().ServerConfig(**settings)


def kv_bytes_per_token() -> int:
    """KV bytes a token of the tiny model takes (make_gguf.ModelShape: 2,048)."""
    _launcher()  # make_gguf is beside llama_fleet
    import make_gguf

    return make_gguf.ModelShape().kv_bytes_per_token


def prompts_held(slots: int, cache_ram_mib: int, entry_tokens: int,
                 kv_bytes_per_token: int) -> tuple[int, int]:
    """(K host-cache entries, C whole prompts one server holds) for prompts that take
    `entry_tokens` (prompt and answer) each: K = floor(cache_ram / entry size), and a server
    behaves as an LRU of C = slots + K - 1 prompts (docs/real-engine.md, checked there)."""
    k = cache_ram_mib * 2**20 // (entry_tokens * kv_bytes_per_token)
    return k, max(1, slots + k - 1)


def parse_metrics(text: str) -> dict[str, float]:
    """The counters and gauges above from a `/metrics` page, by their short names."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("llamacpp:"):
            name, _, value = line.partition(" ")
            if name in _COUNTERS:
                out[_COUNTERS[name]] = float(value)
    return out


def stats_of(metrics: Mapping[str, float]) -> dict[str, Any]:
    """One server's figures as the simulators' /stats names them: `prompt_tokens` are all the
    prompt tokens it served (computed + cached), as the simulators count them."""
    computed, cached = int(metrics.get("computed_tokens", 0)), int(metrics.get("cached_tokens", 0))
    return {"prompt_tokens": computed + cached, "cached_tokens": cached,
            "computed_tokens": computed,
            "generation_tokens": int(metrics.get("generation_tokens", 0)),
            "running": int(metrics.get("running", 0)), "waiting": int(metrics.get("waiting", 0)),
            "decode_calls": int(metrics.get("decode_calls", 0)),
            # no request counter: prompt tokens stand for the work each server took
            "requests": computed + cached}


async def fetch_stats(urls: list[str]) -> list[dict[str, Any]]:
    async with aiohttp.ClientSession() as s:
        async def one(u: str) -> dict[str, Any]:
            async with s.get(u + "/metrics") as r:
                r.raise_for_status()
                return stats_of(parse_metrics(await r.text()))
        return list(await asyncio.gather(*(one(u) for u in urls)))


def step_figures(log: RunLog, before: Mapping[str, Any], after: Mapping[str, Any],
                 step_end: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """figures.step_figures on the servers' counters, with each server's share counted in
    prompt tokens (it counts no requests) and its llama_decode calls."""
    out = figures.step_figures(log, before, after, step_end)
    served = out.pop("per_replica_requests")
    out["per_replica_prompt_tokens"] = served
    out["imbalance"] = round(imbalance(served) or 0.0, 3)  # of prompt tokens served
    out["computed_prompt_tokens"] = sum(
        int(a["computed_tokens"]) - int(b["computed_tokens"])
        for a, b in zip(after["stats"], before["stats"], strict=True))
    return out


async def start_engines(fleet: Fleet, n: int, settings: Mapping[str, Any],
                        timeout: float = 180.0) -> list[str]:
    """`n` llama-servers as llama_fleet.ServerConfig(**settings) starts them, each a process
    of `fleet` (stopped with the rest of it), ready when /health answers 200. The binary and
    the tiny model are built once and cached (`make llama`); the first call may build them."""
    launcher = _launcher()
    import make_gguf

    binary = await asyncio.to_thread(launcher.ensure_binary)
    model = await asyncio.to_thread(make_gguf.ensure_model, TOKENIZER_DIR)
    config = launcher.ServerConfig(**settings)

    async def one(k: int) -> str:
        port = free_port()
        p = await fleet.start(f"llama{k}", config.args(binary, model, port), port, "/health",
                              timeout=timeout)
        return p.url

    return list(await asyncio.gather(*(one(k) for k in range(n))))


def describe(settings: Mapping[str, Any]) -> dict[str, Any]:
    """What a point says about its engines: the server flags that bound the prompt cache."""
    c = server_config(**settings)
    return {"engine": "llama-server", "slots": c.slots, "ctx_per_slot": c.ctx_per_slot,
            "cache_ram_mib": c.cache_ram_mib, "threads": c.threads,
            "cache_reuse": c.cache_reuse, "slot_prompt_similarity": c.slot_prompt_similarity}
