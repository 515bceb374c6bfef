"""Real processes on 127.0.0.1: engine simulators and routers, started per test (the `fleet`
fixture is tests/conftest.py's)."""

from __future__ import annotations

import pytest

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
