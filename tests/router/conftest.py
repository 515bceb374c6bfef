"""A Router in-process (real table, load counts and policy; no HTTP), as the proxy drives it."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest

from prefix_router.backends import BackendSet
from prefix_router.config import RouterSettings
from prefix_router.load import LoadTracker
from prefix_router.metrics import RouterMetrics
from prefix_router.routing import Router
from prefix_router.store import LocalStore


@pytest.fixture
def make_router() -> Callable[[Sequence[str], int], Router]:
    def make(backends: Sequence[str], kv_capacity_tokens: int) -> Router:
        s = RouterSettings(kv_capacity_tokens=kv_capacity_tokens)  # otherwise the defaults
        members = BackendSet()
        members.set_members(list(backends))
        store = LocalStore(
            s.block_size, s.kv_capacity_tokens, s.ttl_seconds, s.max_table_entries
        )
        return Router(s, members, store, LoadTracker(), RouterMetrics())

    return make
