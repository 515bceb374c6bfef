"""Redis memory per million ownership entries, measured on a throw-away redis-server.

`python -m bench redis-memory` writes `entries` (block, backend) ownership entries through
RedisStore.record (the same Lua script and key layout the routers use: owner hashes, per-backend
LRU zsets) and reports used_memory before and after, per million entries.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from pathlib import Path

import redis.asyncio as aioredis

from prefix_router.config import RouterSettings
from prefix_router.redis_store import RedisStore

from .fleet import Fleet

RESULTS = Path(__file__).parent / "results" / "shared-store"


async def measure(entries: int = 1_000_000, backends: int = 8, chain: int = 16) -> dict:
    async with Fleet(Path("bench/.logs") / f"redis-memory-{int(time.time())}") as fleet:
        url = await fleet.start_redis()
        raw = aioredis.from_url(url)
        await raw.ping()
        before = (await raw.info("memory"))["used_memory"]
        per_backend = entries // backends
        s = RouterSettings.model_validate(
            {
                "model_key": "bench/memory",
                # room for every entry, so the capacity model trims nothing
                "kv_capacity_tokens": 16 * (per_backend + 1),
                "ttl_seconds": 3600,
                "store": {"mode": "redis", "url": url, "timeout_ms": 1000},
            }
        )
        store = RedisStore(s, "mem")
        await store.start()
        rnd = random.Random(1)
        urls = [f"http://10.0.0.{i}:8000" for i in range(backends)]
        written = 0
        while written < entries:
            for b in urls:
                store.record("m", [rnd.getrandbits(64) for _ in range(chain)], b)
                written += chain
            if written % 32_000 < chain * backends:
                await store._flush()  # the routers' own write path, driven faster than 5 ms
        while store._queue:
            await store._flush()
        await store.close()

        after = (await raw.info("memory"))["used_memory"]
        keys = await raw.dbsize()
        await raw.aclose()
    used = after - before
    return {
        "entries": written,
        "backends": backends,
        "redis_keys": keys,
        "used_memory_bytes": used,
        "bytes_per_entry": round(used / written, 1),
        "mib_per_million_entries": round(used / written * 1e6 / 2**20, 1),
    }


def main() -> dict:
    result = asyncio.run(measure())
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "redis-memory.json").write_text(json.dumps(result, indent=2) + "\n")
    return result
