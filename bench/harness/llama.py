"""llama.cpp's `llama-server` as the bench's engine (Scenario.engine "llama"), started as
hack/llama/llama_fleet.py starts it, its /metrics read in the shape of the simulators' /stats so
the runner's figures apply to both (docs/real-engine.md). It counts no requests: a server's
share is of prompt tokens served (cached + computed), for prompts of one size that of requests."""

import asyncio
import importlib
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import aiohttp

from . import figures
from .fleet import Fleet, free_port
from .loadgen import RunLog

HACK_LLAMA = Path(__file__).resolve().parents[2] / "hack" / "llama"
MODEL = "tiny-llama"  # the alias the launcher gives the servers (ServerConfig.alias)
# Its counters and gauges, by the simulators' names
NAMES = {
    "llamacpp:prompt_tokens_total": "computed_tokens",  # cached tokens excluded
    "llamacpp:prompt_tokens_cached_total": "cached_tokens",  # reused from its prompt cache
    "llamacpp:tokens_predicted_total": "generation_tokens",
    "llamacpp:requests_processing": "running",  # busy slots
    "llamacpp:requests_deferred": "waiting",  # waiting for a slot
    "llamacpp:n_decode_total": "decode_calls",
}


def _hack(module: str) -> Any:
    """A module of hack/llama/ (scripts, not an installed package)."""
    if str(HACK_LLAMA) not in sys.path:
        sys.path.insert(0, str(HACK_LLAMA))
    return importlib.import_module(module)


def kv_bytes_per_token() -> int:
    """KV bytes a token of the tiny model takes (make_gguf.ModelShape)."""
    return _hack("make_gguf").ModelShape().kv_bytes_per_token


def prompts_held(slots: int, cache_ram_mib: int, entry_tokens: int,
                 kv_bytes_per_token: int) -> tuple[int, int]:
    """(K host-cache entries, C whole prompts) one server holds of prompts of `entry_tokens`
    (prompt and answer) each: K = floor(cache_ram / entry size), C = slots + K - 1 (it behaves
    as an LRU of C prompts: docs/real-engine.md, checked there)."""
    k = cache_ram_mib * 2**20 // (entry_tokens * kv_bytes_per_token)
    return k, max(1, slots + k - 1)


def stats_of(metrics_text: str) -> dict[str, Any]:
    """One server's /metrics as a simulator's /stats: `prompt_tokens` (and, for want of a
    request counter, `requests`) are all the prompt tokens it served, computed + cached."""
    values = dict(line.partition(" ")[::2] for line in metrics_text.splitlines())
    m = {short: int(float(values.get(name, 0))) for name, short in NAMES.items()}
    served = m["computed_tokens"] + m["cached_tokens"]
    return {"prompt_tokens": served, **m, "requests": served}


async def fetch_stats(urls: list[str]) -> list[dict[str, Any]]:
    async with aiohttp.ClientSession() as s:
        async def one(u: str) -> dict[str, Any]:
            async with s.get(u + "/metrics") as r:
                r.raise_for_status()
                return stats_of(await r.text())
        return list(await asyncio.gather(*(one(u) for u in urls)))


def step_figures(log: RunLog, before: Mapping[str, Any], after: Mapping[str, Any],
                 step_end: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """figures.step_figures on the servers' counters, each server's share (and the imbalance)
    counted in prompt tokens, and the prompt tokens computed."""
    out = figures.step_figures(log, before, after, step_end)
    out["per_replica_prompt_tokens"] = out.pop("per_replica_requests")
    out["computed_prompt_tokens"] = sum(
        a["computed_tokens"] - b["computed_tokens"]
        for a, b in zip(after["stats"], before["stats"], strict=True))
    return out


async def start_engines(fleet: Fleet, n: int, settings: Mapping[str, Any],
                        timeout: float = 180.0) -> list[str]:
    """`n` llama-servers as llama_fleet.ServerConfig(**settings) starts them, processes of
    `fleet`; the binary and the tiny model are built once and cached (`make llama`)."""
    binary = await asyncio.to_thread(_hack("llama_fleet").ensure_binary)
    model = await asyncio.to_thread(_hack("make_gguf").ensure_model)
    config = _hack("llama_fleet").ServerConfig(**settings)
    ports = [free_port() for _ in range(n)]
    servers = await asyncio.gather(*(
        fleet.start(f"llama{k}", config.args(binary, model, port), port, "/health",
                    timeout=timeout) for k, port in enumerate(ports)))
    return [p.url for p in servers]


def describe(settings: Mapping[str, Any]) -> dict[str, Any]:
    """What a point says about its engines: the server flags that bound the prompt cache."""
    c = _hack("llama_fleet").ServerConfig(**settings)
    return {"engine": "llama-server", "slots": c.slots, "ctx_per_slot": c.ctx_per_slot,
            "cache_ram_mib": c.cache_ram_mib, "threads": c.threads,
            "cache_reuse": c.cache_reuse, "slot_prompt_similarity": c.slot_prompt_similarity}
