"""Each backend's cache as every router of a model sees it: the shared capacity model (the
lru sets all routers write, each trimmed to the backend's capacity, read on the heartbeat) and
what was learned of the real engine from the cached tokens it reports (index/learning.py).

Occupancy and tail age come from the SHARED model: each router's own view differs (it sees a
share of the records), and routing on it would make replicas place the same new prefix on
different backends. The shared one is the same for all, up to one heartbeat.
"""

from __future__ import annotations

from collections.abc import Callable

from ..config import RouterSettings
from ..contract import StoreKeys
from ..index.holding import FULL
from ..index.learning import EngineCache
from .link import RedisLink


class Capacity:
    def __init__(
        self, s: RouterSettings, link: RedisLink, keys: StoreKeys, wall: Callable[[], float]
    ) -> None:
        self._link = link
        self._keys = keys
        self._wall = wall
        self._capacity_tokens = s.kv_capacity_tokens
        # with no capacity known, a backend's blocks in Redis are bounded as the index is here
        self._unbounded = max(1000, min(s.store.max_entries_per_model, s.max_table_entries) // 16)
        self.blocks = 0  # a backend's configured capacity, in blocks
        self.resize(s.block_size)
        self._learned: dict[str, int] = {}  # per backend, where learned (learning.py)
        # per model and backend: (blocks its capacity model holds, last use of the coldest)
        self._held: dict[str, dict[str, tuple[int, float]]] = {}
        self.engines: dict[str, EngineCache] = {}  # learned per backend

    def resize(self, block_tokens: float) -> None:
        """A block holds this many engine tokens (sizing.py)."""
        cap = int(self._capacity_tokens / block_tokens) if self._capacity_tokens else 0
        self.blocks = max(cap, 1) if cap else self._unbounded

    def of(self, backend: str) -> int:
        """Blocks `backend` may hold in the shared capacity model."""
        return self._learned.get(backend) or self.blocks

    def occupancy(self, model: str, backend: str) -> float:
        held = self._held.get(model, {}).get(backend)
        return held[0] / self.of(backend) if held else 0.0

    def tail_age(self, model: str, backend: str) -> float:
        held = self._held.get(model, {}).get(backend)
        if not held or held[1] < 0 or held[0] < self.of(backend) * FULL:
            return float("inf")
        return max(self._wall() - held[1], 0.0)

    def learn(self, model: str, backend: str, predicted: int, held: int) -> bool:
        engine = self.engines.setdefault(backend, EngineCache())
        full = self.occupancy(model, backend) >= FULL
        if not engine.observe(predicted, held, full):
            return False
        self._learned[backend] = int(self.blocks * engine.scale)
        return True

    def drop(self, backend: str) -> None:
        self.engines.pop(backend, None)
        self._learned.pop(backend, None)
        for held in self._held.values():
            held.pop(backend, None)

    async def read(self, models: set[str]) -> None:
        """The shared capacity model of every model this router serves (one round trip)."""
        if self._link.down or not models:
            return
        ordered = sorted(models)
        pipe = self._link.pipeline()
        for model in ordered:
            self._link.evalsha(pipe, "caches", self._keys.prefix, model)
        res = await pipe.execute()
        for model, flat in zip(ordered, res, strict=True):
            self._held[model] = {
                str(flat[i]): (int(flat[i + 1]), float(flat[i + 2]))
                for i in range(0, len(flat), 3)
            }
