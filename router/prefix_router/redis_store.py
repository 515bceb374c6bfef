"""The shared table store: one ownership table and load picture for every router replica.

Key layout (all under `prefixrouter:<model_key>:`, where model_key is `<namespace>/<name>`
of the PrefixRoutedModel, so the operator's finalizer can delete a model's keys by prefix;
keys carry block hashes in hex, never prompt text):
  o:<model>:<hash>        HASH  backend -> last use (unix s); the owners of one prefix block
  lru:<model>:<backend>   ZSET  hash scored by last use; the backend's capacity model
  be:<model>              SET   backends with an lru set for the model (read on the load timer
                                for every router's occupancy and tail age)
  ws:<bucket>             HLL   block hashes requested in a 10 s bucket (working set, a union
                                across router replicas, not a sum)
  load:<router id>        HASH  i:<backend> -> this router's in-flight requests there,
                                p:<backend> -> its prompt tokens dispatched there whose prefill
                                has not finished (expires in 3 s, so a dead router's load
                                disappears by itself)
  routers                 ZSET  router id scored by its last heartbeat
  models                  SET   model names with ownership here (for dropping a backend)
  router:<router id>      HASH  windowed figures for the operator and the metrics adapter
                                (prompt_tokens, cached_tokens, working_set_tokens, in_flight,
                                updated_at), as operator/prefix_operator/figures.py reads them
Round trips: a lookup is one EVALSHA for the whole chain, and its reply also carries the other
routers' load; writes are queued and ride on the next lookup (or go after the write delay),
except a new owner, which is flushed at once; a change of this router's own load goes out at
the next 5 ms tick by itself (a request's prefill is ~100 ms, so a load older than a few ms
misleads the others). A heartbeat timer keeps the load fresh when no requests come and reads
the shared capacity model (occupancy and tail age per backend); figures go out on a timer.
The scripts touch keys they compute from a prefix, so this store needs a single Redis (or a
cluster with every key of a model in one hash slot), not a sharded cluster.

Near-cache: a lookup answer is reused for `near_cache_ttl_ms` (default 250 ms: the bounded
staleness); the router's own records since then are merged in from a local table, so its
next request sees them at once. A lookup slower than the per-request budget `timeout_ms`
routes that request on a full local table kept in step with every record; its late reply
still fills the near-cache and the next request asks Redis again (slow is not down). When a
command fails (connection refused, reset, or no reply within the 1 s socket timeout) the store
is `degraded`: routing goes on from local state and a background loop reconnects.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from .config import RouterSettings
from .store import LocalStore

log = logging.getLogger("prefix_router.redis_store")

# ARGV[1] key prefix, ARGV[2] own router id, ARGV[3] oldest live heartbeat: the sum of every
# other live router's load hash, as a flat field/value list in `load`.
_SUM_LOAD = """
local p, me = ARGV[1], ARGV[2]
local sum = {}
for _, r in ipairs(redis.call('ZRANGEBYSCORE', p .. 'routers', ARGV[3], '+inf')) do
  if r ~= me then
    local h = redis.call('HGETALL', p .. 'load:' .. r)
    for j = 1, #h, 2 do sum[h[j]] = (sum[h[j]] or 0) + tonumber(h[j + 1]) end
  end
end
local load = {}
for f, n in pairs(sum) do load[#load + 1] = f; load[#load + 1] = n end
"""

# ARGV[4] the model's ownership key prefix, ARGV[5] the chain's block hashes as one string of
# 16-hex-digit words (one argument, not hundreds: packing and parsing those cost more than the
# lookup). A backend's holding is a chain from the head (every record writes one, and deeper
# blocks always score older, so they expire and are evicted first), so its depth is found by
# binary search: owners x log2(blocks) probes, where a walk over every block of a
# 7,000-token prompt (450 blocks) took milliseconds of the Redis that every router shares.
_LOOKUP = """
local ob, chain = ARGV[4], ARGV[5]
local n = #chain / 16
local function key(i) return ob .. string.sub(chain, 16 * i - 15, 16 * i) end
local out = {}
if n > 0 then
  for _, b in ipairs(redis.call('HKEYS', key(1))) do
    local lo, hi = 1, n + 1  -- block lo is held, block hi is not (n + 1: past the end)
    while hi - lo > 1 do
      local mid = math.floor((lo + hi) / 2)
      if redis.call('HEXISTS', key(mid), b) == 1 then lo = mid else hi = mid end
    end
    out[#out + 1] = b; out[#out + 1] = lo
  end
end
-- The other routers' load rides along, so every decision sees the load ALL routers put on
-- each backend as of their last write (milliseconds old), at no extra round trip.
""" + _SUM_LOAD + """
return {out, load}
"""

_LOADS = _SUM_LOAD + """
return load
"""

# ARGV[7] the blocks to record (one string of 16-hex-digit words, as for the lookup); ARGV[8]
# the block before them ('' when they start at the head): a chain's tail recorded after its
# head (the answer's blocks, once the response is in) scores just below its parent, so the
# holding stays a chain from the head.
_RECORD = """
local p, model, be = ARGV[1], ARGV[2], ARGV[3]
local now, ttl, cap = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local chain, parent = ARGV[7], ARGV[8]
local lru = p .. 'lru:' .. model .. ':' .. be
local ob = p .. 'o:' .. model .. ':'
local top = now
if parent ~= '' then
  local ps = redis.call('ZSCORE', lru, parent)
  if ps then top = math.min(now, tonumber(ps) - 1e-6) end
end
for i = 1, #chain / 16 do
  local h = string.sub(chain, 16 * i - 15, 16 * i)
  local k = ob .. h
  redis.call('HSET', k, be, now)
  redis.call('EXPIRE', k, ttl)
  -- deeper blocks score a little older, so a chain's tail is trimmed before its head
  redis.call('ZADD', lru, top - (i - 1) * 1e-6, h)
end
local old = redis.call('ZRANGEBYSCORE', lru, '-inf', now - ttl)
for _, h in ipairs(old) do redis.call('HDEL', ob .. h, be) end
if #old > 0 then redis.call('ZREMRANGEBYSCORE', lru, '-inf', now - ttl) end
local extra = redis.call('ZCARD', lru) - cap
if extra > 0 then
  local gone = redis.call('ZPOPMIN', lru, extra)
  for j = 1, #gone, 2 do redis.call('HDEL', ob .. gone[j], be) end
end
redis.call('EXPIRE', lru, ttl)
redis.call('SADD', p .. 'be:' .. model, be)
redis.call('EXPIRE', p .. 'be:' .. model, ttl)
return 0
"""

_DROP = """
local p, be = ARGV[1], ARGV[2]
local n = 0
for _, model in ipairs(redis.call('SMEMBERS', p .. 'models')) do
  local lru = p .. 'lru:' .. model .. ':' .. be
  local all = redis.call('ZRANGE', lru, 0, -1)
  for _, h in ipairs(all) do redis.call('HDEL', p .. 'o:' .. model .. ':' .. h, be) end
  redis.call('DEL', lru)
  redis.call('SREM', p .. 'be:' .. model, be)
  n = n + #all
end
return n
"""

# ARGV[1] key prefix, ARGV[2] model: per backend holding blocks of it, as a flat list, its
# name, how many blocks its capacity model holds and the last use of its coldest one.
_CACHES = """
local p, model = ARGV[1], ARGV[2]
local set = p .. 'be:' .. model
local out = {}
for _, be in ipairs(redis.call('SMEMBERS', set)) do
  local lru = p .. 'lru:' .. model .. ':' .. be
  local n = redis.call('ZCARD', lru)
  if n == 0 then
    redis.call('SREM', set, be)  -- all expired: it holds nothing any more
  else
    out[#out + 1] = be; out[#out + 1] = n
    out[#out + 1] = redis.call('ZRANGE', lru, 0, 0, 'WITHSCORES')[2]
  end
end
return out
"""

WS_BUCKET_S = 10
WS_WINDOW_S = 60
LOAD_EXPIRY_S = 3
MAX_LATE_LOOKUPS = 16
GRACE_ITERATIONS = 4
# Lookups bring the others' load per request; this heartbeat only renews the lease and keeps
# the picture current when requests are rare.
LOAD_PERIOD_S = 0.5
FIGURES_PERIOD_S = 1.0
# A working-set count older than this is not served (the router's /metrics): Redis is away.
WS_STALE_S = 5.0


def _hex(h: int) -> str:
    return format(h, "016x")


def _chain_hex(hashes: Sequence[int]) -> str:
    """The chain as one string of 16-hex-digit words, each equal to _hex(h)."""
    return b"".join(h.to_bytes(8, "big") for h in hashes).hex()


async def _last(replies: Awaitable[list[Any]]) -> Any:
    return (await replies)[-1]


@dataclass(slots=True)
class _Staged:
    batch: list[tuple[str, list[int], str, int | None]]
    drops: list[str]


class RedisStore:
    def __init__(self, s: RouterSettings, router_id: str | None = None) -> None:
        self._s = s
        st = s.store
        assert st.url
        password = os.environ.get(st.password_env) if st.password_env else None
        self._redis = aioredis.from_url(
            st.url,
            password=password,
            username=st.username,
            socket_timeout=1.0,
            socket_connect_timeout=1.0,
            health_check_interval=0,
            decode_responses=True,
        )
        self._prefix = f"prefixrouter:{s.model_key}:"
        self._budget = st.timeout_ms / 1000.0
        self._budget_floor = st.timeout_ms / 1000.0
        self._budget_cap = max(st.timeout_max_ms, st.timeout_ms) / 1000.0
        self._budget_factor = st.timeout_factor
        self._typical = 0.0  # moving average of lookup times (s), replies in time or late
        self._near_ttl = st.near_cache_ttl_ms / 1000.0
        cap = s.kv_capacity_tokens // s.block_size if s.kv_capacity_tokens else 0
        self._cap_blocks = cap or max(1000, st.max_entries_per_model // 16)
        self._ttl = int(max(1, s.ttl_seconds))
        self.router_id = router_id or f"{socket.gethostname()}-{uuid.uuid4().hex[:6]}"
        self._fallback = LocalStore(
            s.block_size, s.kv_capacity_tokens, s.ttl_seconds, s.max_table_entries, s.max_owners
        )
        # own records not yet flushed, merged into shared answers
        self._recent = self._new_recent()  # own records not yet written
        self._sent: tuple[float, LocalStore] | None = None  # the last written, and when
        self._near: dict[tuple[str, int, int], tuple[float, dict[str, int]]] = {}
        # (model, blocks, backend, the block before them or None at the head)
        self._queue: list[tuple[str, list[int], str, int | None]] = []
        self._queued_at = 0.0  # when the oldest queued write came
        self._urgent = False  # a queued write other routers should see at once
        self._write_delay = st.write_delay_ms / 1000.0
        self._drops: list[str] = []
        self._ws: list[int] = []
        self._degraded_until = 0.0
        self._down = False
        self._tasks: list[asyncio.Task[None]] = []
        self._closed = False
        self._sha: dict[str, str] = {}
        self.round_trips = 0  # lookups and write-back flushes: the traffic requests cause
        self.timer_round_trips = 0  # load and figures exchanges: a fixed rate per router
        self.slow_lookups = 0  # lookups answered from local state: Redis over the budget
        self._late = 0  # lookups past their budget whose reply has not come yet
        self.load_source = None  # set by the app: a LoadTracker
        self._window: deque[tuple[float, float, float]] = deque()
        self._routers = 1  # live routers sharing the store, as last counted (load timer)
        self._ws_blocks = 0  # distinct blocks in the working-set window, as last counted
        self._ws_counted_at: float | None = None  # time.monotonic() of that count
        self._published: dict[str, tuple[int, int]] | None = None  # load as last published
        self._published_version = -1  # the load source's version at that publish
        # models this router serves, and what the shared capacity model holds for each of
        # their backends: (blocks held, last use of the coldest), read on the load timer
        self._models: set[str] = set()
        self._caches: dict[str, dict[str, tuple[int, float]]] = {}
        self._flushing: asyncio.Task[None] | None = None

    def _new_recent(self) -> LocalStore:
        return LocalStore(self._s.block_size, 0, 3.0, 200_000, 0)

    # -- lifecycle --------------------------------------------------------------------------
    async def start(self) -> None:
        try:
            await self._load_scripts()
        except (RedisError, OSError) as exc:
            self._fail(exc)
        self._tasks = [
            asyncio.create_task(self._flush_loop(), name="redis-flush"),
            asyncio.create_task(self._load_loop(), name="redis-load"),
            asyncio.create_task(self._figures_loop(), name="redis-figures"),
            asyncio.create_task(self._reconnect_loop(), name="redis-reconnect"),
        ]

    async def close(self) -> None:
        # The loops also stop on the flag and are awaited with a deadline: redis-py (8.1)
        # sometimes swallows a CancelledError that lands inside pipeline.execute() and
        # returns the reply instead (seen under pytest as a task left `cancelling` while
        # its loop went on), so a bare cancel-and-await could wait forever.
        self._closed = True
        for t in self._tasks:
            t.cancel()
        if self._tasks:
            _done, stuck = await asyncio.wait(self._tasks, timeout=2.0)
            for t in stuck:
                log.warning("background task %s did not stop within 2 s", t.get_name())
        with contextlib.suppress(RedisError, OSError):
            await self._flush()
        await self._redis.aclose()

    async def _load_scripts(self) -> None:
        scripts = (("lookup", _LOOKUP), ("loads", _LOADS), ("record", _RECORD), ("drop", _DROP),
                   ("caches", _CACHES))
        for name, body in scripts:
            self._sha[name] = await self._redis.script_load(body)

    # -- health -----------------------------------------------------------------------------
    @property
    def degraded(self) -> bool:
        return self._down

    def _fail(self, exc: BaseException) -> None:
        if not self._down:
            log.warning("shared store unavailable (%r): routing on local state", exc)
        self._down = True
        self._degraded_until = time.monotonic() + 1.0

    async def _reconnect_loop(self) -> None:
        while not self._closed:
            await asyncio.sleep(0.5)
            if not self._down or time.monotonic() < self._degraded_until:
                continue
            try:
                await self._redis.ping()
                await self._load_scripts()  # an emptied or restarted Redis lost them
            except (RedisError, OSError) as exc:
                self._degraded_until = time.monotonic() + 1.0
                log.debug("reconnect failed: %r", exc)
                continue
            self._down = False
            self._near.clear()
            log.info("shared store back: routing on the shared table again")

    # -- the table --------------------------------------------------------------------------
    async def lookup(self, model: str, hashes: Sequence[int]) -> dict[str, int]:
        if not hashes:
            return {}
        self._models.add(model)
        if not (self._ws or self._queue):
            self._queued_at = time.monotonic()
        self._ws.extend(hashes)
        if self._down:
            return await self._fallback.lookup(model, hashes)
        now = time.monotonic()
        key = (model, hashes[-1], len(hashes))
        hit = self._near.get(key)
        if hit is not None and now - hit[0] <= self._near_ttl:
            shared = hit[1]
        else:
            if self._late >= MAX_LATE_LOOKUPS:
                # Redis answers none of the recent lookups: stop piling up more of them
                # (each would take a connection) until they finish or time out.
                self.slow_lookups += 1
                return await self._fallback.lookup(model, hashes)
            args = (self._prefix, self.router_id, time.time() - LOAD_EXPIRY_S,
                    f"{self._prefix}o:{model}:", _chain_hex(hashes))
            try:
                sha = self._sha["lookup"]
                if self._has_writes():
                    # Queued writes ride on this round trip, ahead of the lookup, so a
                    # request costs one round trip, not a lookup plus a flush.
                    pipe = self._redis.pipeline(transaction=False)
                    staged = self._stage(pipe)
                    pipe.evalsha(sha, 0, *args)
                    call = asyncio.ensure_future(_last(pipe.execute()))
                else:
                    staged = None
                    call = asyncio.ensure_future(self._redis.evalsha(sha, 0, *args))
            except KeyError as exc:  # scripts not loaded: Redis was down at start
                self._fail(exc)
                return await self._fallback.lookup(model, hashes)
            self.round_trips += 1
            sent = time.perf_counter()
            call.add_done_callback(lambda _c, t=sent: self._timed(time.perf_counter() - t))
            done, _ = await asyncio.wait((call,), timeout=self._budget)
            if not done:
                # On a busy host the timer and a reply already in the socket are ready in the
                # same loop iteration, and the timer wins: a few more iterations let a reply
                # that came in time through, at a cost of microseconds when none did.
                for _ in range(GRACE_ITERATIONS):
                    await asyncio.sleep(0)
                    if call.done():
                        break
            if not call.done():
                # Slow is not down: this request routes on local state (a full local table
                # kept in step with every record), the reply still fills the near-cache when
                # it comes, and the next request asks Redis again. Cancelling instead would
                # throw away the connection mid-reply, and degrading for a second on every
                # scheduling hiccup of a busy host cost a third of the shared table's value.
                self.slow_lookups += 1
                self._late += 1
                call.add_done_callback(
                    lambda c, k=key, w=staged, h=hashes: self._late_reply(c, k, w, h))
                return await self._fallback.lookup(model, hashes)
            exc = call.exception()
            if exc is not None:
                if not isinstance(exc, (RedisError, OSError)):
                    raise exc
                self._unstage(staged)
                self._fail(exc)
                return await self._fallback.lookup(model, hashes)
            shared = self._take_reply(call.result(), key, now, hashes)
        mine = await self._recent.lookup(model, hashes)
        sent = self._sent
        if sent is not None and now - sent[0] <= self._near_ttl:
            # written, but a near-cache answer may predate it
            for b, d in (await sent[1].lookup(model, hashes)).items():
                if d > mine.get(b, 0):
                    mine[b] = d
        if not mine:
            return shared
        merged = dict(shared)
        for b, d in mine.items():
            if d > merged.get(b, 0):
                merged[b] = d
        return merged

    def _timed(self, seconds: float) -> None:
        t = self._typical
        self._typical = seconds if t == 0.0 else t + 0.05 * (seconds - t)
        self._budget = min(max(self._budget_factor * self._typical, self._budget_floor),
                           self._budget_cap)

    @property
    def budget_ms(self) -> float:
        return self._budget * 1000.0

    def _take_reply(self, reply: list[list[str | int]], key: tuple[str, int, int],
                    at: float, hashes: Sequence[int]) -> dict[str, int]:
        flat, load = reply
        shared = {str(flat[i]): int(flat[i + 1]) for i in range(0, len(flat), 2)}
        self._take_remote_load(load)
        if shared:
            # What the shared table knows of this chain goes into the local one too, so a
            # later lookup that misses its budget routes on nearly the shared picture rather
            # than on this router's own third of it.
            local = self._fallback.table(key[0]).match(hashes)
            for b, d in shared.items():
                if local.get(b, 0) < d:
                    self._fallback.record(key[0], hashes[:d], b)
        if len(self._near) > 20_000:
            self._near.clear()
        self._near[key] = (at, shared)
        return shared

    def _late_reply(self, call: asyncio.Future[list[list[str | int]]],
                    key: tuple[str, int, int], staged: _Staged | None,
                    hashes: Sequence[int]) -> None:
        self._late -= 1
        if call.cancelled():
            self._unstage(staged)
            return
        exc = call.exception()
        if exc is not None:
            self._unstage(staged)
            if isinstance(exc, (RedisError, OSError)):
                self._fail(exc)
            return
        self._take_reply(call.result(), key, time.monotonic(), hashes)

    def _take_remote_load(self, flat: Sequence[str | float]) -> None:
        source = self.load_source
        if source is None:
            return
        inflight: dict[str, float] = {}
        pending: dict[str, float] = {}
        for i in range(0, len(flat), 2):
            field = str(flat[i])
            (inflight if field[0] == "i" else pending)[field[2:]] = float(flat[i + 1])
        source.set_remote(inflight, pending)

    def _publish_load(self, pipe: aioredis.client.Pipeline, force: bool) -> bool:
        """Queue this router's load on `pipe` if it changed (or `force`); True if queued."""
        source = self.load_source
        if source is None:
            return False
        self._published_version = source.version
        snap = source.own_snapshot()
        if snap == self._published and not force:
            return False
        key = f"{self._prefix}load:{self.router_id}"
        pipe.delete(key)
        if snap:
            fields: dict[str, int] = {}
            for b, (n, tokens) in snap.items():
                fields[f"i:{b}"] = n
                fields[f"p:{b}"] = tokens
            pipe.hset(key, mapping=fields)
        pipe.expire(key, LOAD_EXPIRY_S)
        # a heartbeat too, so lookups count this load before the first heartbeat tick
        pipe.zadd(f"{self._prefix}routers", {self.router_id: time.time()})
        self._published = snap
        return True

    def record(
        self, model: str, hashes: Sequence[int], backend: str, *, urgent: bool = False,
        known: int = 0,
    ) -> None:
        if not hashes:
            return
        self._models.add(model)
        if urgent:
            self._urgent = True
            self._kick()
        self._fallback.record(model, hashes, backend)
        self._recent.record(model, hashes, backend)
        if len(self._queue) < 50_000:  # bounded: under a long outage the oldest writes wait
            if not (self._ws or self._queue):
                self._queued_at = time.monotonic()
            # the first `known` blocks were just written for this backend: only the rest go
            parent = hashes[known - 1] if 0 < known < len(hashes) else None
            tail = list(hashes[known:]) if parent is not None else list(hashes)
            self._queue.append((model, tail, backend, parent))

    def _kick(self) -> None:
        """Flush now rather than at the next tick: a new owner is news for the other routers,
        and in the tick's 5 ms they would place the same kind of request on the same backend
        this one just filled (both see it as the least loaded)."""
        if self._down or self._closed or (self._flushing and not self._flushing.done()):
            return
        try:
            self._flushing = asyncio.get_running_loop().create_task(self._kicked_flush())
        except RuntimeError:  # no loop (a synchronous caller): the tick will carry it
            pass

    async def _kicked_flush(self) -> None:
        try:
            await self._flush()
        except KeyError:  # scripts not loaded yet (Redis was down at start)
            self._fail(RuntimeError("scripts not loaded"))

    def drop_backend(self, backend: str) -> None:
        for held in self._caches.values():
            held.pop(backend, None)
        self._fallback.drop_backend(backend)
        self._recent.drop_backend(backend)
        if self._sent is not None:
            self._sent[1].drop_backend(backend)
        self._near.clear()
        self._drops.append(backend)

    # Occupancy and tail age come from the SHARED capacity model (the lru sets every router
    # writes), read on the load timer: each router's local view differs (it sees a third of
    # the records), and routing on it would make replicas place the same new prefix on
    # different backends. The shared one is the same for all, up to one timer period.
    def occupancy(self, model: str, backend: str) -> float:
        held = self._caches.get(model, {}).get(backend)
        return held[0] / self._cap_blocks if held else 0.0

    def tail_age(self, model: str, backend: str) -> float:
        held = self._caches.get(model, {}).get(backend)
        # "full" a little early, as the local table counts it: a request adds its own blocks
        if not held or held[1] < 0 or held[0] < self._cap_blocks * 0.95:
            return float("inf")
        return max(time.time() - held[1], 0.0)

    def expire(self) -> int:
        self._recent.expire()
        return self._fallback.expire()

    def routers(self) -> int:
        """Live routers as of the last load read; 1 while Redis is down (each router then
        routes on its own table, and its own demand is all it can see)."""
        return 1 if self._down else self._routers

    def entries(self) -> int:
        return self._fallback.entries()

    def observe(self, prompt_tokens: float, predicted_cached: float) -> None:
        """Feed the windowed figures (called once per routed request)."""
        self._window.append((time.time(), prompt_tokens, predicted_cached))

    # -- background work --------------------------------------------------------------------
    def _has_writes(self) -> bool:
        return bool(self._queue or self._drops) or self._load_changed()

    def _load_changed(self) -> bool:
        source = self.load_source
        return source is not None and (
            self._published is None or source.version != self._published_version
        )

    def _stage(self, pipe: aioredis.client.Pipeline) -> _Staged:
        """Move the queued writes onto `pipe` (records, drops, working set, own load)."""
        batch, self._queue = self._queue[:2000], self._queue[2000:]
        self._urgent = False
        if self._queue:
            self._queued_at = time.monotonic()
        drops, self._drops = self._drops, []
        ws, self._ws = self._ws, []
        if batch:
            self._sent = (time.monotonic(), self._recent)
            self._recent = self._new_recent()
        now = time.time()
        for model, hashes, backend, parent in batch:
            pipe.evalsha(
                self._sha["record"],
                0,
                self._prefix,
                model,
                backend,
                now,
                self._ttl,
                self._cap_blocks,
                _chain_hex(hashes),
                "" if parent is None else _hex(parent),
            )
        models = {m for m, _h, _b, _p in batch}
        if models:
            pipe.sadd(f"{self._prefix}models", *models)
            pipe.expire(f"{self._prefix}models", self._ttl)
        for backend in drops:
            pipe.evalsha(self._sha["drop"], 0, self._prefix, backend)
        if ws:
            bucket = f"{self._prefix}ws:{int(now // WS_BUCKET_S)}"
            pipe.pfadd(bucket, *{_hex(h) for h in ws})
            pipe.expire(bucket, WS_WINDOW_S + 2 * WS_BUCKET_S)
        # Writes follow dispatches, so the load others see is as fresh as our last write.
        self._publish_load(pipe, force=False)
        return _Staged(batch, drops)

    def _unstage(self, staged: _Staged | None) -> None:
        """Nothing lost: a failed write goes back to the queue, sent again once Redis is back."""
        if staged is None:
            return
        if staged.batch and not self._queue:
            self._queued_at = time.monotonic()
        self._queue[:0] = staged.batch
        self._drops[:0] = staged.drops
        self._urgent = self._urgent or bool(staged.batch)
        self._published = None

    async def _flush(self) -> None:
        if not (self._queue or self._drops or self._ws):
            return
        pipe = self._redis.pipeline(transaction=False)
        staged = self._stage(pipe)
        try:
            await pipe.execute()
            self.round_trips += 1
        except (RedisError, OSError) as exc:
            self._unstage(staged)
            self._fail(exc)

    async def _flush_load(self) -> None:
        """Publish this router's load alone; queued records keep waiting for a lookup."""
        pipe = self._redis.pipeline(transaction=False)
        if not self._publish_load(pipe, force=False):
            return
        try:
            await pipe.execute()
            self.round_trips += 1
        except (RedisError, OSError) as exc:
            self._published = None
            self._fail(exc)

    async def _flush_loop(self) -> None:
        while not self._closed:
            await asyncio.sleep(0.005)
            if self._down:
                continue
            # Writes wait for the next lookup to carry them, up to the write delay; drops
            # (a backend gone), a long queue and a change of this router's load go at once.
            # Load cannot wait: a request's prefill lasts ~100 ms, so a load 100 ms old shows
            # the other routers a backend idle that this one has just filled, and they pile
            # onto it (measured on `unique` with 3 routers: p99 365 ms against 213 ms for one).
            waited = time.monotonic() - self._queued_at
            if not (self._drops or self._urgent or len(self._queue) >= 1000 or
                    len(self._ws) >= 20_000 or
                    ((self._queue or self._ws) and waited >= self._write_delay)):
                if self._load_changed():
                    await self._flush_load()
                continue
            try:
                await self._flush()
            except KeyError:  # scripts not loaded yet (Redis was down at start)
                self._fail(RuntimeError("scripts not loaded"))

    async def _load_loop(self) -> None:
        routers = f"{self._prefix}routers"
        while not self._closed:
            await asyncio.sleep(LOAD_PERIOD_S)
            if self._down:
                continue
            now = time.time()
            try:
                pipe = self._redis.pipeline(transaction=False)
                # republished even if unchanged: it refreshes the key's expiry (the lease)
                self._publish_load(pipe, force=True)
                pipe.zremrangebyscore(routers, "-inf", now - LOAD_EXPIRY_S)
                pipe.zcount(routers, now - LOAD_EXPIRY_S, "+inf")
                # Lookups bring the others' load with each request; this read keeps it
                # current when requests are rare or all answered from the near-cache.
                pipe.evalsha(self._sha["loads"], 0, self._prefix, self.router_id,
                             now - LOAD_EXPIRY_S)
                # the working set for the figures, counted here to save them a round trip
                pipe.pfcount(*self.working_set_keys(now))
                models = sorted(self._models)
                for model in models:
                    pipe.evalsha(self._sha["caches"], 0, self._prefix, model)
                res = await pipe.execute()
                self.timer_round_trips += 1
                k = len(res) - len(models)
                # this router's own heartbeat is in the same pipeline, so it counts itself
                self._routers = max(int(res[k - 3]), 1)
                self._take_remote_load(res[k - 2])
                self._ws_blocks = res[k - 1]
                self._ws_counted_at = time.monotonic()
                for model, flat in zip(models, res[k:], strict=True):
                    self._caches[model] = {
                        str(flat[i]): (int(flat[i + 1]), float(flat[i + 2]))
                        for i in range(0, len(flat), 3)
                    }
            except (RedisError, OSError, ValueError, KeyError) as exc:
                self._published = None
                self._fail(exc)

    @property
    def working_set_tokens(self) -> int | None:
        """The model's working set as last counted (the same union every router counts), or
        None before the first count and once the last is older than WS_STALE_S."""
        at = self._ws_counted_at
        if at is None or time.monotonic() - at > WS_STALE_S:
            return None
        return self._ws_blocks * self._s.block_size

    def working_set_keys(self, now: float) -> list[str]:
        b = int(now // WS_BUCKET_S)
        return [f"{self._prefix}ws:{b - i}" for i in range(WS_WINDOW_S // WS_BUCKET_S)]

    async def _figures_loop(self) -> None:
        key = f"{self._prefix}router:{self.router_id}"
        while not self._closed:
            await asyncio.sleep(FIGURES_PERIOD_S)
            now = time.time()
            win = self._window
            while win and win[0][0] < now - WS_WINDOW_S:
                win.popleft()
            if self._down:
                continue
            prompt = sum(w[1] for w in win)
            cached = sum(w[2] for w in win)
            load = self.load_source
            inflight = sum(load.own_counts().values()) if load is not None else 0
            try:
                pipe = self._redis.pipeline(transaction=False)
                pipe.hset(
                    key,
                    mapping={
                        "prompt_tokens": prompt,
                        "cached_tokens": cached,
                        "working_set_tokens": self._ws_blocks * self._s.block_size,
                        "in_flight": inflight,
                        "updated_at": now,
                    },
                )
                pipe.expire(key, 2 * WS_WINDOW_S)
                await pipe.execute()
                self.timer_round_trips += 1
            except (RedisError, OSError) as exc:
                self._fail(exc)
