"""The ZMQ side of the engines' KV events: one SUB socket per engine, replay on a gap.

Each engine publishes on its own PUB socket, and a message does not say which socket it came
from, so each engine gets its own SUB socket and reader task; a DEALER asks its replay socket
for what was missed (docs/kv-events.md, "What a consumer must do"). Every router replica
subscribes to every engine: each builds the same index from the same events, with no write
to a shared store and no election of a consumer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from urllib.parse import urlsplit

import zmq
import zmq.asyncio

from ..config import EventSettings
from ..index import DEGRADED, EXACT
from ..index.events import EventsIndex
from ..metrics import EventStats, EventStream
from .feed import EngineFeed
from .wire import WireError, decode_batch

log = logging.getLogger("prefix_router.events")

_END = b"\xff" * 8  # the replay's end marker: sequence -1
_SLICE = 64  # replayed batches applied between two chances for requests to run


def _sequence(frame: bytes) -> tuple[int, bytes | None] | None:
    """A data message's sequence frame: 8 bytes, unsigned big-endian; with vLLM's snapshot
    service on (PR #57789, first revision), 24: the sequence, then the publisher's 16-byte
    lifetime id, which changes when the engine restarts. None: not a sequence frame."""
    if len(frame) == 8:
        return int.from_bytes(frame, "big"), None
    if len(frame) == 24:
        return int.from_bytes(frame[:8], "big"), frame[8:]
    return None


def endpoints(backend: str, s: EventSettings) -> tuple[str, str | None]:
    """(events endpoint, replay endpoint or None) of the engine serving at `backend`."""
    given = s.endpoints.get(backend)
    if given is not None:
        pub, _, replay = given.partition(",")
        return pub, replay or None
    u = urlsplit(backend)
    host = f"[{u.hostname}]" if u.hostname and ":" in u.hostname else u.hostname
    replay = f"tcp://{host}:{s.replay_port}" if s.replay_port else None
    return f"tcp://{host}:{s.port}", replay


class _Stream:
    def __init__(self, feed: EngineFeed, pub: str, replay: str | None) -> None:
        self.feed = feed
        self.pub = pub
        self.replay = replay
        self.task: asyncio.Task[None] | None = None
        # batches learned by replay when joining, which may also come live right after:
        # the same sequence number with the same bytes is that, not a restart
        self.replayed: dict[int, bytes] = {}
        self.joined = False  # the replay on joining was read (or could not be)
        # the index has every block the engine holds: joined, and no gap left unreplayed
        self.synced = False


class EventSubscriber:
    def __init__(
        self,
        s: EventSettings,
        index: EventsIndex,
        block_size: int,
        model_of: Callable[[str, str | None], str | None],
        on_reset: Callable[[str], None] = lambda backend: None,
        on_settled: Callable[[str, str, list[int]], None] = lambda backend, model, keys: None,
    ) -> None:
        self._s = s
        self._index = index
        self._block_size = block_size
        self._model_of = model_of
        self._on_reset = on_reset
        self._on_settled = on_settled  # (backend, model, own keys) stored or removed
        self._ctx = zmq.asyncio.Context()
        self._streams: dict[str, _Stream] = {}
        self.errors = 0  # batches that did not decode
        self.resets = 0  # times an engine's entries were dropped: restart, unrecoverable gap

    def feeds(self) -> list[EngineFeed]:
        return [st.feed for st in self._streams.values()]

    def stats(self) -> EventStats:
        """For /metrics: each engine's stream, decode errors, resets."""
        idx = self._index
        return [
            EventStream(b, st.feed.applied, st.feed.skipped, idx.held(b), idx.full_at(b))
            for b, st in self._streams.items()
        ], self.errors, self.resets

    def join(self, backend: str) -> None:
        if backend in self._streams:
            return
        pub, replay = endpoints(backend, self._s)
        feed = EngineFeed(backend, self._index, self._block_size,
                          lambda lora, b=backend: self._model_of(b, lora), self._emptied,
                          lambda model, keys, b=backend: self._on_settled(b, model, keys),
                          )  # fmt: skip
        stream = self._streams[backend] = _Stream(feed, pub, replay)
        stream.task = asyncio.get_running_loop().create_task(
            self._run(stream), name=f"kv-events {backend}"
        )
        log.info("listening to the KV events of %s at %s (replay %s)", backend, pub, replay)

    def state(self, backend: str) -> str:
        """EXACT while the engine's events are in sequence from its replay on, DEGRADED before
        that and while a gap is missing (index/__init__.py)."""
        stream = self._streams.get(backend)
        return EXACT if stream is not None and stream.synced else DEGRADED

    def warm(self) -> bool:
        """Every joined engine's replay was read: the index starts from the fleet's caches."""
        return all(st.joined for st in self._streams.values())

    def _emptied(self, backend: str) -> None:
        """The engine's cache is empty (cleared, restarted): the index knows it exactly."""
        stream = self._streams.get(backend)
        if stream is not None:
            stream.synced = True
        self._on_reset(backend)

    async def leave(self, backend: str) -> None:
        stream = self._streams.pop(backend, None)
        if stream is not None and stream.task is not None:
            stream.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await stream.task

    async def close(self) -> None:
        for backend in list(self._streams):
            await self.leave(backend)
        self._ctx.destroy(linger=0)

    async def _run(self, stream: _Stream) -> None:
        sub = self._ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.SUBSCRIBE, self._s.topic.encode())
        sub.connect(stream.pub)
        try:
            await self._join(stream)
            while True:
                frames = await sub.recv_multipart()
                got = _sequence(frames[1]) if len(frames) == 3 else None
                if got is None:
                    self.errors += 1
                    continue
                await self._take(stream, got[0], frames[2], got[1])
        finally:
            sub.close(linger=0)

    async def _join(self, stream: _Stream) -> None:
        """What the engine's replay buffer still holds, at once: the events of requests sent
        before this router listened (PUB/SUB drops what comes before a subscription takes),
        which an idle engine would otherwise never send again."""
        try:
            got = await self._replay(stream, 0, 2**63, partial=True)
            await self._apply_all(stream.feed, got or ())
            stream.replayed = dict(got or ())
            stream.synced = True
        finally:
            stream.joined = True

    async def _take(
        self, stream: _Stream, seq: int, payload: bytes, publisher: bytes | None = None
    ) -> None:
        feed = stream.feed
        state = feed.expects(seq, publisher)
        if stream.replayed:
            if stream.replayed.get(seq) == payload:
                return  # already applied from the replay
            if state != "restart":
                stream.replayed = {}
        if state == "restart":
            log.info("%s: event sequence went back to %d: the engine restarted", feed.backend, seq)
            self._reset(feed)
        elif state in ("gap", "first") and (state == "gap" or seq > 0):
            start = 0 if feed.last_seq is None else feed.last_seq + 1
            if state == "gap":
                stream.synced = False
            # on joining, whatever the buffer still holds is worth having; on a gap, only all
            missed = await self._replay(stream, start, seq, partial=state == "first")
            if missed is None and state == "gap":
                log.warning("%s: events %d..%d lost and not replayed: its entries dropped",
                            feed.backend, start, seq - 1)  # fmt: skip
                self._reset(feed)
                # what it stored meanwhile is not known until it empties (DEGRADED)
                stream.synced = False
            elif state == "gap":
                stream.synced = True
            await self._apply_all(feed, missed or ())
        self._apply(feed, seq, payload, publisher)

    async def _apply_all(self, feed: EngineFeed, batches: Sequence[tuple[int, bytes]]) -> None:
        """Replayed batches, in order, letting requests through every `_SLICE` of them: a
        replay buffer holds up to 10,000 batches (vLLM's default), and applying them in one go
        held the loop for every request meanwhile."""
        for i, (seq, payload) in enumerate(batches):
            self._apply(feed, seq, payload)
            if i % _SLICE == _SLICE - 1:
                await asyncio.sleep(0)

    def _apply(
        self, feed: EngineFeed, seq: int, payload: bytes, publisher: bytes | None = None
    ) -> None:
        try:
            batch = decode_batch(payload)
        except WireError as exc:
            self.errors += 1
            log.warning("%s: a KV-event batch that does not decode (%s)", feed.backend, exc)
            feed.last_seq = seq
            return
        ident = publisher or batch.publisher
        if ident is not None and feed.publisher is not None and ident != feed.publisher:
            log.info("%s: a new publisher id: the engine restarted", feed.backend)
            self._reset(feed)
        feed.apply(seq, batch, ident)

    def _reset(self, feed: EngineFeed) -> None:
        self.resets += 1
        feed.reset()
        feed.last_seq = None

    async def _replay(
        self, stream: _Stream, start: int, before: int, partial: bool = False
    ) -> list[tuple[int, bytes]] | None:
        """The batches start..before-1 from the engine's replay buffer, or None when it cannot
        give all of them (no replay socket, no answer in time, the buffer no longer reaches
        back that far). `partial`: the unbroken run that ends at before-1 will do."""
        if stream.replay is None:
            return None
        dealer = self._ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(stream.replay)
        got: list[tuple[int, bytes]] = []
        try:
            await dealer.send_multipart([b"", start.to_bytes(8, "big")])
            async with asyncio.timeout(self._s.replay_timeout_s):
                while True:
                    frames = await dealer.recv_multipart()
                    # [b"", seq, payload] (vLLM < 0.26) or [b"", topic, seq, payload]
                    seq_b, payload = frames[-2], frames[-1]
                    if seq_b == _END and not payload:
                        break
                    got_seq = _sequence(seq_b)
                    if got_seq is None:
                        continue
                    seq = got_seq[0]
                    if seq < before:
                        got.append((seq, payload))
        except TimeoutError:
            return None
        finally:
            dealer.close(linger=0)
        got.sort()
        if partial:
            # the unbroken run that ends with the newest batch received
            run = len(got) - 1
            while run > 0 and got[run - 1][0] == got[run][0] - 1:
                run -= 1
            return got[max(run, 0):]
        if [s for s, _ in got] != list(range(start, before)):
            return None
        return got
