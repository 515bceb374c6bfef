"""Fixtures shared by more than one test folder (each folder's conftest.py keeps its own)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bench.fleet import Fleet


@pytest.fixture
async def fleet(tmp_path: Path) -> AsyncIterator[Fleet]:
    """Real processes on 127.0.0.1 (engine simulators, routers), logs in tmp_path/logs; all
    stopped at the end of the test."""
    f = Fleet(tmp_path / "logs")
    try:
        yield f
    finally:
        await f.close()
