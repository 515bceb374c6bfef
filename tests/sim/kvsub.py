"""A minimal KV-event consumer for the tests, written from docs/kv-events.md: a SUB socket for
live batches, a DEALER socket for replay, gap detection by sequence number. Batches are decoded
with plain msgspec (no types), so the tests see the wire as any consumer would."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import msgspec
import zmq
import zmq.asyncio

END = (-1).to_bytes(8, "big", signed=True)


def event_type(ev: Any) -> str:
    """The tag of a decoded event, in either encoding."""
    return ev["type"] if isinstance(ev, dict) else ev[0]


def field_of(ev: Any, name: str, position: int) -> Any:
    if isinstance(ev, dict):
        return ev.get(name)
    return ev[position] if position < len(ev) else None


@dataclass
class Subscriber:
    endpoint: str
    replay_endpoint: str | None
    topic: bytes = b""
    last: int = -1
    batches: dict[int, Any] = field(default_factory=dict)  # seq -> decoded batch
    live: list[int] = field(default_factory=list)  # sequence numbers received live
    replayed: list[int] = field(default_factory=list)  # ... and through replay
    gaps: list[tuple[int, int]] = field(default_factory=list)  # (expected, received)

    def __post_init__(self) -> None:
        self.ctx = zmq.asyncio.Context()
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, self.topic)
        self.sub.connect(self.endpoint)

    def close(self) -> None:
        self.sub.close(linger=0)
        self.ctx.term()

    async def replay(self, start: int, timeout: float = 10.0) -> list[list[bytes]]:
        """Ask for every buffered batch from `start`; returns the replies (after the empty
        delimiter frame), the end marker excluded, and applies them."""
        assert self.replay_endpoint is not None
        dealer = self.ctx.socket(zmq.DEALER)
        dealer.connect(self.replay_endpoint)
        try:
            await dealer.send_multipart([b"", start.to_bytes(8, "big")])
            replies = []
            while True:
                frames = await asyncio.wait_for(dealer.recv_multipart(), timeout)
                assert frames[0] == b""
                frames = frames[1:]
                if frames[-2] == END and frames[-1] == b"":
                    break
                replies.append(frames)
                seq = int.from_bytes(frames[-2], "big")
                if seq > self.last:
                    self._apply(seq, frames[-1])
                    self.replayed.append(seq)
            return replies
        finally:
            dealer.close(linger=0)

    def _apply(self, seq: int, payload: bytes) -> None:
        self.batches[seq] = msgspec.msgpack.decode(payload)
        self.last = seq

    async def receive(self, timeout: float = 10.0) -> int | None:
        """One live message (filling any gap before it from the replay socket): its sequence
        number, or None if nothing came within `timeout`."""
        if not await self.sub.poll(timeout * 1000):
            return None
        topic, seq_bytes, payload = await self.sub.recv_multipart()
        assert topic.startswith(self.topic)
        seq = int.from_bytes(seq_bytes, "big")
        self.live.append(seq)
        if seq > self.last + 1:
            self.gaps.append((self.last + 1, seq))
            if self.replay_endpoint is not None:
                await self.replay(self.last + 1)
        if seq > self.last:
            self._apply(seq, payload)
        return seq

    async def sync(self) -> None:
        """Everything published so far, from the replay socket (the tests call this once the
        engine has flushed what they wait for)."""
        await self.replay(self.last + 1)

    def events(self) -> list[Any]:
        return [ev for seq in sorted(self.batches) for ev in self.batches[seq][1]]
