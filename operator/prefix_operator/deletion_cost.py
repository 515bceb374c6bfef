"""Pod deletion costs of a model's engines from the value of what only each holds. Pure.

The routers publish, per engine, the prefill tokens a second that would be recomputed if it
went (router fleet_value.py). The ReplicaSet controller, scaling down, removes the pods of
lowest `controller.kubernetes.io/pod-deletion-cost` first (after unscheduled, pending and
unready ones), so the engines are ranked coldest first and the ranks written as costs:
- rank-based: only the order matters to the controller, so a cost changes only where the
  order does (costs are kept wherever they already increase along the new order: the longest
  increasing run of them; the others are placed in the gaps);
- hysteresis: one engine passes another only when it is clearly hotter (by a factor and a
  floor), so values that jitter around each other write nothing;
- bounded: a token bucket caps the patches (a handful a minute), coldest first, since the
  cold end is what a scale-down reads.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

ANNOTATION = "controller.kubernetes.io/pod-deletion-cost"
STEP = 1000  # spacing of fresh costs: room for later insertions without renumbering
INT32_MAX = 2**31 - 1


@dataclass(frozen=True, slots=True)
class Engine:
    pod: str
    value: float  # tokens a second only it saves (0: nothing, or not published)
    cost: int | None  # its annotation now (None: none, or not an integer)


@dataclass(frozen=True, slots=True)
class Policy:
    hysteresis: float = 0.5  # a pod passes another only when this much hotter, relatively
    floor: float = 1.0  # ... and by this many tokens a second at least
    floor_share: float = 0.05  # ... or this share of the hottest engine's value


def parse_cost(raw: object) -> int | None:
    try:
        return int(str(raw))
    except (TypeError, ValueError):
        return None


def order(engines: Sequence[Engine], policy: Policy = Policy()) -> list[str]:
    """Pods coldest first. Starts from the order the costs say now (pods without one first:
    a new engine holds nothing yet) and moves a pod colder only past clearly hotter ones."""
    value = {e.pod: e.value for e in engines}
    floor = max(policy.floor, policy.floor_share * max(value.values(), default=0.0))

    def clearly_hotter(a: str, b: str) -> bool:
        return value[a] > value[b] * (1.0 + policy.hysteresis) + floor

    pods = [e.pod for e in sorted(engines, key=lambda e: (e.cost is not None, e.cost or 0,
                                                          e.pod))]
    for i in range(1, len(pods)):  # insertion sort under the sticky comparison
        j = i
        while j > 0 and clearly_hotter(pods[j - 1], pods[j]):
            pods[j - 1], pods[j] = pods[j], pods[j - 1]
            j -= 1
    return pods


def _kept(ranked: Sequence[str], current: Mapping[str, int | None]) -> set[str]:
    """The pods whose costs already increase along `ranked`: a longest such run."""
    costed = [(p, c) for p in ranked if (c := current.get(p)) is not None]
    tails: list[int] = []  # smallest tail cost of an increasing run of each length
    tail_at: list[int] = []  # index into costed of that tail
    parent: list[int] = [-1] * len(costed)
    for i, (_, cost) in enumerate(costed):
        k = bisect_left(tails, cost)
        if k == len(tails):
            tails.append(cost)
            tail_at.append(i)
        else:
            tails[k] = cost
            tail_at[k] = i
        parent[i] = tail_at[k - 1] if k else -1
    out: set[str] = set()
    i = tail_at[-1] if tail_at else -1
    while i >= 0:
        out.add(costed[i][0])
        i = parent[i]
    return out


def assign(ranked: Sequence[str], current: Mapping[str, int | None]) -> dict[str, int]:
    """A cost per pod, increasing along `ranked`, changing as few of the current ones as it
    can."""
    kept = _kept(ranked, current)
    out: dict[str, int] = {}
    run: list[str] = []
    low: int | None = None
    for pod in [*ranked, None]:
        if pod is not None and pod not in kept:
            run.append(pod)
            continue
        high = current[pod] if pod is not None else None
        placed = _between(low, high, len(run))
        if placed is None:  # no room between two kept costs: number them all afresh
            return {p: i * STEP for i, p in enumerate(ranked)}
        out.update(zip(run, placed, strict=True))
        run = []
        if pod is not None:
            out[pod] = low = current[pod]  # type: ignore[assignment]
    return out


def _between(low: int | None, high: int | None, k: int) -> list[int] | None:
    """k increasing integers strictly between low and high (either may be open)."""
    if k == 0:
        return []
    if low is None and high is None:
        return [i * STEP for i in range(k)]
    if low is None:
        assert high is not None
        return [high - (k - i) * STEP for i in range(k)]
    if high is None:
        out = [low + (i + 1) * STEP for i in range(k)]
        return out if out[-1] <= INT32_MAX else None
    if high - low <= k:
        return None
    return [low + (i + 1) * (high - low) // (k + 1) for i in range(k)]


@dataclass
class Budget:
    """A token bucket of patches: `per_minute` on average, `burst` at once."""

    per_minute: float
    burst: float
    tokens: float = -1.0  # full at the first look
    at: float | None = None

    def available(self, now: float) -> int:
        if self.at is None or self.tokens < 0:
            self.tokens = self.burst
        else:
            self.tokens = min(self.burst, self.tokens + (now - self.at) * self.per_minute / 60)
        self.at = now
        return int(self.tokens)

    def spend(self, n: int) -> None:
        self.tokens -= n


def plan(
    engines: Sequence[Engine], budget: int, policy: Policy = Policy()
) -> list[tuple[str, int]]:
    """The patches to write now, (pod, cost), coldest first, at most `budget` of them."""
    ranked = order(engines, policy)
    current = {e.pod: e.cost for e in engines}
    wanted = assign(ranked, current)
    changes = [(p, wanted[p]) for p in ranked if wanted[p] != current.get(p)]
    return changes[: max(budget, 0)]
