"""What each engine alone holds, and who inherits it when the engine leaves. Pure (clock passed in).

An engine's value is the prefill it saves the fleet: every request whose longest match is on
one engine alone would recompute the blocks beyond the runner-up's match if that engine went.
Summed over a window, per engine, that is prefill tokens a second at risk: what the routers
publish (contract.EngineValues) and the operator turns into pod deletion costs, so a
scale-down removes the engine whose loss costs least.

The same observations remember, per engine, the chains it alone holds that were asked for
recently. When an engine leaves, each is handed to one successor, the next backend in
rendezvous order of the chain's first block (the picker's tie-break), so every router replica
sends a prefix's followers to the same engine instead of scattering them.
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from .scheduling.picker import rendezvous


@dataclass(frozen=True, slots=True)
class Exclusive:
    backend: str
    blocks: int  # leading blocks it holds beyond every other backend's match
    depth: int  # its whole match


def exclusive(matches: Mapping[str, int]) -> Exclusive | None:
    """The one backend whose match is strictly the longest, or None (a tie, or no match)."""
    best = second = 0
    who: str | None = None
    for name, depth in matches.items():
        if depth > best:
            best, second, who = depth, best, name
        elif depth > second:
            second = depth
    if who is None or best <= second:
        return None
    return Exclusive(who, best - second, best)


@dataclass(frozen=True, slots=True)
class Handoff:
    model: str
    chain: tuple[int, ...]
    successor: str


def successor(key: int, remaining: Sequence[str]) -> str | None:
    """The backend that inherits the prefix with first block `key`: rendezvous order."""
    return max(remaining, key=lambda name: rendezvous(key, name), default=None)


class FleetValue:
    def __init__(
        self,
        tokens_of: Callable[[int], float],
        window_s: float = 60.0,
        keep_s: float = 300.0,
        chains_per_backend: int = 512,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._tokens_of = tokens_of  # blocks -> engine tokens (sizing.py)
        self._window = window_s
        self._keep = keep_s
        self._max_chains = chains_per_backend
        self._clock = clock
        self._demand: dict[str, deque[tuple[float, float]]] = {}  # backend -> (t, tokens)
        # backend -> (model, first block) -> (last asked, the chain it alone holds)
        self._chains: dict[str, OrderedDict[tuple[str, int], tuple[float, tuple[int, ...]]]] = {}
        self._holder: dict[tuple[str, int], str] = {}  # (model, first block) -> its sole holder

    def observe(self, model: str, hashes: Sequence[int], matches: Mapping[str, int]) -> None:
        """A request for this chain, and each backend's match of it as the index answered."""
        if not hashes:
            return
        now = self._clock()
        root = (model, hashes[0])
        ex = exclusive(matches)
        before = self._holder.get(root)
        if before is not None and (ex is None or ex.backend != before):
            # someone else holds it as deep now, or only someone else: not `before`'s alone
            self._holder.pop(root, None)
            self._chains.get(before, OrderedDict()).pop(root, None)
        if ex is None:
            return
        demand = self._demand.setdefault(ex.backend, deque())
        demand.append((now, self._tokens_of(ex.blocks)))
        self._trim(demand, now)
        chains = self._chains.setdefault(ex.backend, OrderedDict())
        chains[root] = (now, tuple(hashes[: ex.depth]))
        chains.move_to_end(root)
        self._holder[root] = ex.backend
        while len(chains) > self._max_chains:
            old, _ = chains.popitem(last=False)
            self._holder.pop(old, None)

    def _trim(self, demand: deque[tuple[float, float]], now: float) -> None:
        cutoff = now - self._window
        while demand and demand[0][0] < cutoff:
            demand.popleft()

    def values(self) -> dict[str, float]:
        """Per backend, prefill tokens a second that would be recomputed if it went."""
        now = self._clock()
        out: dict[str, float] = {}
        for name, demand in self._demand.items():
            self._trim(demand, now)
            out[name] = sum(t for _, t in demand) / self._window
        return out

    def handoff(self, backend: str, remaining: Callable[[str], Sequence[str]]) -> list[Handoff]:
        """Who inherits each chain `backend` alone held and was asked for within keep_s:
        `remaining(model)` names the backends that stay for that model."""
        cutoff = self._clock() - self._keep
        out: list[Handoff] = []
        for (model, key), (seen, chain) in (self._chains.get(backend) or {}).items():
            if seen < cutoff:
                continue
            heir = successor(key, [n for n in remaining(model) if n != backend])
            if heir is not None:
                out.append(Handoff(model, chain, heir))
        return out

    def forget(self, backend: str) -> None:
        """The backend is gone: nothing of it is worth anything any more."""
        self._demand.pop(backend, None)
        for root in self._chains.pop(backend, {}):
            if self._holder.get(root) == backend:
                del self._holder[root]
