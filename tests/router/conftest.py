"""A Scheduler in-process (real index, load counts and profile; no HTTP), as the proxy drives
it, and its Attempts."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest

from prefix_router.backends import BackendSet
from prefix_router.config import RouterSettings
from prefix_router.load import LoadTracker
from prefix_router.metrics import RouterMetrics
from prefix_router.scheduling import Scheduler
from prefix_router.store import local_index

MakeScheduler = Callable[[Sequence[str], int], Scheduler]


@pytest.fixture
def make_scheduler() -> MakeScheduler:
    def make(backends: Sequence[str], kv_capacity_tokens: int) -> Scheduler:
        s = RouterSettings(kv_capacity_tokens=kv_capacity_tokens)  # otherwise the defaults
        members = BackendSet()
        members.set_members(list(backends))
        return Scheduler(s, members, local_index(s), LoadTracker(), RouterMetrics())

    return make



@pytest.fixture(scope="session")
def tokenizer_dir():
    """The repository's own small tokenizer (a real byte-level BPE with a Llama-3-like chat
    template, made by hack/make-tiny-tokenizer.py): the one the simulator uses too."""
    from engine_sim.hf_tokenizer import TINY_TOKENIZER

    return TINY_TOKENIZER
