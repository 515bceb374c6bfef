"""The other router replicas: this router's load published for them, theirs read back.

Each router keeps one hash of its load (requests in flight and pending prefill per backend)
whose expiry is its lease: a dead router's load disappears by itself. A request sent goes
out at once when other routers are live, any other change of this router's load within one
flush period: a request's prefill lasts ~100 ms, and a load even a few ms old shows the other
routers a backend idle that this one has just filled, so they pile onto it. Lookups bring the
others' load back with each request; the heartbeat keeps it current when requests are rare.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..contract import StoreKeys
from ..load import LoadTracker
from .link import RedisLink


class Peers:
    def __init__(
        self,
        link: RedisLink,
        keys: StoreKeys,
        router_id: str,
        load: LoadTracker,
        lease_s: float,
        wall: Callable[[], float],
    ) -> None:
        self._link = link
        self._keys = keys
        self.router_id = router_id
        self._load = load
        self.lease_s = lease_s
        self._wall = wall
        self._published: dict[str, tuple[int, int]] | None = None  # load as last published
        self._version = -1  # the load's version at that publication
        self.others = 0  # other live routers, as of the last heartbeat

    def load_changed(self) -> bool:
        return self._published is None or self._load.version != self._version

    def stage_load(self, pipe: Any, force: bool = False) -> bool:
        """Queue this router's load (and its heartbeat) on `pipe` if it changed or `force`."""
        self._version = self._load.version
        snap = self._load.own_snapshot()
        if snap == self._published and not force:
            return False
        key = self._keys.load(self.router_id)
        pipe.delete(key)
        if snap:
            fields: dict[str, int] = {}
            for b, (n, tokens) in snap.items():
                fields[f"i:{b}"] = n
                fields[f"p:{b}"] = tokens
            pipe.hset(key, mapping=fields)
        pipe.expire(key, max(1, round(self.lease_s)))
        pipe.zadd(self._keys.routers, {self.router_id: self._wall()})
        self._published = snap
        return True

    def unpublish(self) -> None:
        """The last publication may not have arrived: publish again next time."""
        self._published = None

    def lookup_args(self) -> tuple[str, str, float]:
        """The arguments by which a script sums the other live routers' load."""
        return self._keys.prefix, self.router_id, self._wall() - self.lease_s

    def take_remote(self, flat: Sequence[str | float]) -> None:
        """The others' load as a flat field/value list (`i:<backend>`, `p:<backend>`)."""
        in_flight: dict[str, float] = {}
        pending: dict[str, float] = {}
        for i in range(0, len(flat), 2):
            field = str(flat[i])
            (in_flight if field[0] == "i" else pending)[field[2:]] = float(flat[i + 1])
        self._load.set_remote(in_flight, pending)

    async def heartbeat(self) -> None:
        """Renew the lease (republished even if unchanged), forget dead routers and read
        the live ones' load."""
        link, routers = self._link, self._keys.routers
        pipe = link.pipeline()
        self.stage_load(pipe, force=True)
        now = self._wall()
        pipe.zremrangebyscore(routers, "-inf", now - self.lease_s)
        pipe.zcard(routers)
        link.evalsha(pipe, "loads", *self.lookup_args())
        try:
            res = await pipe.execute()
        except BaseException:
            self.unpublish()
            raise
        self.others = max(int(res[-2]) - 1, 0)
        self.take_remote(res[-1])
