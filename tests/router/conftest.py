"""A router core in-process (real index, load counts and profile; no HTTP), as the proxy
drives it, and its Attempts."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest

from prefix_router.backends import BackendSet
from prefix_router.config import RouterSettings
from prefix_router.core import RouterCore, build_core

MakeCore = Callable[..., RouterCore]


@pytest.fixture
def make_core(tokenizer_dir) -> MakeCore:
    def make(
        backends: Sequence[str], kv_capacity_tokens: int, clock: Callable[[], float] | None = None,
        **settings: Any,
    ) -> RouterCore:
        if settings.get("index") == "events":
            settings.setdefault("tokenizer", str(tokenizer_dir))  # events name token ids
        s = RouterSettings(kv_capacity_tokens=kv_capacity_tokens, **settings)
        members = BackendSet()
        members.set_members(list(backends))
        return build_core(s, members, **({"clock": clock} if clock else {}))

    return make


@pytest.fixture(scope="session")
def tokenizer_dir():
    """The repository's own small tokenizer (a real byte-level BPE with a Llama-3-like chat
    template, made by hack/make-tiny-tokenizer.py): the one the simulator uses too."""
    from engine_sim.hf_tokenizer import TINY_TOKENIZER

    return TINY_TOKENIZER
