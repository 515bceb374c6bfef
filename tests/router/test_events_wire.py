"""vLLM's own KV-event bytes (tests/fixtures/vllm-kv-events: frames vLLM 0.10.2, 0.23.0,
0.25.0 and 0.34.0 produced, both encodings) decoded and applied to the index."""

from __future__ import annotations

import json
from array import array
from pathlib import Path
from typing import Any

import pytest

from prefix_router.events.feed import EngineFeed
from prefix_router.events.wire import Cleared, Removed, Stored, decode_batch, salt_of
from prefix_router.index.events import EventsIndex
from prefix_router.prefix import block_hashes, chain_seed

FIXTURES = sorted((Path(__file__).parents[1] / "fixtures" / "vllm-kv-events").glob("*.json"))
ENGINE = "http://192.0.2.10:8000"


def _hash(h: Any) -> int | bytes:
    return bytes.fromhex(h["hex"]) if isinstance(h, dict) else h


def _frames(f: Path) -> list[tuple[int, bytes, dict[str, Any]]]:
    d = json.loads(f.read_text())
    return [(x["seq"], bytes.fromhex(x["frames_hex"][2]), x["meaning"]) for x in d["live"]]


@pytest.mark.parametrize("fixture", FIXTURES, ids=[f.stem for f in FIXTURES])
def test_every_release_decodes_to_what_vllm_meant(fixture: Path) -> None:
    for _seq, payload, meaning in _frames(fixture):
        batch = decode_batch(payload)
        assert batch.ts == meaning["ts"]
        assert len(batch.events) == len(meaning["events"])
        for got, want in zip(batch.events, meaning["events"], strict=True):
            if want["type"] == "BlockStored":
                assert isinstance(got, Stored)
                assert got.hashes == [_hash(h) for h in want["block_hashes"]]
                parent = want["parent_block_hash"]
                assert got.parent == (None if parent is None else _hash(parent))
                assert got.token_ids == want["token_ids"]
                assert got.block_size == want["block_size"]
                assert got.lora_name == want.get("lora_name")
            elif want["type"] == "BlockRemoved":
                assert isinstance(got, Removed)
                assert got.hashes == [_hash(h) for h in want["block_hashes"]]
            else:
                assert isinstance(got, Cleared)


def _key_chain(model: str, salt: str | None, tokens: list[int]) -> list[int]:
    """What a request for these tokens is keyed by (token-aligned blocks of 16)."""
    return block_hashes(array("I", tokens).tobytes(), 16 * 4, chain_seed(model, salt))


@pytest.mark.parametrize("fixture", FIXTURES, ids=[f.stem for f in FIXTURES])
def test_the_index_follows_the_events_under_the_routers_own_keys(fixture: Path) -> None:
    index = EventsIndex(16, 100_000)
    feed = EngineFeed(ENGINE, index, 16, lambda lora: lora or "base-model")
    frames = _frames(fixture)
    # batch 0: a chain whose parent was stored before this router listened: not placeable
    feed.apply(frames[0][0], decode_batch(frames[0][1]))
    assert index.entries() == 0 and feed.skipped == 3
    # batch 1: a LoRA chain from the root, salted: keyed as a request of that LoRA and
    # tenant is keyed (releases before lora_name existed say nothing of the LoRA)
    feed.apply(frames[1][0], decode_batch(frames[1][1]))
    lora = frames[1][2]["events"][0].get("lora_name")
    stored = decode_batch(frames[1][1]).events[0]
    assert isinstance(stored, Stored)
    salt = salt_of(stored)
    if lora is not None:
        assert salt == "tenant-a"
    model = lora or "base-model"
    chain = _key_chain(model, salt, list(range(2000, 2032)))
    assert index.match(model, chain) == {ENGINE: 2}
    assert index.match(model, _key_chain(model, "tenant-b", list(range(2000, 2032)))) == {}
    # batch 2: the chain's last block evicted
    feed.apply(frames[2][0], decode_batch(frames[2][1]))
    assert index.match(model, chain) == {ENGINE: 1}
    # batch 3: the engine's cache reset
    feed.apply(frames[3][0], decode_batch(frames[3][1]))
    assert index.entries() == 0 and len(feed) == 0


def test_a_stored_block_under_a_known_parent_extends_its_chain() -> None:
    index = EventsIndex(16, 100_000)
    feed = EngineFeed(ENGINE, index, 16, lambda lora: "m")
    tokens = list(range(100, 148))
    first = Stored([b"\x01" * 32], None, tokens[:16], 16, None, None)
    rest = Stored([7, 2**64 - 1], b"\x01" * 32, tokens[16:], 16, None, None)
    from prefix_router.events.wire import Batch

    feed.apply(0, Batch(0.0, [first], 0))
    feed.apply(1, Batch(0.0, [rest], 0))
    assert index.match("m", _key_chain("m", None, tokens)) == {ENGINE: 3}
    # a block stored twice under one hash is gone only when both copies are
    feed.apply(2, Batch(0.0, [Stored([7], b"\x01" * 32, tokens[16:32], 16, None, None)], 0))
    feed.apply(3, Batch(0.0, [Removed([2**64 - 1]), Removed([7])], 0))
    assert index.match("m", _key_chain("m", None, tokens)) == {ENGINE: 2}
    feed.apply(4, Batch(0.0, [Removed([7])], 0))
    assert index.match("m", _key_chain("m", None, tokens)) == {ENGINE: 1}
    assert feed.expects(5) == "next" and feed.expects(7) == "gap"
    assert feed.expects(0) == "restart"


def test_a_decisions_speculative_entry_yields_to_what_the_engine_said() -> None:
    # the router claims a chain for ENGINE until its events come (attempt.py); the engine
    # stores it, then evicts its tail: the claim must not outlive the eviction, or requests
    # are sent there as hits for blocks it no longer holds (an engine that evicts within
    # events.speculative_s: a small or busy one)
    from prefix_router.events.wire import Batch
    from prefix_router.index.pending import PendingIndex

    index = EventsIndex(16, 100_000)
    speculative = PendingIndex()
    feed = EngineFeed(ENGINE, index, 16, lambda lora: "m",
                      on_settled=lambda model, keys: speculative.settle(model, keys, ENGINE))
    tokens = list(range(100, 148))
    chain = _key_chain("m", None, tokens)

    def lookup() -> dict[str, int]:
        return speculative.merge("m", chain, index.match("m", chain))

    speculative.hold_until("m", chain, ENGINE, when=10.0)
    assert lookup() == {ENGINE: 3}  # claimed before the engine said anything
    feed.apply(0, Batch(0.0, [Stored([1, 2, 3], None, tokens, 16, None, None)], 0))
    assert lookup() == {ENGINE: 3} and len(speculative) == 0  # the index holds it now
    feed.apply(1, Batch(0.0, [Removed([3])], 0))
    assert lookup() == {ENGINE: 2}
    # a claim made after the engine stored the blocks goes when it evicts them
    speculative.hold_until("m", chain, ENGINE, when=10.0)
    feed.apply(2, Batch(0.0, [Removed([2]), Removed([1])], 0))
    assert lookup() == {}
    speculative.expire(now=11.0)  # the claims' own expiry finds nothing left to release
    assert lookup() == {} and len(speculative) == 0


def test_a_loras_chain_continues_under_the_lora_and_leaves_under_it() -> None:
    from prefix_router.events.wire import Batch

    index = EventsIndex(16, 100_000)
    feed = EngineFeed(ENGINE, index, 16, lambda lora: lora or "base-model")
    tokens = list(range(300, 348))
    feed.apply(0, Batch(0.0, [Stored([11], None, tokens[:16], 16, "ada", None)], 0))
    feed.apply(1, Batch(0.0, [Stored([12, 13], 11, tokens[16:], 16, "ada", None)], 0))
    feed.apply(2, Batch(0.0, [Stored([21], None, tokens[:16], 16, None, None)], 0))
    assert index.match("ada", _key_chain("ada", None, tokens)) == {ENGINE: 3}
    assert index.match("base-model", _key_chain("base-model", None, tokens)) == {ENGINE: 1}
    feed.apply(3, Batch(0.0, [Removed([13])], 0))
    assert index.match("ada", _key_chain("ada", None, tokens)) == {ENGINE: 2}
    assert index.match("base-model", _key_chain("base-model", None, tokens)) == {ENGINE: 1}
