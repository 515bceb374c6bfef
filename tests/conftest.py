"""Fixtures shared by more than one test folder (each folder's conftest.py keeps its own)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from waiting import scale

from bench.harness.fleet import Fleet, Proc


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """pytest-timeout's limit from pyproject.toml, scaled like every wait (tests/waiting.py):
    the suite waits on real processes, slower on a busy machine. A limit given on the command
    line or in $PYTEST_TIMEOUT is left as given."""
    if config.getvalue("timeout") is not None or os.environ.get("PYTEST_TIMEOUT"):
        return
    limit = float(config.getini("timeout") or 0)
    if not limit:
        return
    for item in items:
        if item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(limit * scale()))


class TestFleet(Fleet):
    """The bench's fleet, with routers that tell clients where each request went (the tests
    read it; routers keep it to themselves unless asked)."""

    async def start_router(self, name: str, backends: list[str], *, policy: str,
                           kv_capacity: int, extra: list[str] | None = None,
                           env: dict[str, str] | None = None) -> Proc:
        return await super().start_router(
            name, backends, policy=policy, kv_capacity=kv_capacity,
            extra=["--expose-routing", *(extra or [])], env=env,
        )


@pytest.fixture
async def fleet(tmp_path: Path) -> AsyncIterator[Fleet]:
    """Real processes on 127.0.0.1 (engine simulators, routers), logs in tmp_path/logs; all
    stopped at the end of the test."""
    f = TestFleet(tmp_path / "logs")
    try:
        yield f
    finally:
        await f.close()
