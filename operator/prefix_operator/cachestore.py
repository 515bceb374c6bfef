"""The model's cache store (Redis), as the operator sees it: reachability, the routers'
published figures, and removal of the model's keys when the model is deleted.

Every call has a short timeout: the store may be unreachable from where the operator runs,
and no handler may hang on it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import redis.asyncio as aioredis

from .figures import ROUTER_KEY_INFIX

_GLOB_SPECIAL = re.compile(r"([\\*?\[\]])")


def glob_escape(text: str) -> str:
    return _GLOB_SPECIAL.sub(r"\\\1", text)


def _client(url: str, password: str | None, timeout: float) -> aioredis.Redis:
    kwargs: dict[str, object] = {"socket_timeout": timeout, "socket_connect_timeout": timeout,
                                 "decode_responses": True, "retry_on_timeout": False}
    if password:
        kwargs["password"] = password
    return aioredis.Redis.from_url(url, **kwargs)


async def ping(url: str, password: str | None, timeout: float) -> tuple[bool, str]:
    client = _client(url, password, timeout)
    try:
        await client.ping()
        return True, ""
    except (aioredis.RedisError, OSError) as e:
        return False, f"{type(e).__name__}: {e}"
    finally:
        await client.aclose()


async def delete_keys(url: str, password: str | None, prefix: str, timeout: float,
                      batch: int = 500) -> int:
    """UNLINK every key starting with `prefix`; returns how many. Raises on store errors."""
    client = _client(url, password, timeout)
    removed = 0
    try:
        pending: list[str] = []
        async for key in client.scan_iter(match=glob_escape(prefix) + "*", count=batch):
            pending.append(key)
            if len(pending) >= batch:
                removed += await client.unlink(*pending)
                pending.clear()
        if pending:
            removed += await client.unlink(*pending)
        return removed
    finally:
        await client.aclose()


async def read_published(url: str, password: str | None, prefix: str,
                         timeout: float) -> list[Mapping[str, str]]:
    """The routers' figure hashes of one model (see figures.py)."""
    client = _client(url, password, timeout)
    try:
        keys = [k async for k in client.scan_iter(
            match=glob_escape(prefix + ROUTER_KEY_INFIX) + "*", count=200)]
        if not keys:
            return []
        pipe = client.pipeline(transaction=False)
        for k in keys:
            pipe.hgetall(k)
        return [h for h in await pipe.execute() if h]
    finally:
        await client.aclose()
