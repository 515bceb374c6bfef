"""What a prefix hit is worth and what it needs beyond vLLM's GPU cache. Pure.

Tiers: an engine with KV offloading (vLLM's OffloadingConnector, LMCache) publishes the blocks
it holds in a lower tier (medium "CPU", "STORAGE", ...) besides those in its GPU block pool.
vLLM uses its GPU prefix hit first, then loads from the lower tier the blocks that follow it
there (the connector's lookup starts where the GPU hit ends). So a backend's match for a chain
is its leading GPU blocks, then the run of blocks after them that a lower tier holds; a lower
tier block saves its prefill minus its load, `1 - cost` of a GPU hit, `cost` being the load of
a token from that tier in prefill tokens (RouterSettings.events.tier_costs). A medium without a
cost is not counted (GPU-only scoring: `tier_costs: {}`).

Hybrid models: vLLM keeps one KV-cache group per layer type, each with its own blocks under
the same block hashes (the hash's inputs do not depend on the group). vLLM's hit of n blocks
needs the full-attention groups to hold all n; a sliding-window group of window W tokens only
the last ceil((W - 1) / B) blocks before the hit point (SlidingWindowManager); a Mamba group
the state at the hit point, its block n - 1. The longest n for which every group holds what it
needs is the hit.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

GPU = "GPU"
# kv_cache_spec_kind values (vLLM's KVCacheSpecKind) by what a hit needs of the group
FULL_KINDS = frozenset({"full_attention", "mla_attention", "sink_full_attention"})
# (chunked local attention has a rule of its own, not modelled: its group is not counted)
WINDOW_KINDS = frozenset({"sliding_window", "sliding_window_mla"})
STATE_KINDS = frozenset({"mamba"})


@dataclass(frozen=True, slots=True)
class GroupNeed:
    """What a hit of n blocks needs of one group that is not full attention: its blocks
    n - tail .. n - 1."""

    tail: int


def need_of(kind: str | None, window: int | None, block_size: int) -> GroupNeed | None:
    """The need of a group of this kind; None for a full-attention group (it needs every
    block: the main table) or a kind with no model here."""
    if kind in WINDOW_KINDS and window and block_size > 0:
        return GroupNeed(max(1, -(-(window - 1) // block_size)))
    if kind in STATE_KINDS:
        return GroupNeed(1)
    return None


class Residency:
    """Which backends hold which blocks (the router's keys), per model: one lower tier, or one
    KV-cache group, of every engine."""

    __slots__ = ("_models",)

    def __init__(self) -> None:
        self._models: dict[str, dict[int, set[str]]] = {}

    def add(self, model: str, keys: Iterable[int], backend: str) -> None:
        m = self._models.setdefault(model, {})
        for k in keys:
            owners = m.get(k)
            if owners is None:
                m[k] = {backend}
            else:
                owners.add(backend)

    def remove(self, model: str, keys: Iterable[int], backend: str) -> None:
        m = self._models.get(model)
        if m is None:
            return
        for k in keys:
            owners = m.get(k)
            if owners is not None:
                owners.discard(backend)
                if not owners:
                    del m[k]

    def holds(self, model: str, key: int, backend: str) -> bool:
        owners = self._models.get(model, {}).get(key)
        return owners is not None and backend in owners

    def run(self, model: str, hashes: Sequence[int], start: int, backend: str) -> int:
        """How many blocks from `start` on this backend holds, without a gap."""
        m = self._models.get(model)
        if m is None:
            return 0
        i = start
        while i < len(hashes):
            owners = m.get(hashes[i])
            if owners is None or backend not in owners:
                break
            i += 1
        return i - start

    def drop_backend(self, backend: str) -> None:
        for model, m in self._models.items():
            self.remove(model, [k for k, owners in m.items() if backend in owners], backend)

    def blocks(self, backend: str) -> int:
        return sum(1 for m in self._models.values() for o in m.values() if backend in o)


def hybrid_hit(
    hashes: Sequence[int], full: int, groups: Sequence[tuple[GroupNeed, Residency]],
    model: str, backend: str,
) -> int:
    """The longest hit n <= `full` (the leading blocks the full-attention groups hold) for
    which every other group holds what a hit of n needs: one pass over the chain a group."""
    ok = [True] * (full + 1)  # ok[n]: a hit of n blocks has what every group needs
    for need, res in groups:
        run = 0  # blocks held without a gap, up to block i
        for i in range(full):
            run = run + 1 if res.holds(model, hashes[i], backend) else 0
            if run < min(need.tail, i + 1):
                ok[i + 1] = False
    return next((n for n in range(full, 0, -1) if ok[n]), 0)


def tier_run(
    hashes: Sequence[int], start: int, tiers: Sequence[tuple[float, Residency]], model: str,
    backend: str,
) -> float:
    """Prefill saved, in GPU-hit blocks, by the blocks from `start` (the end of the GPU hit)
    on that lower tiers hold without a gap: each block at its cheapest tier's `1 - cost`.
    `tiers`: (cost, residency), cheapest first."""
    saved = 0.0
    for i in range(start, len(hashes)):
        key = hashes[i]
        for cost, res in tiers:
            if res.holds(model, key, backend):
                saved += max(0.0, 1.0 - cost)
                break
        else:
            break
    return saved
