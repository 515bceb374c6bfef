"""What an engine really holds, learned from the cached tokens it reports. Pure.

Each answer that reports `cached_tokens` is evidence about the backend it went to: the index
predicted `predicted` leading blocks of the prompt cached there, the engine says it had
`held`, and the deepest predicted block had gone unused for `age` seconds before the request.
Blocks of one chain are never used more recently the deeper they are, so:
- held < predicted: the engine dropped a block no older than `age`: it keeps unused blocks
  for less than `age` seconds (its cache is smaller than the index's model of it, or it
  restarted, or it preempted);
- held >= predicted: it kept a block `age` seconds old: it keeps them at least that long;
- held > predicted: the index had dropped blocks the engine still held: its capacity is
  larger than the index's model.
The estimate is the boundary between the two kinds of evidence, moved a step toward each
sample on the wrong side of it; the index then drops what the engine no longer holds
(index/table.py: `limit`), so a drifted index heals without probing every prefix one miss at
a time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

STEP = 0.25  # how far a sample on the wrong side moves the boundary
# A block dropped within this long of its last use says more of the engine's own state (a
# preemption, a request computed beside a busy copy) than of how long its cache keeps blocks.
MIN_MISS_AGE_S = 1.0
GROW = 1.1  # capacity scale per under-prediction
MAX_SCALE = 4.0  # never more than this many times the configured capacity


@dataclass(slots=True)
class EngineCache:
    keep_s: float = math.inf  # how long an unused block stays in the engine's cache
    scale: float = 1.0  # its capacity against the configured one

    def observe(self, age: float, predicted: int, held: int, full: bool) -> bool:
        """One answer's evidence (`full`: the index's model of the backend is at its
        capacity); True when the estimate changed."""
        if age < 0 or (predicted <= 0 and held <= 0):
            return False
        if held < predicted:
            if age < MIN_MISS_AGE_S:
                return False
            if self.keep_s == math.inf:
                self.keep_s = age
                return True
            if age < self.keep_s:
                self.keep_s += STEP * (age - self.keep_s)
                return True
            return False
        changed = False
        if predicted and self.keep_s < math.inf and age > self.keep_s:
            self.keep_s += STEP * (age - self.keep_s)
            changed = True
        if held > predicted and full and self.scale < MAX_SCALE:
            self.scale = min(self.scale * GROW, MAX_SCALE)
            changed = True
        return changed
