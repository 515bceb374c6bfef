"""The router reads each engine's context length from its `/v1/models` (vLLM's model cards
carry `max_model_len`) and refuses a prompt longer than it with a 400 of its own, before the
prompt reaches the index or any engine (router/prefix_router/health.py, scheduling/)."""

from __future__ import annotations

import aiohttp
import pytest

from bench.harness.engines import fetch_stats
from bench.harness.fleet import Fleet

pytestmark = pytest.mark.slow

MODEL = "test-model"


def table_entries(metrics: str) -> float:
    return next(float(line.split()[1]) for line in metrics.splitlines()
                if line.startswith("prefix_router_table_entries "))  # fmt: skip


async def test_a_prompt_longer_than_the_engines_context_is_refused_by_the_router(
    fleet: Fleet,
) -> None:
    sim = await fleet.start_sim("sim", model=MODEL, kv_capacity=100_000, profile="fast",
                                time_scale=1.0, extra=["--max-model-len", "2000"])  # fmt: skip
    # the router's own limit (max_prompt_tokens) is its default, 131,072 tokens: only what the
    # engine said can refuse the prompt below
    router = await fleet.start_router("router", [sim.url], policy="prefix", kv_capacity=100_000)
    async with aiohttp.ClientSession() as s:
        async with s.get(sim.url + "/v1/models") as r:
            assert (await r.json())["data"][0]["max_model_len"] == 2000
        # ~50,000 tokens at 4 bytes a token: over twice the context (with byte blocks the
        # count is an estimate, so only a prompt that far over is refused by the router)
        prompt = {"model": MODEL, "max_tokens": 4, "prompt": "word " * 40_000}
        async with s.post(router.url + "/v1/completions", json=prompt) as r:
            status, error = r.status, (await r.json())["error"]
        assert (status, error["code"], error["param"]) == (400, "context_length_exceeded",
                                                           "prompt")  # fmt: skip
        # the router's words, not the engine's ("This model's maximum context length is ...")
        assert "longer than the model's context of 2000 tokens" in error["message"], error
        async with s.get(router.metrics) as r:
            assert table_entries(await r.text()) == 0  # nothing of it reached the index
        # a prompt that fits is served, and only then does the engine see a request
        assert (await fetch_stats([sim.url]))[0]["requests"] == 0
        fits = {"model": MODEL, "max_tokens": 4, "prompt": "word " * 300}
        async with s.post(router.url + "/v1/completions", json=fits) as r:
            assert r.status == 200, await r.text()
        assert (await fetch_stats([sim.url]))[0]["requests"] == 1
