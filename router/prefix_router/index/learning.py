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
