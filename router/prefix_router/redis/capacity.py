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
from ..index.learning import CapacityModel
from .link import RedisLink


class Capacity:
    def __init__(
        self, s: RouterSettings, link: RedisLink, keys: StoreKeys, wall: Callable[[], float]
    ) -> None:
        self._link = link
        self._keys = keys
        self._wall = wall
        # with no capacity known, a backend's blocks in Redis are bounded as the index is here
        unbounded = max(1000, min(s.store.max_entries_per_model, s.max_table_entries) // 16)
        self.model = CapacityModel(s.kv_capacity_tokens, s.block_size, unbounded)
        # per model and backend: (blocks its capacity model holds, last use of the coldest)
        self._held: dict[str, dict[str, tuple[int, float]]] = {}

    @property
    def blocks(self) -> int:
        """A backend's configured capacity, in blocks."""
        return self.model.configured

    def resize(self, block_tokens: float) -> None:
        """A block holds this many engine tokens (sizing.py)."""
        self.model.resize(block_tokens)

    def of(self, backend: str) -> int:
        """Blocks `backend` may hold in the shared capacity model."""
        return self.model.blocks(backend)

    def occupancy(self, model: str, backend: str) -> float:
        held = self._held.get(model, {}).get(backend)
        return held[0] / self.of(backend) if held else 0.0

    def tail_age(self, model: str, backend: str) -> float:
        held = self._held.get(model, {}).get(backend)
        if not held or held[1] < 0 or held[0] < self.of(backend) * FULL:
            return float("inf")
        return max(self._wall() - held[1], 0.0)

    def learn(self, model: str, backend: str, predicted: int, held: int) -> bool:
        full = self.occupancy(model, backend) >= FULL
        return self.model.learn(backend, predicted, held, full)

    def drop(self, backend: str) -> None:
        self.model.drop(backend)
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
