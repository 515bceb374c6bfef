"""Real processes on 127.0.0.1: engine simulators and routers, started per test (the `fleet`
fixture is tests/conftest.py's)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from inprocess import stub_engine
from multidict import CIMultiDict

from bench.harness.fleet import Fleet

MODEL = "test-model"


async def _start_sims(
    fleet: Fleet,
    n: int,
    *,
    profile: str = "fast",
    kv: int = 100_000,
    time_scale: float = 1.0,
    extra: list[str] | None = None,
) -> list[str]:
    urls = []
    for i in range(n):
        p = await fleet.start_sim(
            f"sim{i}",
            model=MODEL,
            kv_capacity=kv,
            profile=profile,
            time_scale=time_scale,
            extra=extra,
        )
        urls.append(p.url)
    return urls


@pytest.fixture
def start_sims():
    """An async function (fleet, n, **options) -> list of simulator URLs."""
    return _start_sims


ANSWER = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}],
          "usage": {"prompt_tokens": 5}}  # fmt: skip


@pytest.fixture
async def engine() -> AsyncIterator[tuple[str, list[dict[str, Any]]]]:
    """An HTTP server answering every chat request like an engine; keeps each request's
    headers (repeated ones too, as a CIMultiDict) and its JSON body."""
    seen: list[dict[str, Any]] = []

    async def chat(request: web.Request) -> web.Response:
        seen.append({"headers": CIMultiDict(request.headers), "body": await request.json()})
        return web.json_response(ANSWER)

    async with stub_engine(chat) as url:
        yield url, seen
