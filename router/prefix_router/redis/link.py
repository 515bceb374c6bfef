"""The connection to Redis every job of the shared store uses, and whether Redis is there.

A command that fails (refused, reset, no reply within the socket timeout) marks the store
`down`: every job then works from local state, and `reconnect()` (on a timer) brings it back,
loading the scripts again (an emptied or restarted Redis lost them).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from ..config import StoreSettings
from .scripts import SCRIPTS

log = logging.getLogger("prefix_router.redis")

# A store that just failed is not asked again for this long.
RETRY_AFTER_S = 1.0
SOCKET_TIMEOUT_S = 1.0

# What a failing Redis call raises (KeyError: a script not loaded, Redis down at start).
FAILURES: tuple[type[BaseException], ...] = (RedisError, OSError, KeyError)


class RedisLink:
    def __init__(self, st: StoreSettings, clock: Callable[[], float] = time.monotonic) -> None:
        assert st.url
        password = os.environ.get(st.password_env) if st.password_env else None
        self.redis = aioredis.from_url(
            st.url,
            password=password,
            username=st.username,
            socket_timeout=SOCKET_TIMEOUT_S,
            socket_connect_timeout=SOCKET_TIMEOUT_S,
            health_check_interval=0,
            decode_responses=True,
        )
        self._clock = clock
        self._sha: dict[str, str] = {}
        self.down = False
        self._retry_at = 0.0

    def pipeline(self) -> aioredis.client.Pipeline:
        return self.redis.pipeline(transaction=False)

    def evalsha(self, pipe: Any, script: str, *args: object) -> Any:
        """Queue (or, on the client, send) a script call; KeyError when the scripts are not
        loaded."""
        return pipe.evalsha(self._sha[script], 0, *args)

    async def load_scripts(self) -> None:
        for name, body in SCRIPTS.items():
            self._sha[name] = await self.redis.script_load(body)

    async def start(self) -> None:
        try:
            await self.load_scripts()
        except FAILURES as exc:
            self.fail(exc)

    def fail(self, exc: BaseException) -> None:
        if not self.down:
            log.warning("shared store unavailable (%r): routing on local state", exc)
        self.down = True
        self._retry_at = self._clock() + RETRY_AFTER_S

    async def reconnect(self) -> bool:
        """One try to bring a down store back; True when it is back."""
        if not self.down or self._clock() < self._retry_at:
            return False
        try:
            # the pool's connections to the Redis that went away are dead: let them go
            await self.redis.connection_pool.disconnect()
            await self.redis.ping()
            await self.load_scripts()
        except FAILURES as exc:
            self._retry_at = self._clock() + RETRY_AFTER_S
            log.debug("reconnect failed: %r", exc)
            return False
        self.down = False
        log.info("shared store back: routing on the shared table again")
        return True

    async def close(self) -> None:
        await self.redis.aclose()
