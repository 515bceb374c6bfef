"""KV-cache events on vLLM's wire: msgpack batches on a ZMQ PUB socket, and a replay socket.

docs/kv-events.md is the contract. Here, in short: every engine step that changed the cache
sends one message [topic, seq (8 bytes big-endian, from 0 in each process), KVEventBatch];
the batch is the array [ts, events, data_parallel_rank]; an event is BlockStored, BlockRemoved
or AllBlocksCleared, encoded as a tagged array (vLLM <= 0.23) or as a map tagged by "type"
(vLLM >= 0.24, PR #42892). The ROUTER replay socket answers [b"", start_seq] with every
buffered batch from start_seq on, then an end marker (seq -1, empty payload); with the map
encoding the replies carry the topic frame, as vLLM >= 0.26 sends them.

The array structs declare vLLM 0.23.0's fields in vLLM's order (that wire is positional), the
map structs vLLM 0.34.0's (fields added after 0.23 default to None, which maps omit).
tests/sim/test_kvevents.py checks the bytes against those vLLM's own encoder produced.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections import deque
from dataclasses import dataclass, fields
from itertools import count
from typing import Any

import msgspec
import zmq
import zmq.asyncio

log = logging.getLogger("engine_sim.kvevents")

END_SEQ = (-1).to_bytes(8, "big", signed=True)
ENCODINGS = ("array", "map")
MEDIUM_GPU = "GPU"
MEDIUM_CPU = "CPU"


class _ArrayEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    pass


class _MapEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    pass


class ArrayBlockStored(_ArrayEvent, tag="BlockStored"):
    block_hashes: list[int | bytes]
    parent_block_hash: int | bytes | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None


class MapBlockStored(_MapEvent, tag="BlockStored"):
    block_hashes: list[int | bytes]
    parent_block_hash: int | bytes | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    # added by vLLM after 0.23 (declared so the encoding matches the newest release's bytes:
    # msgspec sizes the map header for all declared fields plus the tag: 16 here, so map16)
    locality: str | None = None
    ownership: str | None = None
    session_id: str | None = None
    lookahead_token_ids: list[list[int]] | None = None


class ArrayBlockRemoved(_ArrayEvent, tag="BlockRemoved"):
    block_hashes: list[int | bytes]
    medium: str | None
    group_idx: int | None = None


class MapBlockRemoved(_MapEvent, tag="BlockRemoved"):
    block_hashes: list[int | bytes]
    medium: str | None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None


class ArrayAllBlocksCleared(_ArrayEvent, tag="AllBlocksCleared"):
    pass


class MapAllBlocksCleared(_MapEvent, tag="AllBlocksCleared"):
    pass


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    # An array in every vLLM release, whatever the events' encoding.
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


_TYPES = {
    "array": (ArrayBlockStored, ArrayBlockRemoved, ArrayAllBlocksCleared),
    "map": (MapBlockStored, MapBlockRemoved, MapAllBlocksCleared),
}


@dataclass
class KVEventsConfig:
    """vLLM's --kv-events-config, with its field names and defaults."""

    enable_kv_cache_events: bool = False
    publisher: str | None = None
    endpoint: str = "tcp://*:5557"
    replay_endpoint: str | None = None
    buffer_steps: int = 10_000
    hwm: int = 100_000
    max_queue_size: int = 100_000
    topic: str = ""

    @classmethod
    def from_json(cls, text: str) -> KVEventsConfig:
        raw = json.loads(text)
        if not isinstance(raw, dict):
            raise ValueError("--kv-events-config must be a JSON object")
        known = {f.name for f in fields(cls)}
        unknown = set(raw) - known
        if unknown:
            raise ValueError(f"--kv-events-config: unknown fields {sorted(unknown)}")
        conf = cls(**raw)
        if conf.publisher is None:
            conf.publisher = "zmq" if conf.enable_kv_cache_events else "null"
        if conf.publisher not in ("zmq", "null"):
            raise ValueError(f"--kv-events-config: unknown publisher {conf.publisher!r}")
        return conf

    @property
    def active(self) -> bool:
        return self.enable_kv_cache_events and self.publisher == "zmq"


def int_block_hashes() -> bool:
    """vLLM publishes the low 64 bits of a block's digest as an int unless this is 0."""
    return os.environ.get("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", "1") != "0"


def _bind_or_connect(sock: zmq.Socket, endpoint: str, always_bind: bool = False) -> str:
    """vLLM binds wildcard, ipc and inproc endpoints and connects to the rest. The simulator
    also binds loopback hosts, so a local fleet listens on loopback only. Port 0 binds a free
    port; the endpoint actually bound is returned."""
    host = endpoint.split("://", 1)[-1].rsplit(":", 1)[0]
    bind = (
        always_bind
        or "*" in endpoint
        or "::" in endpoint
        or endpoint.startswith(("ipc://", "inproc://"))
        or host.startswith("127.")
        or host in ("localhost", "[::1]")
    )
    if not bind:
        sock.connect(endpoint)
        return endpoint
    sock.bind(endpoint)
    return sock.getsockopt_string(zmq.LAST_ENDPOINT) if endpoint.endswith(":0") else endpoint


class KVEventPublisher:
    """Collects a step's events as the cache changes and sends them as one batch.

    Runs on the engine's asyncio loop: the PUB socket never blocks (ZMQ drops past the
    high-water mark, as it does for vLLM), and replay requests are served by a task.
    """

    def __init__(
        self,
        config: KVEventsConfig,
        encoding: str = "map",
        block_size: int = 16,
        data_parallel_rank: int = 0,
    ) -> None:
        if encoding not in ENCODINGS:
            raise ValueError(f"encoding must be one of {ENCODINGS}")
        self.config = config
        self.encoding = encoding
        self.block_size = block_size
        self.rank = data_parallel_rank
        self._stored, self._removed, self._cleared = _TYPES[encoding]
        self._int_hashes = int_block_hashes()
        self._pending: list[Any] = []
        self._encoder = msgspec.msgpack.Encoder()
        self._topic = config.topic.encode()
        self._seq = count()
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=config.buffer_steps)
        self._ctx = zmq.asyncio.Context()
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.set_hwm(config.hwm)
        self.endpoint = _bind_or_connect(self._pub, config.endpoint)
        self._replay: zmq.asyncio.Socket | None = None
        self.replay_endpoint: str | None = None
        if config.replay_endpoint:
            self._replay = self._ctx.socket(zmq.ROUTER)
            # room for a whole replay and its end marker, however slowly it is read
            self._replay.setsockopt(zmq.SNDHWM, 2 * (config.buffer_steps + 1))
            self.replay_endpoint = _bind_or_connect(
                self._replay, config.replay_endpoint, always_bind=True
            )
        self._task = None
        self.published = 0  # batches
        self.published_events = 0
        self.replays = 0

    # -- events, made by the cache model --------------------------------------------------
    def external(self, h: int) -> int | bytes:
        """A block hash as vLLM publishes it: low 64 bits as an int, or the whole digest."""
        if self._int_hashes:
            return h & 0xFFFF_FFFF_FFFF_FFFF
        return h.to_bytes(16, "big")

    def stored(
        self,
        hashes: list[int],
        parent: int | None,
        token_ids: list[int],
        lora_id: int | None = None,
        lora_name: str | None = None,
        extra_keys: list[tuple[Any, ...] | None] | None = None,
        group_idx: int = 0,
        kind: str = "full_attention",
        window: int | None = None,
    ) -> None:
        ext = self.external
        self._pending.append(
            self._stored(
                block_hashes=[ext(h) for h in hashes],
                parent_block_hash=None if parent is None else ext(parent),
                token_ids=token_ids,
                block_size=self.block_size,
                lora_id=lora_id,
                medium=MEDIUM_GPU,
                lora_name=lora_name,
                extra_keys=extra_keys if extra_keys is not None else [None] * len(hashes),
                group_idx=group_idx,
                kv_cache_spec_kind=kind,
                kv_cache_spec_sliding_window=window,
            )
        )

    def offloaded(self, h: int) -> None:
        """A block stored in the CPU tier, as vLLM's OffloadingConnector reports it by default
        (kv_connector/v1/offloading/events.py: a placeholder, the block's hash and no tokens,
        block_size 0): a consumer places it by the hash of a GPU block it knows."""
        self._pending.append(
            self._stored(
                block_hashes=[self.external(h)], parent_block_hash=None, token_ids=[],
                block_size=0, lora_id=None, medium=MEDIUM_CPU, lora_name=None, group_idx=0,
            )
        )

    def removed(self, h: int, medium: str = MEDIUM_GPU, group_idx: int = 0) -> None:
        # vLLM sends one BlockRemoved per evicted block
        self._pending.append(
            self._removed(block_hashes=[self.external(h)], medium=medium, group_idx=group_idx)
        )

    def offload_evicted(self, h: int) -> None:
        self.removed(h, MEDIUM_CPU)

    def cleared(self) -> None:
        self._pending.append(self._cleared())

    # -- sending --------------------------------------------------------------------------
    def flush(self) -> None:
        """Send this step's events, if any, as one batch."""
        if not self._pending:
            return
        events, self._pending = self._pending, []
        batch = EventBatch(ts=time.time(), events=events, data_parallel_rank=self.rank)
        payload = self._encoder.encode(batch)
        seq = next(self._seq)
        # A PUB socket does not block: past the high-water mark ZMQ drops the message.
        self._pub.send_multipart((self._topic, seq.to_bytes(8, "big"), payload))
        self._buffer.append((seq, payload))
        self.published += 1
        self.published_events += len(events)

    def start(self) -> None:
        if self._replay is not None:
            self._task = asyncio.create_task(self._serve_replay(), name="kv-events-replay")

    async def _serve_replay(self) -> None:
        sock = self._replay
        assert sock is not None
        while True:
            frames = await sock.recv_multipart()
            if len(frames) != 3:
                log.warning("invalid replay request: %d frames", len(frames))
                continue
            client, _, start = frames
            first = int.from_bytes(start, "big")
            self.replays += 1
            with_topic = self.encoding == "map"
            for seq, payload in list(self._buffer):
                if seq >= first:
                    head = (client, b"", self._topic) if with_topic else (client, b"")
                    await sock.send_multipart((*head, seq.to_bytes(8, "big"), payload))
            end = (client, b"", b"", END_SEQ, b"") if with_topic else (client, b"", END_SEQ, b"")
            await sock.send_multipart(end)

    async def close(self) -> None:
        self.flush()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._pub.close(linger=0)
        if self._replay is not None:
            self._replay.close(linger=0)
        self._ctx.term()
