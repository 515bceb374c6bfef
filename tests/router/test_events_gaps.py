"""The KV events of real deployments the release captures do not cover
(tests/fixtures/vllm-kv-events/gaps: vLLM 0.34.0's own encoder, and the shapes of vLLM
commit 0181ea3173e5 and of its snapshot-service PR): map-encoded batches, an offloading
tier's events, a hybrid model's KV-cache groups, multimodal keys before the cache salt, a
publisher's id at the end of the batch. Decoded, applied, and looked up as the scheduler
does."""

from __future__ import annotations

import asyncio
import json
from array import array
from pathlib import Path
from typing import Any

import pytest

from prefix_router.events.feed import EngineFeed
from prefix_router.events.wire import Cleared, Removed, Stored, decode_batch, salt_of
from prefix_router.index.events import EventsIndex
from prefix_router.prefix import Media, block_hashes, chain_seed

GAPS = Path(__file__).parents[1] / "fixtures" / "vllm-kv-events" / "gaps"
ENGINE = "http://192.0.2.10:8000"
MODEL = "base-model"
CPU = 1 / 22


def _messages(case: str) -> list[tuple[int, bytes, dict[str, Any]]]:
    d = json.loads((GAPS / f"{case}.json").read_text())
    return [(m["seq"], bytes.fromhex(m["frames_hex"][2]), m["meaning"]) for m in d["messages"]]


def _chain(first: int, blocks: int, salt: str | None = None, model: str = MODEL,
           media: list[Media] | None = None) -> list[int]:
    tokens = array("I", range(first, first + 16 * blocks)).tobytes()
    return block_hashes(tokens, 16 * 4, chain_seed(model, salt), media=media or ())


def _feed(costs: dict[str, float] | None = None) -> tuple[EventsIndex, EngineFeed]:
    index = EventsIndex(16, 100_000, tier_costs={"CPU": CPU} if costs is None else costs)
    return index, EngineFeed(ENGINE, index, 16, lambda lora: lora or MODEL)


def _lookup(index: EventsIndex, chain: list[int]) -> tuple[int, float]:
    gpu = asyncio.run(index.lookup(MODEL, chain))
    lower = index.lower_tiers(MODEL, chain, gpu, [ENGINE])
    return gpu.get(ENGINE, 0), lower.get(ENGINE, 0.0)


@pytest.mark.parametrize("case", sorted(p.stem for p in GAPS.glob("*.json")))
def test_every_gap_decodes_to_what_vllm_meant(case: str) -> None:
    for _seq, payload, meaning in _messages(case):
        batch = decode_batch(payload)
        assert batch.ts == meaning["ts"] and batch.rank == meaning["data_parallel_rank"]
        if "publisher_id" in meaning:
            assert batch.publisher == bytes.fromhex(meaning["publisher_id"]["hex"])
        assert len(batch.events) == len(meaning["events"])
        for got, want in zip(batch.events, meaning["events"], strict=True):
            kind = {"BlockStored": Stored, "BlockRemoved": Removed}.get(want["type"], Cleared)
            assert isinstance(got, kind)
            if isinstance(got, (Stored, Removed)):
                assert got.hashes == want["block_hashes"]
                assert got.medium == want["medium"] and got.group == want["group_idx"]
            if isinstance(got, Stored):
                assert got.token_ids == want["token_ids"]
                assert got.kind == want["kv_cache_spec_kind"]
                assert got.window == want["kv_cache_spec_sliding_window"]


def test_a_map_encoded_batch_feeds_the_index() -> None:
    index, feed = _feed()
    chain = _chain(7000, 2)
    want = [2, 1, 0]  # stored; the tail evicted; the cache reset
    for (seq, payload, _), n in zip(_messages("map-batch"), want, strict=True):
        feed.apply(seq, decode_batch(payload))
        assert _lookup(index, chain) == (n, 0.0)


def test_a_cpu_tier_counts_at_its_load_cost_and_outlives_gpu_evictions_and_resets() -> None:
    index, feed = _feed()
    chain = _chain(3000, 4)
    msgs = _messages("cpu-offload")
    feed.apply(msgs[0][0], decode_batch(msgs[0][1]))
    assert _lookup(index, chain) == (4, 0.0)
    # offloaded: three blocks with their tokens, the fourth as a placeholder (hash only)
    feed.apply(msgs[1][0], decode_batch(msgs[1][1]))
    assert index.lower_blocks("CPU", ENGINE) == 4
    # the GPU evicts its last three blocks: the CPU copies still serve them, at a load's cost
    feed.apply(msgs[2][0], decode_batch(msgs[2][1]))
    gpu, cpu = _lookup(index, chain)
    assert gpu == 1 and cpu == pytest.approx(3 * (1 - CPU))
    # the GPU block pool reset: what the CPU tier holds stays
    feed.apply(msgs[3][0], decode_batch(msgs[3][1]))
    gpu, cpu = _lookup(index, chain)
    assert gpu == 0 and cpu == pytest.approx(4 * (1 - CPU))
    # the CPU tier drops block 2: the run ends before it
    feed.apply(msgs[4][0], decode_batch(msgs[4][1]))
    assert _lookup(index, chain) == (0, pytest.approx(2 * (1 - CPU)))


def test_gpu_only_scoring_ignores_the_cpu_tier() -> None:
    index, feed = _feed(costs={})
    for seq, payload, _ in _messages("cpu-offload")[:3]:
        feed.apply(seq, decode_batch(payload))
    assert _lookup(index, _chain(3000, 4)) == (1, 0.0)


def test_a_hybrid_models_hit_needs_its_sliding_window_groups_blocks() -> None:
    index, feed = _feed()
    h, g = _chain(4000, 4), _chain(5000, 4)
    msgs = _messages("hybrid-sliding-window")
    # both groups hold all four blocks
    feed.apply(msgs[0][0], decode_batch(msgs[0][1]))
    assert _lookup(index, h) == (4, 0.0)
    # the window group lost block 3: a hit of 3 needs its blocks 1, 2 (32 tokens: 2 blocks)
    feed.apply(msgs[1][0], decode_batch(msgs[1][1]))
    assert _lookup(index, h) == (3, 0.0)
    # and block 1: only a hit of 1 block (needing block 0) is left
    feed.apply(msgs[2][0], decode_batch(msgs[2][1]))
    assert _lookup(index, h) == (1, 0.0)
    # a window group's store without the blocks outside its window, placed by hash
    feed.apply(msgs[3][0], decode_batch(msgs[3][1]))
    assert _lookup(index, g) == (4, 0.0) and feed.skipped == 0


def test_the_cache_salt_follows_the_multimodal_keys() -> None:
    salts = []
    for _seq, payload, _ in _messages("multimodal-salt"):
        stored = decode_batch(payload).events[0]
        assert isinstance(stored, Stored)
        salts.append(salt_of(stored))
    # (identifier, offset) pairs; a bare identifier; the LoRA name first
    assert salts == ["tenant-a", "tenant-a", "tenant-b"]
    index, feed = _feed()
    # a bare identifier names no offset: its store is not keyed here (no release sends it)
    msgs = _messages("multimodal-salt")
    for seq, payload, _ in (msgs[0], msgs[2]):
        feed.apply(seq, decode_batch(payload))
    # the image starts at token 3 and goes on into block 1: both blocks carry it
    image = [Media(3 * 4, 17 * 4, "img-5f1d")]
    assert _lookup(index, _chain(6000, 2, "tenant-a", media=image)) == (2, 0.0)
    assert asyncio.run(index.lookup("sql-lora", _chain(6000, 1, "tenant-b", "sql-lora", image))) \
        == {ENGINE: 1}


def test_blocks_over_an_image_are_keyed_with_it_as_a_request_is() -> None:
    """The feed's key of a stored block carries the image its extra keys name, the key a
    request with that image at that place gets (keying.py): the same tokens without the
    image, or with another image or at another offset, are other blocks."""
    index, feed = _feed()
    seq, payload, _ = _messages("multimodal-salt")[0]
    feed.apply(seq, decode_batch(payload))
    assert _lookup(index, _chain(6000, 2, "tenant-a"))[0] == 0
    assert _lookup(index, _chain(6000, 2, "tenant-a", media=[Media(12, 68, "img-0000")]))[0] == 0
    assert _lookup(index, _chain(6000, 2, "tenant-a", media=[Media(16, 68, "img-5f1d")]))[0] == 0
    assert _lookup(index, _chain(6000, 2, "tenant-a", media=[Media(12, 68, "img-5f1d")]))[0] == 2


def test_a_new_publisher_id_at_the_end_of_the_batch_is_a_restart() -> None:
    index, feed = _feed()
    msgs = _messages("snapshot-identified-batch")
    for seq, payload, _ in msgs[:2]:  # a store, then an idle publisher's empty batch
        feed.apply(seq, decode_batch(payload), None)
    assert _lookup(index, _chain(8000, 2)) == (2, 0.0)
    seq, payload, _ = msgs[2]
    batch = decode_batch(payload)
    assert feed.expects(seq, batch.publisher) == "restart"
