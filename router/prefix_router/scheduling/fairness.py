"""Fair share between tenants: start-time fair queuing (Goyal, Vin and Cheng's SFQ), in tokens.

Each queued request gets a start tag S = max(V, F[tenant]) and its tenant's finish tag moves to
F[tenant] = S + cost / weight; the request with the smallest start tag goes first, and the
virtual time V becomes that start tag. A tenant sending ten times its share only pushes its own
tags ahead: a quiet tenant's next request starts at V and goes before the busy one's backlog
(a tie of start tags goes to the tenant with fewer waiting, then to the earlier arrival). The
cost is the request's prompt tokens plus its expected decode, so a tenant of long prompts gets
fewer requests through, not more tokens. Pure: no clock, no I/O.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")

# Idle tenants' finish tags are dropped once they stop mattering (F <= V), and only when there
# are this many more tags than tenants waiting: a flood of one-off tenants stays bounded.
_PRUNE_SLACK = 64


@dataclass(slots=True, order=True)
class Entry(Generic[T]):
    start: float
    depth: int  # its tenant's requests already waiting when it came: ties go to the lighter
    seq: int
    finish: float = field(compare=False)
    tenant: str = field(compare=False)
    item: T = field(compare=False)
    live: bool = field(default=True, compare=False)


class FairQueue(Generic[T]):
    __slots__ = ("_dead", "_finish", "_heap", "_prune_at", "_seq", "_waiting", "virtual")

    def __init__(self) -> None:
        self._heap: list[Entry[T]] = []
        self._finish: dict[str, float] = {}
        self._waiting: dict[str, int] = {}  # tenant -> entries queued
        self._seq = 0
        self._dead = 0  # removed entries still in the heap
        self._prune_at = _PRUNE_SLACK
        self.virtual = 0.0

    def __len__(self) -> int:
        return len(self._heap) - self._dead

    def push(self, item: T, tenant: str, cost: float, weight: float = 1.0) -> Entry[T]:
        start = max(self.virtual, self._finish.get(tenant, 0.0))
        finish = start + max(cost, 1.0) / weight
        self._finish[tenant] = finish
        depth = self._waiting.get(tenant, 0)
        self._waiting[tenant] = depth + 1
        self._seq += 1
        e = Entry(start, depth, self._seq, finish, tenant, item)
        heapq.heappush(self._heap, e)
        return e

    def peek(self) -> Entry[T] | None:
        h = self._heap
        while h and not h[0].live:
            heapq.heappop(h)
            self._dead -= 1
        return h[0] if h else None

    def pop(self) -> T | None:
        e = self.peek()
        if e is None:
            return None
        heapq.heappop(self._heap)
        e.live = False
        self.virtual = max(self.virtual, e.start)
        self._left(e.tenant)
        return e.item

    def first(self, n: int) -> list[Entry[T]]:
        """The next `n` entries in their order of release (O(len) a call: for the rare
        look past a head that must wait)."""
        return heapq.nsmallest(n, (e for e in self._heap if e.live))

    def take(self, e: Entry[T]) -> T:
        """`e` out of the queue ahead of its turn (those before it must wait): served as if
        its turn, so later arrivals start no earlier than it did."""
        if e is self.peek():
            item = self.pop()
            assert item is e.item
            return item
        self.remove(e)
        if self._finish.get(e.tenant) == e.start:  # remove() gave the charge back
            self._finish[e.tenant] = e.finish
        self.virtual = max(self.virtual, e.start)
        return e.item

    def remove(self, e: Entry[T]) -> None:
        """Out of the queue before its turn (deadline, client gone): its tenant is charged
        only if others came after it."""
        if not e.live:
            return
        e.live = False
        self._dead += 1
        if self._finish.get(e.tenant) == e.finish:
            self._finish[e.tenant] = e.start
        self._left(e.tenant)
        if self._dead > 64 and self._dead * 2 > len(self._heap):
            self._heap = [x for x in self._heap if x.live]
            heapq.heapify(self._heap)
            self._dead = 0

    def _left(self, tenant: str) -> None:
        n = self._waiting[tenant] - 1
        if n:
            self._waiting[tenant] = n
            return
        del self._waiting[tenant]
        if not self._waiting:
            # the end of a busy period: every tag is behind the next arrival's start
            self.virtual = max(self.virtual, *self._finish.values())
            self._finish.clear()
            self._prune_at = _PRUNE_SLACK
        elif len(self._finish) > self._prune_at:
            v = self.virtual
            self._finish = {
                t: f for t, f in self._finish.items() if f > v or t in self._waiting
            }
            self._prune_at = 2 * len(self._finish) + _PRUNE_SLACK  # amortised: O(1) a call

    def waiting_tenants(self) -> list[str]:
        """The tenants with entries queued."""
        return list(self._waiting)

    def tenants(self) -> int:
        """Tenants whose finish tag is kept (for the bound on memory)."""
        return len(self._finish)
