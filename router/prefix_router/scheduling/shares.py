"""Who is over its share of a saturated fleet: each tenant's recent service (the cost of what
the dispatch queue released for it, in prompt + expected decode tokens, decayed over `window_s`)
against its weight's share among the tenants active now (seen within 2 x `window_s`).

The queue keeps a reserve of engine slots free while a tenant under its share is active, and
releases an over-share tenant's request only beyond it (queue.py): what an under-share tenant
sends then finds a slot at once instead of waiting for the next to free. A tenant alone is
never over its share, so a fleet one tenant saturates keeps no slot idle. Pure: the caller
gives the time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# Tenants kept beyond those active: a flood of one-off tenants is pruned in amortised O(1).
_PRUNE_SLACK = 64


@dataclass(slots=True)
class _Tenant:
    weight: float
    service: float  # decayed cost, as of `at`
    at: float
    seen: float  # last arrival or release


class Shares:
    __slots__ = ("_prune_at", "_tenants", "window_s")

    def __init__(self, window_s: float = 5.0) -> None:
        self.window_s = window_s
        self._tenants: dict[str, _Tenant] = {}
        self._prune_at = _PRUNE_SLACK

    def seen(self, tenant: str, weight: float, now: float) -> None:
        """A request of `tenant` arrived (it is active, whether served yet or not)."""
        t = self._tenants.get(tenant)
        if t is None:
            self._tenants[tenant] = _Tenant(weight, 0.0, now, now)
            if len(self._tenants) > self._prune_at:
                self._prune(now)
            return
        t.weight = weight
        t.seen = max(t.seen, now)

    def served(self, tenant: str, cost: float, weight: float, now: float) -> None:
        """The queue released a request of `tenant` costing `cost`."""
        self.seen(tenant, weight, now)
        t = self._tenants[tenant]
        t.service = self._decayed(t, now) + cost
        t.at = now

    def over(self, tenant: str, now: float) -> bool:
        """Has `tenant` recently had more than its weight's share, while another tenant is
        active? (False for a tenant never seen: it has had nothing.)"""
        me = self._tenants.get(tenant)
        if me is None:
            return False
        active = 2 * self.window_s
        weights = service = 0.0
        others = False
        for name, t in self._tenants.items():
            if now - t.seen > active:
                continue
            weights += t.weight
            service += self._decayed(t, now)
            others = others or name != tenant
        if not others or service <= 0:
            return False
        return self._decayed(me, now) / service > me.weight / weights

    def __len__(self) -> int:
        return len(self._tenants)

    def _decayed(self, t: _Tenant, now: float) -> float:
        return t.service * math.exp(-max(now - t.at, 0.0) / self.window_s)

    def _prune(self, now: float) -> None:
        active = 2 * self.window_s
        self._tenants = {k: t for k, t in self._tenants.items() if now - t.seen <= active}
        self._prune_at = 2 * len(self._tenants) + _PRUNE_SLACK
