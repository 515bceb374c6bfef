"""The shared index in Redis is bounded like the router's own (bench/results/abuse/FINDINGS.md,
finding 8: 160 prompts of 100 KB left 251,604 keys and 88 MB in Redis). Where no engine
capacity is configured, a backend's blocks in Redis are a share of the index budget,
`index_memory_mb` (as `max_table_entries`) or the store's `max_entries_per_model` if lower;
past it the oldest go, with their owner entries. Against a real redis-server."""

from __future__ import annotations

from typing import Any

import pytest
import redis.asyncio as aioredis

from prefix_router.config import RouterSettings
from prefix_router.index.local import LocalIndex
from prefix_router.load import LoadTracker
from prefix_router.redis import SharedStore

pytestmark = pytest.mark.redis

BACKEND = "http://e1"
CHAINS, CHAIN = 30, 100  # 3,000 blocks recorded for one backend


@pytest.mark.parametrize(("settings", "budget"), [
    ({"index_memory_mb": 4}, 4 * 2**20 // 200),  # ~200 bytes an entry: 20,971
    ({"store": {"max_entries_per_model": 20_000}}, 20_000),
])  # fmt: skip
async def test_a_backends_blocks_in_redis_are_bounded_by_the_index_budget(
    redis_server: Any, settings: dict[str, Any], budget: int
) -> None:
    store = {"mode": "redis", "url": redis_server.url, "timeout_ms": 1000,
             "write_delay_ms": 0, **settings.get("store", {})}  # fmt: skip
    s = RouterSettings.model_validate(
        {"model_key": "ns/m", "kv_capacity_tokens": 0, **settings, "store": store})
    # one backend's share of the budget (a sixteenth), never below 1,000 blocks
    bound = max(1000, budget // 16)
    assert bound < CHAINS * CHAIN
    shared = SharedStore(s, LoadTracker(), "r1")
    table = shared.table(LocalIndex(s.block_size, s.kv_capacity_tokens, s.ttl_seconds,
                                    s.max_table_entries, s.max_owners))  # fmt: skip
    await shared.link.start()  # no timers: the test flushes
    r = aioredis.from_url(redis_server.url)
    try:
        for c in range(CHAINS):
            table.record("m", [c * 10_000 + i for i in range(CHAIN)], BACKEND)
            await shared.writes.flush()
        assert not shared.writes.pending()  # every record is in Redis
        held = await r.zcard(f"prefixrouter:ns/m:lru:m:{BACKEND}")
        owned = [k async for k in r.scan_iter(match="prefixrouter:ns/m:o:m:*", count=1000)]
        assert held == bound, (held, bound)  # full to its bound, not past it
        assert len(owned) == held  # the trimmed blocks' owner entries went too
    finally:
        await r.aclose()
        await shared.close()
