"""Every failure path leaves the prefix index exactly as it was, with the local index and
with the one shared in Redis: the engine refusing the request (4xx), an engine that cannot
be reached (the request goes to the next), and a client that leaves before the first token.
Real simulator processes, a real redis-server, the router app in-process."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import pytest
import redis.asyncio as aioredis
import waiting
from aiohttp.test_utils import TestClient, TestServer

from bench.harness.fleet import Fleet
from prefix_router.app import CORE, build_app
from prefix_router.config import RouterSettings
from prefix_router.contract import StoreKeys
from prefix_router.parsing import parse_request
from prefix_router.prefix import block_hashes, chain_seed
from prefix_router.redis.scripts import block_hex

pytestmark = pytest.mark.redis

MODEL = "test-model"
SYSTEM = "You are the assistant of the claims department; answer briefly. " * 30
Snapshot = Callable[[], Any]


def chat(user: str, **extra: Any) -> dict[str, Any]:
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]
    return {"model": MODEL, "messages": msgs, "max_tokens": 2, **extra}


def chain(body: dict[str, Any]) -> list[int]:
    """The block hashes the router computes for this request (its own functions)."""
    s = RouterSettings()
    parsed = parse_request(json.dumps(body).encode(), "chat")
    return block_hashes(parsed.canonical, s.block_bytes, chain_seed(MODEL, None))


async def wait_for(predicate: Callable[[], Any], what: str, timeout: float = 30.0) -> Any:
    return await waiting.until(predicate, timeout, what, interval=0.05)

class Router:
    """A router app of either store, and a snapshot of its index for one chain: every owner
    of its blocks with each block's last use (Redis: the owners' hashes and the backends'
    capacity sets; local: the table's holdings)."""

    def __init__(self, client: TestClient, store: str, url: str | None) -> None:
        self.client = client
        self.store = store
        self.redis = aioredis.from_url(url, decode_responses=True) if url else None

    @property
    def app(self) -> Any:
        return self.client.server.app

    async def settled(self) -> None:
        """Every write this router queued is in Redis (nothing but the flush is left)."""
        if self.redis is not None:
            await self.app[CORE].store.writes.flush()

    async def snapshot(self, hashes: list[int]) -> Any:
        await self.settled()
        if self.redis is None:
            table = self.app[CORE].index.table.table(MODEL)
            wanted = set(hashes)
            return {b: [e for e in held if e[0] in wanted] for b, held in
                    table.holdings().items()}  # fmt: skip
        keys = StoreKeys("ns/m")
        out: dict[str, Any] = {}
        for h in hashes:
            out[block_hex(h)] = await self.redis.hgetall(keys.owners_prefix(MODEL) + block_hex(h))
        for be in await self.redis.smembers(keys.backends(MODEL)):
            members = dict(await self.redis.zrange(keys.lru(MODEL, be), 0, -1, withscores=True))
            out["lru " + be] = {h: members.get(block_hex(h)) for h in hashes}
        return out

    async def post(self, body: dict[str, Any]) -> tuple[int, str, str]:
        r = await self.client.post("/v1/chat/completions", json=body)
        text = await r.text()
        return r.status, r.headers.get("x-routed-to", ""), text

    async def in_flight(self) -> float:
        return sum(self.app[CORE].load.own_counts().values())


@pytest.fixture(params=["local", "redis"])
async def make_router(request, redis_server) -> AsyncIterator[Callable[..., Any]]:
    made: list[Router] = []

    async def make(sims: list[str]) -> Router:
        store: dict[str, Any] = {"mode": "local"}
        if request.param == "redis":
            store = {"mode": "redis", "url": redis_server.url, "write_delay_ms": 0,
                     "near_cache_ttl_ms": 0}  # fmt: skip
        settings = RouterSettings.model_validate({
            "model_key": "ns/m", "kv_capacity_tokens": 100_000, "store": store,
            "expose_routing": True,
            "discovery": {"backends": sims},
        })  # fmt: skip
        client = TestClient(TestServer(build_app(settings)))
        await client.start_server()
        r = Router(client, request.param, redis_server.url if request.param == "redis" else None)
        made.append(r)
        return r

    yield make
    for r in made:
        await r.client.close()
        if r.redis is not None:
            await r.redis.aclose()


async def sim(fleet: Fleet, name: str, **kw: Any) -> str:
    options = {"profile": "fast", "time_scale": 1.0, **kw}
    p = await fleet.start_sim(name, model=MODEL, kv_capacity=100_000, **options)
    return p.url


async def test_a_request_the_engine_refuses_leaves_the_index_as_it_was(fleet, make_router):
    router = await make_router([await sim(fleet, "sim0"), await sim(fleet, "sim1")])
    assert (await router.post(chat("warm up")))[0] == 200  # the system prompt has an owner
    bad = chat("a question the engine refuses, long enough to add blocks " * 8, max_tokens=-1)
    hashes = chain(bad)
    before = await router.snapshot(hashes)
    status, _to, text = await router.post(bad)
    assert status == 400, text
    assert await router.snapshot(hashes) == before


async def test_an_engine_that_cannot_be_reached_leaves_the_index_as_it_was(fleet, make_router):
    urls = [await sim(fleet, "sim0"), await sim(fleet, "sim1")]
    router = await make_router(urls)
    status, owner, _ = await router.post(chat("warm up"))
    assert status == 200
    # the owner dies after the router's probe saw it well: the next request with its prefix
    # goes there first, cannot connect, and is served by the other
    proc = next(p for p in fleet.procs if p.url == owner)
    proc.process.kill()
    await proc.process.wait()
    body = chat("the next question, with blocks of its own " * 8)
    hashes = chain(body)
    before = await router.snapshot(hashes)
    status, served_by, text = await router.post(body)
    assert status == 200 and served_by != owner, text
    after = await router.snapshot(hashes)
    if router.redis is None:
        assert after.get(owner) == before.get(owner)
    else:
        assert after["lru " + owner] == before["lru " + owner]
        for h in hashes:  # the dead engine was not added as an owner of any block
            assert (owner in after[block_hex(h)]) == (owner in before[block_hex(h)])


async def test_a_client_that_leaves_before_the_first_token_leaves_the_index_as_it_was(
    fleet, make_router
):
    # a slow engine: a long prompt's prefill takes seconds, and the client leaves during it
    url = await sim(fleet, "slow", profile="llama-3.1-70b-h100", time_scale=20.0)
    router = await make_router([url])
    body = chat("a long question " * 400, stream=True)
    hashes = chain(body)
    before = await router.snapshot(hashes)

    async def gone_midway() -> None:
        timeout = aiohttp.ClientTimeout(total=None)
        async with aiohttp.ClientSession(timeout=timeout) as s:
            resp = await s.post(str(router.client.make_url("/v1/chat/completions")), json=body)
            assert resp.status == 200
            # the engine has it (its batch is running) and no token has come yet
            await wait_for(lambda: engine_running(url), "the engine to take the request")
            assert not resp.content.is_eof() and resp.content.total_bytes == 0
            resp.close()  # the client leaves

    await gone_midway()
    await wait_for(lambda: no_load(router), "the router to let the request go")
    assert await router.snapshot(hashes) == before


async def engine_running(url: str) -> bool:
    async with aiohttp.ClientSession() as s, s.get(url + "/metrics") as r:
        text = await r.text()
    return any(
        line.startswith("vllm:num_requests_running") and float(line.rsplit(" ", 1)[1]) >= 1
        for line in text.splitlines()
    )


async def no_load(router: Router) -> bool:
    return await router.in_flight() == 0
