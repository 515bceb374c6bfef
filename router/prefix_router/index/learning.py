"""What an engine really holds, learned from the cached tokens it reports. Pure.

An answer that reports `cached_tokens` says how many leading blocks of its prompt the engine
held, against the `predicted` ones the index matched there:
- held > predicted: the index had dropped blocks the engine still held. When the index's
  model of that backend is full, the engine's capacity is larger than configured: the model
  grows a step (bounded), so the index forgets less of what the engine keeps.
- held < predicted: counted as a correction, and nothing more is inferred. The engine holds
  the chain again once it has computed it; what the miss says of the engine's OTHER prefixes
  depends on how it evicts, and reading it as "every prefix unused for as long is gone too"
  (a keep time learned from the miss's age) lowered the hit rate on llama-server's slots and
  whole-prompt cache, and in five of seven drift cases on the simulator
  (bench/results/real-engine/causes.md): it was measured and removed.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

GROW = 1.1  # capacity scale per under-prediction
MAX_SCALE = 4.0  # never more than this many times the configured capacity


@dataclass(slots=True)
class EngineCache:
    scale: float = 1.0  # its capacity against the configured one

    def observe(self, predicted: int, held: int, full: bool) -> bool:
        """One answer's evidence (`full`: the index's model of the backend is at its
        capacity); True when the estimate changed."""
        if held > predicted and full and self.scale < MAX_SCALE:
            self.scale = min(self.scale * GROW, MAX_SCALE)
            return True
        return False


class CapacityModel:
    """Each backend's KV capacity in router blocks: the configured tokens over the block size
    (sizing.py), scaled per backend by what its answers taught (`EngineCache`). One model for
    the local table and the shared one (redis/capacity.py), so they cannot drift apart."""

    __slots__ = ("_block_tokens", "_engines", "_tokens", "_unbounded")

    def __init__(self, capacity_tokens: int, block_tokens: float, unbounded: int = 0) -> None:
        self._tokens = capacity_tokens
        self._unbounded = unbounded  # the blocks a backend may hold with no capacity set
        self._block_tokens = block_tokens
        self._engines: dict[str, EngineCache] = {}

    def resize(self, block_tokens: float) -> None:
        self._block_tokens = block_tokens

    @property
    def configured(self) -> int:
        """A backend's configured capacity in blocks (`unbounded` with none set)."""
        if self._tokens <= 0:
            return self._unbounded
        return max(1, int(self._tokens / self._block_tokens))

    def blocks(self, backend: str) -> int:
        """Blocks `backend` may hold: the configured capacity, scaled as learned."""
        engine = self._engines.get(backend)
        base = self.configured
        return int(base * engine.scale) if engine is not None else base

    def learned(self) -> Iterator[str]:
        """The backends whose capacity was learned to differ from the configured one."""
        return iter(self._engines)

    def learn(self, backend: str, predicted: int, held: int, full: bool) -> bool:
        """One answer's evidence (`full`: the index's model of the backend is at its
        capacity); True when the backend's capacity moved."""
        return self._engines.setdefault(backend, EngineCache()).observe(predicted, held, full)

    def drop(self, backend: str) -> None:
        """A replacement starts with nothing learned."""
        self._engines.pop(backend, None)
