"""The model's cache store (Redis), as the operator sees it: reachability, the routers'
published figures, and removal of the model's keys when the model is deleted.

Every call has a short timeout: the store may be unreachable from where the operator runs,
and no handler may hang on it.
"""

from __future__ import annotations

import base64
import re
from typing import Any

import redis.asyncio as aioredis

from prefix_router.contract import EngineValues, RouterFigures, StoreKeys

from . import kinds
from .kube import Kube
from .naming import store_url
from .spec import Model

_GLOB_SPECIAL = re.compile(r"([\\*?\[\]])")


def glob_escape(text: str) -> str:
    return _GLOB_SPECIAL.sub(r"\\\1", text)


def decode_secret(secret: dict[str, Any] | None, key: str) -> str | None:
    if not secret:
        return None
    if key in (secret.get("stringData") or {}):
        return secret["stringData"][key]
    raw = (secret.get("data") or {}).get(key)
    return base64.b64decode(raw).decode() if raw else None


async def credentials(kube: Kube, model: Model) -> tuple[str, str | None]:
    """The model's store URL, and the password from its Secret (an external store's)."""
    store = model.spec.cache_store
    ref = store.password_secret_ref
    if store.type != "external" or ref is None:
        return store_url(model), None
    secret = await kube.get(kinds.SECRET, model.namespace, ref.name)
    return store_url(model), decode_secret(secret, ref.key)


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


async def read_published(url: str, password: str | None, model_key: str,
                         timeout: float) -> list[RouterFigures]:
    """The figures each router of one model published (see figures.py)."""
    client = _client(url, password, timeout)
    try:
        keys = [k async for k in client.scan_iter(
            match=glob_escape(StoreKeys(model_key).figures_prefix) + "*", count=200)]
        if not keys:
            return []
        pipe = client.pipeline(transaction=False)
        for k in keys:
            pipe.hgetall(k)
        return [RouterFigures.from_hash(h) for h in await pipe.execute() if h]
    finally:
        await client.aclose()


async def read_engine_values(url: str, password: str | None, model_key: str,
                             timeout: float) -> list[EngineValues]:
    """The engine values each router of one model published (figures.engine_values)."""
    client = _client(url, password, timeout)
    try:
        keys = [k async for k in client.scan_iter(
            match=glob_escape(StoreKeys(model_key).engine_values_prefix) + "*", count=200)]
        if not keys:
            return []
        pipe = client.pipeline(transaction=False)
        for k in keys:
            pipe.hgetall(k)
        return [EngineValues.from_hash(h) for h in await pipe.execute() if h]
    finally:
        await client.aclose()
