"""Two tiny-tokenizer simulators publishing KV events, and our router fed by them (in process):
the setup of the tests that check how the router reads a kind of engine's events."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Sequence
from typing import Any

import aiohttp
import waiting

from bench.harness.fleet import Fleet, free_port
from bench.harness.promtext import sample_sum
from engine_sim.hf_tokenizer import TINY_TOKENIZER
from prefix_router.app import serve
from prefix_router.config import RouterSettings

MODEL = "test-model"
SYSTEM = "You answer questions about the billing of claims, briefly and politely. " * 12


def chat(system: str, user: str = "a question") -> dict[str, Any]:
    return {"model": MODEL, "max_tokens": 2,
            "messages": [{"role": "system", "content": system},
                         {"role": "user", "content": user}]}  # fmt: skip


def filler(i: int) -> dict[str, Any]:
    """A prompt of its own, long enough to push others out of a small cache."""
    return {"model": MODEL, "max_tokens": 2,
            "messages": [{"role": "user", "content": f"filler text number {i} " * 70}]}


async def publishing_sims(
    fleet: Fleet, kv_capacity: int, sim_args: Sequence[str] = ()
) -> tuple[list[str], dict[str, str]]:
    """Two simulators in tokenizer mode publishing KV events: their URLs, and each one's
    event and replay endpoints as the router's `events.endpoints` takes them."""
    sims, ends = [], {}
    for i in range(2):
        pub, replay = free_port(), free_port()
        cfg = {"enable_kv_cache_events": True, "publisher": "zmq",
               "endpoint": f"tcp://127.0.0.1:{pub}", "replay_endpoint": f"tcp://127.0.0.1:{replay}"}
        p = await fleet.start_sim(
            f"sim{i}", model=MODEL, kv_capacity=kv_capacity, profile="fast", time_scale=1.0,
            extra=["--tokenizer", "tiny", "--enable-prompt-tokens-details", *sim_args,
                   "--kv-events-config", json.dumps(cfg)],
        )  # fmt: skip
        sims.append(p.url)
        ends[p.url] = f"tcp://127.0.0.1:{pub},tcp://127.0.0.1:{replay}"
    return sims, ends


async def events_router(
    fleet: Fleet, kv_capacity: int, sim_args: list[str], events: dict[str, Any]
) -> AsyncIterator[dict[str, Any]]:
    """Yields {"sims", "router", "session"}; `events`: the router's `events` settings beside
    the endpoints."""
    sims, ends = await publishing_sims(fleet, kv_capacity, sim_args)
    s = RouterSettings.model_validate({
        "discovery": {"backends": sims}, "models": [MODEL], "port": 0, "index": "events",
        "metrics_port": None,  # /metrics on the API port: the tests read it there
        "tokenizer": str(TINY_TOKENIZER), "expose_routing": True,
        "cached_tokens_reported": True, "events": {"endpoints": ends, **events},
    })  # fmt: skip
    stop = asyncio.Event()
    bound: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(serve(s, stop, bound.set_result))
    router = f"http://127.0.0.1:{await asyncio.wait_for(bound, 30)}"
    async with aiohttp.ClientSession() as session:
        yield {"sims": sims, "router": router, "session": session}
    stop.set()
    await task


async def post(env: dict[str, Any], url: str, body: dict[str, Any]) -> tuple[str, str, int]:
    """(the engine that answered, the router's reason, the cached tokens it reported)."""
    async with env["session"].post(url + "/v1/chat/completions", json=body) as r:
        assert r.status == 200, await r.text()
        usage = (await r.json())["usage"]
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
        return r.headers.get("x-routed-to", url), r.headers.get("x-route-reason", ""), cached


async def caught_up(env: dict[str, Any]) -> None:
    """The router has applied every event each simulator published."""

    async def done() -> bool:
        async with env["session"].get(env["router"] + "/metrics") as r:
            text = await r.text()
        for sim in env["sims"]:
            async with env["session"].get(sim + "/stats") as r:
                sent = (await r.json())["kv_events"]["published_events"]
            if sample_sum(text, "prefix_router_kv_events_total", backend=sim) != sent:
                return False
        return True

    await waiting.until(done, 60, "the router to apply every event", interval=0.05)
