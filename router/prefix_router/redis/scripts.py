"""The Lua scripts of the shared index, each one round trip. Key names come from the
contract (contract.py), so router and operator agree on them.

Chains travel as one string of 16-hex-digit words (one argument, not hundreds: packing and
parsing those cost more than the lookup). A backend's holding is a chain from the head (every
record writes one, and deeper blocks always score older, so they expire and are evicted
first), so a lookup finds its depth by binary search: owners x log2(blocks) probes, where a
walk over every block of a 7,000-token prompt (450 blocks) took milliseconds of the Redis
that every router shares.
"""

from __future__ import annotations

from collections.abc import Sequence
from string import Template

from ..contract import BACKENDS_INFIX, LOAD_INFIX, LRU_INFIX, MODELS_KEY, OWNERS_INFIX, ROUTERS_KEY


def _lua(text: str) -> str:
    return Template(text).substitute(
        owners=OWNERS_INFIX, lru=LRU_INFIX, backends=BACKENDS_INFIX, load=LOAD_INFIX,
        routers=ROUTERS_KEY, models=MODELS_KEY,
    )


def chain_hex(hashes: Sequence[int]) -> str:
    """The chain as one string of 16-hex-digit words."""
    return b"".join(h.to_bytes(8, "big") for h in hashes).hex()


def block_hex(h: int) -> str:
    return format(h, "016x")


# ARGV[1] key prefix, ARGV[2] own router id, ARGV[3] oldest live heartbeat: the sum of every
# other live router's load hash, as a flat field/value list in `load`.
_SUM_LOAD = """
local p, me = ARGV[1], ARGV[2]
local sum = {}
for _, r in ipairs(redis.call('ZRANGEBYSCORE', p .. '$routers', ARGV[3], '+inf')) do
  if r ~= me then
    local h = redis.call('HGETALL', p .. '$load' .. r)
    for j = 1, #h, 2 do sum[h[j]] = (sum[h[j]] or 0) + tonumber(h[j + 1]) end
  end
end
local load = {}
for f, n in pairs(sum) do load[#load + 1] = f; load[#load + 1] = n end
"""

# ARGV[4] the model's owners key prefix, ARGV[5] the chain. Per owner: its depth. The other
# routers' load rides along, so every decision sees the load all routers put on each backend,
# at no extra round trip.
LOOKUP = _lua("""
local ob, chain = ARGV[4], ARGV[5]
local n = #chain / 16
local function key(i) return ob .. string.sub(chain, 16 * i - 15, 16 * i) end
local function held(i, b) return redis.call('HEXISTS', key(i), b) == 1 end
local out = {}
if n > 0 then
  for _, b in ipairs(redis.call('HKEYS', key(1))) do
    if held(1, b) then
      local lo, hi = 1, n + 1  -- block lo is held, block hi is not (n + 1: past the end)
      while hi - lo > 1 do
        local mid = math.floor((lo + hi) / 2)
        if held(mid, b) then lo = mid else hi = mid end
      end
      out[#out + 1] = b; out[#out + 1] = lo
    end
  end
end
-- ARGV[6] the model's holds key prefix, ARGV[7] the oldest hold that counts (holds.py): a
-- chain another router sent and its engine has not answered counts to the depth it shares
local hk = ARGV[6] .. string.sub(chain, 1, 16)
local holds = n > 0 and redis.call('HGETALL', hk) or {}
if #holds > 0 then
  local depth, oldest = {}, tonumber(ARGV[7])
  for i = 1, #out, 2 do depth[out[i]] = out[i + 1] end
  for i = 1, #holds, 2 do
    local v = holds[i + 1]
    local s1 = string.find(v, ' ', 1, true)
    local s2 = string.find(v, ' ', s1 + 1, true)
    if tonumber(string.sub(v, 1, s1 - 1)) < oldest then
      redis.call('HDEL', hk, holds[i])
    else
      -- Block hashes are chained: two chains share their first k blocks iff their k-th
      -- hashes are equal, so the depth is a binary search over single 16-digit words, read
      -- in place (comparing whole prefixes cost ~0.1 ms a hold of 400 blocks).
      local b = string.sub(v, s1 + 1, s2 - 1)
      local lo, hi = 0, math.min(n, (#v - s2) / 16) + 1  -- lo leading blocks shared, hi not
      while hi - lo > 1 do
        local mid = math.floor((lo + hi) / 2)
        local e = 16 * mid
        if string.sub(chain, e - 15, e) == string.sub(v, s2 + e - 15, s2 + e) then
          lo = mid
        else
          hi = mid
        end
      end
      if lo > (depth[b] or 0) then depth[b] = lo end
    end
  end
  out = {}
  for b, d in pairs(depth) do out[#out + 1] = b; out[#out + 1] = d end
end
""" + _SUM_LOAD + """
return {out, load}
""")

LOADS = _lua(_SUM_LOAD + """
return load
""")

# ARGV[7] the blocks to record; ARGV[8] the block before them ('' at the head): a chain's tail
# recorded after its head (the answer's blocks) scores just below its parent, so the holding
# stays a chain from the head. Past the TTL or the capacity, the oldest blocks go.
RECORD = _lua("""
local p, model, be = ARGV[1], ARGV[2], ARGV[3]
local now, ttl, cap = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local chain, parent = ARGV[7], ARGV[8]
local lru = p .. '$lru' .. model .. ':' .. be
local ob = p .. '$owners' .. model .. ':'
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
redis.call('SADD', p .. '$backends' .. model, be)
redis.call('EXPIRE', p .. '$backends' .. model, ttl)
return 0
""")

# ARGV[4] the blocks the backend no longer holds.
TRUNCATE = _lua("""
local p, model, be, chain = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local lru = p .. '$lru' .. model .. ':' .. be
local ob = p .. '$owners' .. model .. ':'
local n = 0
for i = 1, #chain / 16 do
  local h = string.sub(chain, 16 * i - 15, 16 * i)
  n = n + redis.call('ZREM', lru, h)
  redis.call('HDEL', ob .. h, be)
end
return n
""")

DROP = _lua("""
local p, be = ARGV[1], ARGV[2]
local n = 0
for _, model in ipairs(redis.call('SMEMBERS', p .. '$models')) do
  local lru = p .. '$lru' .. model .. ':' .. be
  local all = redis.call('ZRANGE', lru, 0, -1)
  for _, h in ipairs(all) do redis.call('HDEL', p .. '$owners' .. model .. ':' .. h, be) end
  redis.call('DEL', lru)
  redis.call('SREM', p .. '$backends' .. model, be)
  n = n + #all
end
return n
""")

# ARGV[2] model: per backend holding blocks of it, as a flat list, its name, how many blocks
# its capacity model holds and the last use of its coldest one.
CACHES = _lua("""
local p, model = ARGV[1], ARGV[2]
local set = p .. '$backends' .. model
local out = {}
for _, be in ipairs(redis.call('SMEMBERS', set)) do
  local lru = p .. '$lru' .. model .. ':' .. be
  local n = redis.call('ZCARD', lru)
  if n == 0 then
    redis.call('SREM', set, be)  -- all expired: it holds nothing any more
  else
    out[#out + 1] = be; out[#out + 1] = n
    out[#out + 1] = redis.call('ZRANGE', lru, 0, 0, 'WITHSCORES')[2]
  end
end
return out
""")

SCRIPTS = {
    "lookup": LOOKUP, "loads": LOADS, "record": RECORD, "truncate": TRUNCATE, "drop": DROP,
    "caches": CACHES,
}
