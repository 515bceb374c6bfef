"""A vLLM engine with the snapshot service on (vLLM PR #57789) sends its publisher's lifetime
id with every live batch: in a 24-byte sequence frame (the PR's first revision) or as the
batch's trailing element (its later one). The router's subscriber on real ZMQ sockets reads
both (tests/fixtures/vllm-kv-events/gaps), counts no error, and takes a new id for a restart
even where the sequence goes on."""

from __future__ import annotations

import asyncio
import json
from array import array
from pathlib import Path

import pytest
import waiting
import zmq
import zmq.asyncio

from prefix_router.config import EventSettings
from prefix_router.events.subscriber import EventSubscriber
from prefix_router.index.events import EventsIndex
from prefix_router.prefix import block_hashes, chain_seed

GAPS = Path(__file__).parents[1] / "fixtures" / "vllm-kv-events" / "gaps"
ENGINE = "http://192.0.2.10:8000"
CHAIN = block_hashes(array("I", range(8000, 8032)).tobytes(), 64, chain_seed("base-model", None))


@pytest.mark.parametrize("case", ["snapshot-sequence-frame", "snapshot-identified-batch"])
async def test_a_snapshot_mode_publishers_frames_are_applied_and_its_restart_seen(
    case: str,
) -> None:
    d = json.loads((GAPS / f"{case}.json").read_text())
    live = [[bytes.fromhex(f) for f in m["frames_hex"]] for m in d["messages"]]
    ctx = zmq.asyncio.Context()
    pub = ctx.socket(zmq.XPUB)
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    index = EventsIndex(16, 100_000)
    sub = EventSubscriber(EventSettings(endpoints={ENGINE: f"tcp://127.0.0.1:{port}"}), index,
                          16, lambda backend, lora: lora or "base-model")  # fmt: skip
    try:
        sub.join(ENGINE)
        msg = await asyncio.wait_for(pub.recv(), 30)
        assert msg[0] == 1  # subscribed
        (feed,) = sub.feeds()
        for frames in live[:2]:  # publisher A: a chain of two blocks, then an idle heartbeat
            await pub.send_multipart(frames)
        await waiting.until(lambda: feed.last_seq == 1, 30, "publisher A's batches", 0.01)
        assert sub.errors == 0 and index.match("base-model", CHAIN) == {ENGINE: 2}
        # publisher B (a new process) whose sequence happens to go on from A's
        await pub.send_multipart(live[2])
        await waiting.until(lambda: sub.resets == 1, 30, "the restart", 0.01)
        await waiting.until(lambda: feed.last_seq == 2, 30, "publisher B's batch", 0.01)
        assert sub.errors == 0 and index.match("base-model", CHAIN) == {ENGINE: 1}
    finally:
        await sub.close()
        ctx.destroy(linger=0)
