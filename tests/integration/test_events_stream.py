"""The router's event subscriber on real ZMQ sockets, against a publisher that sends vLLM's
own frames (tests/fixtures/vllm-kv-events) and answers replay requests with vLLM's own replay
frames: a gap is replayed, a gap that cannot be replayed drops the engine's entries, a
sequence that goes back is a restart."""

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

FIXTURE = Path(__file__).parents[1] / "fixtures" / "vllm-kv-events" / "0.34.0-map.json"
ENGINE = "http://192.0.2.10:8000"
LORA_CHAIN = block_hashes(
    array("I", range(2000, 2032)).tobytes(), 64, chain_seed("sql-lora", "tenant-a")
)


class Publisher:
    """vLLM's two sockets: XPUB (so the test knows when the router has subscribed) and the
    replay ROUTER. A replay from seq 1 gets the very frames vLLM sent for it (batches 1..4,
    the end marker); any other gets what this publisher has published since, framed as vLLM
    0.34 frames it."""

    def __init__(self, answer_replays: bool = True) -> None:
        d = json.loads(FIXTURE.read_text())
        self.live = [[bytes.fromhex(f) for f in x["frames_hex"]] for x in d["live"]]
        self.replay = [[bytes.fromhex(f) for f in m] for m in d["replay_frames_hex"]]
        self.ctx = zmq.asyncio.Context()
        self.pub = self.ctx.socket(zmq.XPUB)
        self.port = self.pub.bind_to_random_port("tcp://127.0.0.1")
        self.router = self.ctx.socket(zmq.ROUTER)
        self.replay_port = self.router.bind_to_random_port("tcp://127.0.0.1")
        self.answer = answer_replays
        self.asked: list[int] = []
        self.sent: dict[int, list[bytes]] = {}
        self.task = asyncio.create_task(self._serve())

    async def _serve(self) -> None:
        while True:
            ident, _empty, start_b = await self.router.recv_multipart()
            start = int.from_bytes(start_b, "big")
            self.asked.append(start)
            if not self.answer:
                continue
            if start == 1:
                for frames in self.replay:
                    await self.router.send_multipart([ident, *frames])
                continue
            for seq in sorted(s for s in self.sent if s >= start):
                await self.router.send_multipart([ident, b"", *self.sent[seq]])
            await self.router.send_multipart([ident, b"", b"", b"\xff" * 8, b""])

    async def subscribed(self) -> None:
        msg = await asyncio.wait_for(self.pub.recv(), 30)
        assert msg[0] == 1  # a subscription

    async def send(self, i: int, seq: int | None = None, lost: bool = False) -> None:
        """Publish live batch `i` as `seq` (`lost`: a subscriber never gets it)."""
        topic, seq_b, payload = self.live[i]
        if seq is not None:
            seq_b = seq.to_bytes(8, "big")
        self.sent[int.from_bytes(seq_b, "big")] = [topic, seq_b, payload]
        if not lost:
            await self.pub.send_multipart([topic, seq_b, payload])

    def close(self) -> None:
        self.task.cancel()
        self.ctx.destroy(linger=0)


async def until(predicate, what: str, timeout: float = 30.0) -> None:
    await waiting.until(predicate, timeout, what, interval=0.01)

@pytest.fixture
async def wired():
    made: list[tuple[Publisher, EventSubscriber]] = []

    async def make(answer_replays: bool = True) -> tuple[Publisher, EventSubscriber, EventsIndex]:
        pub = Publisher(answer_replays)
        index = EventsIndex(16, 100_000)
        ends = {ENGINE: f"tcp://127.0.0.1:{pub.port},tcp://127.0.0.1:{pub.replay_port}"}
        sub = EventSubscriber(EventSettings(endpoints=ends, replay_timeout_s=2.0), index, 16,
                              lambda backend, lora: lora or "base-model")  # fmt: skip
        sub.join(ENGINE)
        await pub.subscribed()
        await until(lambda: pub.asked == [0] or not answer_replays, "the catch-up on joining")
        made.append((pub, sub))
        return pub, sub, index

    yield make
    for pub, sub in made:
        await sub.close()
        pub.close()


async def test_a_gap_is_replayed_from_the_engines_buffer(wired) -> None:
    pub, sub, index = await wired()
    await pub.send(0)
    (feed,) = sub.feeds()
    await until(lambda: feed.last_seq == 0, "batch 0")
    await pub.send(1, lost=True)  # batch 1 never arrives live
    await pub.send(2)
    await until(lambda: feed.last_seq == 2, "batch 2")
    assert pub.asked == [0, 1]  # the catch-up on joining, then the gap
    # batch 1 (the LoRA chain) came by replay, batch 2 removed its last block
    assert index.match("sql-lora", LORA_CHAIN) == {ENGINE: 1}
    assert sub.resets == 0


async def test_a_gap_that_cannot_be_replayed_drops_the_engines_entries(wired) -> None:
    pub, sub, index = await wired(answer_replays=False)
    await pub.send(1, seq=0)  # the LoRA chain, as the first batch
    (feed,) = sub.feeds()
    await until(lambda: feed.last_seq == 0, "the first batch")
    assert index.match("sql-lora", LORA_CHAIN) == {ENGINE: 2}
    await pub.send(4, seq=3)  # 1 and 2 lost, and nobody answers the replay request
    await until(lambda: feed.last_seq == 3, "the batch after the gap")
    assert sub.resets == 1 and index.match("sql-lora", LORA_CHAIN) == {}


async def test_a_sequence_that_goes_back_is_a_restarted_engine(wired) -> None:
    pub, sub, index = await wired()
    await pub.send(1, seq=0)
    await pub.send(2, seq=1)
    (feed,) = sub.feeds()
    await until(lambda: feed.last_seq == 1, "two batches")
    await pub.send(1, seq=0)  # a new process: its cache starts empty, then stores the chain
    await until(lambda: sub.resets == 1 and feed.last_seq == 0, "the restart")
    assert index.match("sql-lora", LORA_CHAIN) == {ENGINE: 2}


async def test_a_router_that_joins_late_learns_what_the_buffer_holds(wired) -> None:
    pub = Publisher()
    try:
        await pub.send(1, seq=0)  # before anyone listened: no subscriber gets it live
        index = EventsIndex(16, 100_000)
        ends = {ENGINE: f"tcp://127.0.0.1:{pub.port},tcp://127.0.0.1:{pub.replay_port}"}
        sub = EventSubscriber(EventSettings(endpoints=ends), index, 16,
                              lambda backend, lora: lora or "base-model")  # fmt: skip
        sub.join(ENGINE)
        (feed,) = sub.feeds()
        await until(lambda: feed.last_seq == 0, "the catch-up replay")
        assert index.match("sql-lora", LORA_CHAIN) == {ENGINE: 2}
        await pub.subscribed()
        await pub.send(1, seq=0)  # the same batch live too: a duplicate, not a restart
        await pub.send(2, seq=1)
        await until(lambda: feed.last_seq == 1, "the next batch")
        assert sub.resets == 0 and index.match("sql-lora", LORA_CHAIN) == {ENGINE: 1}
        await sub.close()
    finally:
        pub.close()


async def test_all_blocks_cleared_empties_the_engines_entries(wired) -> None:
    pub, sub, index = await wired()
    await pub.send(1, seq=0)
    await pub.send(3, seq=1)
    (feed,) = sub.feeds()
    await until(lambda: feed.last_seq == 1, "the clear")
    assert index.entries() == 0


async def test_a_long_replay_lets_requests_through() -> None:
    """An engine's replay buffer holds up to 10,000 batches: applied on joining (or to cover a
    gap), they come in slices, and other work on the loop runs between them."""
    from prefix_router.events.feed import EngineFeed

    index = EventsIndex(16, 100_000)
    sub = EventSubscriber(EventSettings(), index, 16, lambda backend, lora: "m")
    feed = EngineFeed(ENGINE, index, 16, lambda lora: "m")
    ran = 0

    async def other_work() -> None:
        nonlocal ran
        while True:
            ran += 1
            await asyncio.sleep(0)

    task = asyncio.ensure_future(other_work())
    await asyncio.sleep(0)
    try:
        before = ran
        await sub._apply_all(feed, [(i, b"\xc1") for i in range(1000)])  # 0xc1: never msgpack
        assert ran - before >= 1000 // 64 - 1
        assert (sub.errors, feed.last_seq) == (1000, 999)  # each counted, in order
    finally:
        task.cancel()
        await sub.close()


async def test_each_engines_state_follows_its_stream() -> None:
    """DEGRADED until the join's replay is read, EXACT while the events come in sequence,
    DEGRADED after a gap that could not be replayed, EXACT again once the engine restarts
    (empty: the index knows all it holds)."""
    pub = Publisher(answer_replays=False)
    try:
        index = EventsIndex(16, 100_000)
        ends = {ENGINE: f"tcp://127.0.0.1:{pub.port},tcp://127.0.0.1:{pub.replay_port}"}
        sub = EventSubscriber(EventSettings(endpoints=ends, replay_timeout_s=1.0), index, 16,
                              lambda backend, lora: lora or "base-model")  # fmt: skip
        assert sub.state(ENGINE) == "DEGRADED"  # not joined
        sub.join(ENGINE)
        await until(lambda: pub.asked == [0], "the join's replay asked for")
        assert (sub.state(ENGINE), sub.warm()) == ("DEGRADED", False)  # not answered yet
        await until(sub.warm, "the join's replay given up")
        assert sub.state(ENGINE) == "EXACT"
        await pub.subscribed()
        await pub.send(1, seq=0)
        (feed,) = sub.feeds()
        await until(lambda: feed.last_seq == 0, "the first batch")
        assert sub.state(ENGINE) == "EXACT"
        await pub.send(4, seq=3)  # 1 and 2 lost, and the replay is not answered
        await until(lambda: feed.last_seq == 3, "the batch after the gap")
        assert sub.resets == 1 and sub.state(ENGINE) == "DEGRADED"
        await pub.send(1, seq=0)  # a new process
        await until(lambda: sub.resets == 2 and feed.last_seq == 0, "the restart")
        assert sub.state(ENGINE) == "EXACT"
        await sub.close()
    finally:
        pub.close()
