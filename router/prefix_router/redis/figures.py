"""The figures each router publishes for the operator and the metrics adapter
(contract.RouterFigures): prompt and predicted cached tokens over the window, requests in
flight and waiting in the dispatch queue, and the model's working set, the distinct blocks
requested within the window (a HyperLogLog union in Redis that every router adds to, so it is
model-wide, not a sum)."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping

from ..contract import WORKING_SET_WINDOW_S, EngineValues, RouterFigures, StoreKeys
from ..load import LoadTracker
from .link import RedisLink

# A working-set count older than this is not served (the router's /metrics): Redis is away.
WORKING_SET_STALE_S = 5.0


class FiguresPublisher:
    def __init__(
        self,
        link: RedisLink,
        keys: StoreKeys,
        router_id: str,
        load: LoadTracker,
        block_size: int,
        clock: Callable[[], float],
        wall: Callable[[], float],
    ) -> None:
        self._link = link
        self._keys = keys
        self._router_id = router_id
        self._load = load
        self._block = block_size
        self._clock = clock
        self._wall = wall
        self._window: deque[tuple[float, float, float]] = deque()
        self._blocks = 0  # distinct blocks in the working-set window, as last counted
        self._counted_at: float | None = None  # clock() of that count
        # (engines, EXACT, DEGRADED): how the index knows the engines (engine_states.py)
        self.states: Callable[[], tuple[int, int, int]] = lambda: (0, 0, 0)
        # the dispatch queue's (requests waiting, oldest wait): demand for the autoscaler
        self.demand: Callable[[], tuple[int, float]] | None = None
        # per engine, what only it holds (fleet_value.py); published beside the figures
        self.engine_values: Callable[[], Mapping[str, float]] | None = None

    def observe(self, prompt_tokens: float, predicted_cached: float) -> None:
        """One request served (called once per request)."""
        self._window.append((self._wall(), prompt_tokens, predicted_cached))

    @property
    def working_set_tokens(self) -> int | None:
        """The model's working set as last counted, or None before the first count and once
        the last is older than WORKING_SET_STALE_S."""
        at = self._counted_at
        if at is None or self._clock() - at > WORKING_SET_STALE_S:
            return None
        return self._blocks * self._block

    async def publish(self) -> None:
        """Count the working set and publish this router's figures, in one round trip."""
        now = self._wall()
        win = self._window
        while win and win[0][0] < now - WORKING_SET_WINDOW_S:
            win.popleft()
        if self._link.down:
            return
        pipe = self._link.pipeline()
        pipe.pfcount(*self._keys.working_set_window(now))
        engines, exact, degraded = self.states()
        queued, oldest = self.demand() if self.demand is not None else (0, 0.0)
        figures = RouterFigures(
            prompt_tokens=sum(w[1] for w in win),
            cached_tokens=sum(w[2] for w in win),
            working_set_tokens=self._blocks * self._block,
            in_flight=sum(self._load.own_counts().values()),
            queued=queued,
            oldest_wait_s=oldest,
            updated_at=now,
            engines=engines,
            engines_exact=exact,
            engines_degraded=degraded,
        )
        key = self._keys.figures(self._router_id)
        pipe.hset(key, mapping=figures.as_hash())
        pipe.expire(key, 2 * WORKING_SET_WINDOW_S)
        if self.engine_values is not None:
            # replaced whole: an engine gone from the fleet must not keep its last value
            vkey = self._keys.engine_values(self._router_id)
            pipe.delete(vkey)
            pipe.hset(vkey, mapping=EngineValues(self.engine_values(), now).as_hash())
            pipe.expire(vkey, 2 * WORKING_SET_WINDOW_S)
        res = await pipe.execute()
        self._blocks = int(res[0])
        self._counted_at = self._clock()
