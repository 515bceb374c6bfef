"""The dispatch queue: where a request waits while every engine for it is saturated, so that it
is bound to an engine only when one has room (late binding: scored where its prefix is then).

  admit(...)   room among its engines and nobody waiting: a Pass at once (no ticket, no
               classification: an unsaturated fleet never meets the queue), unless every
               engine holding its prefix is saturated: then it waits for them as a ticket,
               as below. Otherwise the request is classified (bands.py) and waits as a
               ticket; with no room anywhere a sheddable band, or a full queue (requests or
               bytes), is refused at once with 429.
  pump()       on every release of load (an attempt's first byte and its end), on an engine's
               scrape and on each arrival: while the next ticket's engines have room, it is
               released. The next ticket: the highest band waiting, in it the smallest start
               tag (fairness.py). With a `reserve`, the last free slots are kept while a
               band above the next ticket's is active, or a tenant under its share
               (shares.py): its next request finds a slot at once, not after one frees.
               A ticket whose prefix engines hold goes only to one of them, until
               `owner_wait_s` after it became the next in line; a slot that frees elsewhere
               goes meanwhile to the first ticket behind it that may take it. Those engines
               are read when the ticket is considered for a free slot, not when it arrived
               (a prefix placed elsewhere while it waited is followed): a read in flight
               holds the pump, and its answer stands until load next moves.
  Pass.bound() the released request is routed, its Attempt starts in the same step: until
               then it counts as `launching`, so one release of load lets one request
               through, not all of them.
  sweep()      tickets past their band's budget get 429 with Retry-After (a timer, at the
               earliest deadline).
  drain()      the router is going away: every ticket gets 503 with Retry-After (another
               replica can take it), and nothing queues any more.
A client that goes away while its ticket waits is cancelled (handler cancellation): the ticket
leaves at once, and a release it was given goes to the next one.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..backends import Backend
from ..config import QueueSettings
from ..errors import RequestError
from .bands import Class, Classifier
from .fairness import Entry, FairQueue
from .saturation import Saturation
from .shares import Shares

# Counted in metrics as (decision, reason): queued/released/refused and why.
Report = Callable[[str, str, int], None]


@dataclass(slots=True)
class Ticket:
    cls: Class
    size: int  # bytes held (the body)
    arrived: float
    deadline: float
    candidates: Callable[[], Sequence[str]]
    future: asyncio.Future[None]
    entry: Entry[Ticket] | None = None
    queued: bool = True
    # the engines holding its longest prefix, asked when a slot is there for it: it goes
    # only to one of them until `owner_wait_s` after it has become the next in line (inf:
    # not yet). None: it waits for no engine in particular.
    ask_owners: Callable[[], Awaitable[Sequence[str]]] | None = None
    owners: Sequence[str] = ()
    read_at: int = -1  # the queue's epoch when `owners` was read (-1: never)
    owners_until: float = math.inf
    spare: bool = False  # released beyond the reserve: it must leave the reserved slots


@dataclass(slots=True)
class Pass:
    """Leave to route one request; `bound()` once its load counts (always: finally)."""

    queue: DispatchQueue | None
    waited: float = 0.0  # seconds in the queue
    spare: bool = False  # it must leave the reserve's slots free (with_room)

    def bound(self) -> None:
        q, self.queue = self.queue, None
        if q is not None:
            q.launched()


@dataclass(slots=True)
class _Band:
    fair: FairQueue[Ticket] = field(default_factory=FairQueue)
    arrivals: deque[Ticket] = field(default_factory=deque)  # deadline order


class DispatchQueue:
    def __init__(
        self,
        settings: QueueSettings,
        classifier: Classifier,
        saturation: Saturation,
        inflight: Callable[[str], float],
        report: Report | None = None,
        clock: Callable[[], float] = time.monotonic,
        pending: Callable[[str], float] = lambda _backend: 0.0,
    ) -> None:
        self._s = settings
        self.classifier = classifier
        self.saturation = saturation
        self._inflight = inflight
        self._pending = pending  # prefill tokens sent to an engine, not yet answered
        self._report = report or (lambda decision, reason, band: None)
        self._clock = clock
        self._bands = [_Band() for _ in settings.bands]
        self._budgets = [b.budget_s for b in settings.bands]
        self._sheddable = [b.sheddable for b in settings.bands]
        self._reserve = settings.reserve
        self.shares = Shares()
        self._band_seen = [-math.inf] * len(settings.bands)  # each band's last arrival
        self.queued = 0
        self.bytes = 0
        self.launching = 0  # released (or passed), not yet bound to an engine
        self.draining = False
        # moves with every change of load (a pump from outside): an owners' reading of an
        # older epoch is read again before it decides a release
        self._epoch = 0
        self._reading: asyncio.Task[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._due = math.inf
        # releases a second (decayed), for Retry-After
        self._rate = 0.0
        self._rate_at = clock()

    # ------------------------------------------------------------------ admission

    def room(self, candidates: Sequence[str]) -> bool:
        if not self._s.enabled:
            return True
        return self.free(candidates) > 0

    def free(self, candidates: Sequence[str]) -> int:
        """Requests the engines could take now, those released but not yet bound counted."""
        return self.saturation.room(candidates, self._inflight) - self.launching

    def with_room(self, backends: Sequence[Backend], spare: bool = False) -> Sequence[Backend]:
        """Of `backends`, those not saturated (all of them when none has room: a release
        raced a new arrival): a request is bound where it can run now. `spare`: it was
        released beyond the reserve, which is kept on the quietest engines (fewest in
        flight, least prefill pending): it goes elsewhere when it can, so the request the
        reserve is for meets no prefill of its in the engine's step."""
        if not self._s.enabled:
            return backends
        sat, inflight = self.saturation, self._inflight
        rooms = [(b, sat.room((b.url,), inflight)) for b in backends]
        out = [(b, r) for b, r in rooms if r > 0]
        if spare and self._reserve and len(out) > 1:
            out.sort(key=lambda br: (inflight(br[0].url), self._pending(br[0].url)))
            kept = i = 0
            while i < len(out) and kept < self._reserve:
                kept += out[i][1]
                i += 1
            out = out[i:] or out
        return [b for b, _ in out] if out and len(out) < len(backends) else backends

    async def admit(
        self,
        candidates: Callable[[], Sequence[str]],
        headers: Mapping[str, str],
        prompt_tokens: float,
        body: Mapping[str, Any],
        size: int,
        now: Sequence[str] | None = None,
        owners: Callable[[], Awaitable[Sequence[str]]] | None = None,
    ) -> Pass:
        """`now`: the candidates as the caller has just found them (else `candidates()`);
        `owners`: the engines holding the request's longest prefix: asked at once only if
        some engine is saturated while others have room, else while it waits, each time a
        slot is there for it."""
        cands = candidates() if now is None else now
        held: Sequence[str] = ()
        cls: Class | None = None
        room = self.room(cands)
        if room and not self.queued:
            if owners is None or self._s.owner_wait_s <= 0 or not self._some_full(cands):
                self.launching += 1
                return Pass(self)
            held = await owners()
            alive = [b for b in held if b in cands]
            if not alive or self.free(alive) > 0 or self.draining or self._full(size):
                self.launching += 1
                return Pass(self)
            cls = self.classifier.classify(headers, prompt_tokens, body)
            if self._reserve and self._reserved_for(cls):
                # a request the reserve is kept for starts at once, where there is room
                # (its wait is what the reserve spares it)
                self.launching += 1
                return Pass(self)
            # Its prefix's engines are all full while others have room: it waits for them
            # (up to `owner_wait_s`) rather than computing the prefix again elsewhere at
            # once. Sent on, three routers on llama-servers scattered every hot prompt
            # over the fleet (bench/results/real-engine-routers/).
            reason = "owners_full"
        elif room:
            if self.draining or self._full(size):
                self.launching += 1
                return Pass(self)
            reason = "behind"  # others wait for their engines: in line, released at once if it may
        else:
            reason = "saturated"
        if cls is None:
            cls = self.classifier.classify(headers, prompt_tokens, body)
        if reason == "saturated":
            if self.draining:
                self._report("refused", "draining", cls.band)
                raise RequestError(503, "the router is shutting down: retry", retry_after=1)
            if self._sheddable[cls.band]:
                self._report("refused", "shed", cls.band)
                raise self._too_many(
                    "the fleet is saturated and this request's band is sheddable")
            if self.queued >= self._s.max_requests:
                self._report("refused", "full_requests", cls.band)
                raise self._too_many("the router's queue is full")
            if self._full(size):
                self._report("refused", "full_bytes", cls.band)
                raise self._too_many("the router's queue is full")
        now_t = self._clock()
        self.shares.seen(cls.tenant, cls.weight, now_t)
        self._band_seen[cls.band] = now_t
        loop = asyncio.get_running_loop()
        ask = owners if self._s.owner_wait_s > 0 else None
        t = Ticket(cls, size, now_t, now_t + self._budgets[cls.band], candidates,
                   loop.create_future(), ask_owners=ask)  # fmt: skip
        if reason == "owners_full":
            t.owners, t.read_at = held, self._epoch  # just read: good until load moves
        self._push(t)
        self._report("queued", reason, cls.band)
        self.pump()
        try:
            await t.future
        except asyncio.CancelledError:
            if t.queued:
                self._remove(t)
                self._report("refused", "client_gone", cls.band)
            elif t.future.done() and not t.future.cancelled() and t.future.exception() is None:
                self.launched()  # released, then the client left: the next one goes
            raise
        return Pass(self, self._clock() - t.arrived, t.spare)

    def _some_full(self, candidates: Sequence[str]) -> bool:
        sat, inflight = self.saturation, self._inflight
        return any(sat.room((b,), inflight) <= 0 for b in candidates)

    def _full(self, size: int) -> bool:
        """No room in the queue for one more request of `size` bytes."""
        return self.queued >= self._s.max_requests or self.bytes + size > self._s.max_bytes

    def launched(self) -> None:
        self.launching -= 1
        if self.queued:
            # on the loop's next turn: its Attempt has counted its load by then (or none
            # started, and the slot goes to the next)
            asyncio.get_running_loop().call_soon(self.pump)

    # ------------------------------------------------------------------ release

    def pump(self) -> None:
        """Release tickets while the next one's engines have room (load has moved: what
        was read of their prefixes' engines is read again)."""
        self._epoch += 1
        self._release()

    def _release(self) -> None:
        while self.queued and self._reading is None:
            t = self._next()
            if t is None:
                return
            self._take(t)
            t.spare = self._reserve > 0 and not self._may_take_reserve(t)
            self.launching += 1
            self._count_release()
            self.shares.served(t.cls.tenant, t.cls.cost, t.cls.weight, self._clock())
            self._report("released", "room", t.cls.band)
            t.future.set_result(None)

    def _may_take_reserve(self, t: Ticket) -> bool:
        return self._reserved_for(t.cls)

    def _reserved_for(self, cls: Class) -> bool:
        """Not while a band above the class's is active (it arrived within the shares'
        activity window), nor while its tenant is over its share of an active fleet."""
        now = self._clock()
        active = now - 2 * self.shares.window_s
        if any(seen >= active for seen in self._band_seen[:cls.band]):
            return False
        return not self.shares.over(cls.tenant, now)

    def _next(self) -> Ticket | None:
        """The ticket to release now, if any: the highest band's next (a lower band never
        passes a band above it). A head that waits for the engines holding its prefix lets
        the next ones in its band go where they can run meanwhile."""
        now = self._clock()
        for band in self._bands:
            e = band.fair.peek()
            if e is None:
                continue
            head = e.item
            if head.ask_owners is not None and head.owners_until == math.inf:
                # next in line: its wait for its engines starts, and ends even if no load is
                # released meanwhile
                head.owners_until = now + self._s.owner_wait_s
                asyncio.get_running_loop().call_later(self._s.owner_wait_s, self.pump)
            go = self._releasable(head, now)
            if go is None:
                return head
            if go is False and self._reserved_for_another(head, band.fair, now):
                return self._past_the_reserve(head, band.fair, now)
            if go and self._stale(head, now):
                self._read([head])
                return None
            if go and head.owners:  # only its owners are full: look past it
                later = [x.item for x in band.fair.first(_LOOKAHEAD)[1:]]
                stale = [x for x in later if self._stale(x, now)]
                if stale:  # read together with the head's: one answer decides them all
                    self._read([head, *stale])
                    return None
                for t in later:
                    if self._releasable(t, now) is None:
                        return t
            return None
        return None

    def _reserved_for_another(self, head: Ticket, fq: FairQueue[Ticket], now: float) -> bool:
        """Is the only room the reserve, which the head may not take and another tenant
        waiting in its band may?"""
        try:
            free = self.free(head.candidates())
        except RequestError:
            return False
        if not 0 < free <= self._reserve:
            return False
        active = now - 2 * self.shares.window_s
        if any(seen >= active for seen in self._band_seen[: head.cls.band]):
            return False  # kept for a band above: nobody in this one takes it
        return any(tenant != head.cls.tenant and not self.shares.over(tenant, now)
                   for tenant in fq.waiting_tenants())  # fmt: skip

    def _past_the_reserve(self, head: Ticket, fq: FairQueue[Ticket], now: float) -> Ticket | None:
        """The first ticket behind the head that may take the reserve: an under-share
        tenant's request whose fair turn is after a busy tenant's head is the one the
        reserve is kept for (without this it would wait for a slot beyond the reserve)."""
        for x in fq.first(_LOOKAHEAD)[1:]:
            t = x.item
            if t.cls.tenant == head.cls.tenant or not self._may_take_reserve(t):
                continue
            go = self._releasable(t, now)
            if go is None:
                return t
            if go and self._stale(t, now):
                self._read([t])
                return None
        return None

    def _releasable(self, t: Ticket, now: float) -> bool | None:
        """None: `t` may go now; True: the fleet has room, not (or not yet known) the
        engines it waits for; False: no room for it."""
        try:
            candidates = t.candidates()
        except RequestError:
            return None  # no engine at all: released, its routing says why
        free = self.free(candidates)
        if free <= 0 or (free <= self._reserve and not self._may_take_reserve(t)):
            return False
        if self._stale(t, now):
            return True
        if t.owners and now < t.owners_until:
            alive = [b for b in t.owners if b in candidates]
            if alive and self.free(alive) <= 0:
                return True
        return None

    def _stale(self, t: Ticket, now: float) -> bool:
        """Would `t` wait for its prefix's engines, as last read before load last moved?"""
        return t.ask_owners is not None and now < t.owners_until and t.read_at != self._epoch

    def _read(self, tickets: list[Ticket]) -> None:
        """Ask where each ticket's prefix is now; the pump waits for the answer (one index
        round trip), so no slot is given away on an old one meanwhile."""

        async def read() -> None:
            try:
                got = await asyncio.gather(*(_ask(t) for t in tickets), return_exceptions=True)
            finally:
                self._reading = None
            for t, owners in zip(tickets, got, strict=True):
                # an index that cannot answer: the request goes wherever there is room
                t.owners = () if isinstance(owners, BaseException) else owners
                t.read_at = self._epoch  # as of now: stands until load moves again
            self._release()

        self._reading = asyncio.get_running_loop().create_task(read())

    # ------------------------------------------------------------------ deadlines, drain

    def sweep(self) -> None:
        """Refuse the tickets past their budget; set the timer for the next deadline."""
        self._timer = None
        self._due = math.inf
        now = self._clock()
        for i, band in enumerate(self._bands):
            q = band.arrivals
            while q and (not q[0].queued or q[0].deadline <= now):
                t = q.popleft()
                if not t.queued:
                    continue
                self._remove(t)
                self._report("refused", "deadline", i)
                waited = now - t.arrived
                t.future.set_exception(self._too_many(
                    f"the fleet is saturated: no engine had room within {waited:.3g}s"))
        self._arm()

    def drain(self) -> None:
        self.draining = True
        for i, band in enumerate(self._bands):
            while band.arrivals:
                t = band.arrivals.popleft()
                if not t.queued:
                    continue
                self._remove(t)
                self._report("refused", "draining", i)
                t.future.set_exception(
                    RequestError(503, "the router is shutting down: retry", retry_after=1))
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _arm(self) -> None:
        due = min((b.arrivals[0].deadline for b in self._bands if b.arrivals), default=math.inf)
        if due >= self._due:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._due = due
        delay = max(due - self._clock(), 0.0)
        self._timer = asyncio.get_running_loop().call_later(delay, self.sweep)

    # ------------------------------------------------------------------ figures

    def demand(self) -> tuple[int, float]:
        """(requests waiting, seconds the oldest has waited)."""
        now = self._clock()
        oldest = 0.0
        for band in self._bands:
            for t in band.arrivals:  # the first live one is the band's oldest
                if t.queued:
                    oldest = max(oldest, now - t.arrived)
                    break
        return self.queued, oldest

    def retry_after(self) -> int:
        """Seconds until the queue ahead has likely gone, at the recent release rate."""
        rate = self._decayed_rate()
        budget = max(self._budgets)
        if rate <= 0:
            return max(1, math.ceil(budget))
        return max(1, min(math.ceil(self.queued / rate), math.ceil(budget)))

    # ------------------------------------------------------------------ internals

    def _too_many(self, why: str) -> RequestError:
        return RequestError(429, why, code="saturated", retry_after=self.retry_after())

    def _push(self, t: Ticket) -> None:
        band = self._bands[t.cls.band]
        t.entry = band.fair.push(t, t.cls.tenant, t.cls.cost, t.cls.weight)
        band.arrivals.append(t)
        self.queued += 1
        self.bytes += t.size
        if t.deadline < self._due:
            self._arm()

    def _take(self, t: Ticket) -> None:
        band = self._bands[t.cls.band]
        assert t.entry is not None
        band.fair.take(t.entry)
        self._left(t)
        # the arrivals deque keeps it until the sweep passes (a flag, no O(n) removal), but
        # a band whose head is gone is trimmed here so the oldest wait stays cheap
        q = band.arrivals
        while q and not q[0].queued:
            q.popleft()
        if len(q) > 2 * len(band.fair) + 64:
            band.arrivals = deque(x for x in q if x.queued)

    def _remove(self, t: Ticket) -> None:
        if t.entry is not None:
            self._bands[t.cls.band].fair.remove(t.entry)
        self._left(t)

    def _left(self, t: Ticket) -> None:
        t.queued = False
        self.queued -= 1
        self.bytes -= t.size

    def _count_release(self) -> None:
        now = self._clock()
        self._rate = self._decayed_rate(now) + 1.0 / _RATE_WINDOW_S
        self._rate_at = now

    def _decayed_rate(self, now: float | None = None) -> float:
        now = self._clock() if now is None else now
        return self._rate * math.exp(-(now - self._rate_at) / _RATE_WINDOW_S)


async def _ask(t: Ticket) -> Sequence[str]:
    return await t.ask_owners() if t.ask_owners is not None else ()


_RATE_WINDOW_S = 5.0
# Tickets looked at past a head that waits for its prefix's engines (per pump).
_LOOKAHEAD = 32
