"""The Lua scripts of `supervisor.engine_bus.RedisEngineBus`: a publish, a
heartbeat or an acknowledgement, a claim and a release of a session are one
script each, so each is atomic on the pool's slot. The keys each takes are
the bus's (see `supervisor.engine_bus`), every one declared in ``KEYS``."""

from __future__ import annotations

__all__ = ["CLAIM", "HOLD", "PUBLISH", "RELEASE"]

# KEYS: in, lease, owner, counts, seen, out (the owner's stream, as guessed) ;
# ARGV: group, consumer, entry_id, session_id, lease_generation, message_id,
# encoded, guessed owner ('' for none), seen_ttl_ms
# A guess that is not the owner now: {'moved', owner or ''}, nothing changed.
PUBLISH = """
local mine = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[3], ARGV[3], 1, ARGV[2])
if #mine == 0 then
  redis.call('HINCRBY', KEYS[4], 'fenced', 1)
  return 'stale'
end
local current = tonumber(redis.call('HGET', KEYS[2], ARGV[4]) or '0')
if tonumber(ARGV[5]) < current then
  redis.call('HINCRBY', KEYS[4], 'fenced', 1)
  return 'fenced'
end
local owner = redis.call('HGET', KEYS[3], ARGV[4])
if (owner or '') ~= ARGV[8] then return {'moved', owner or ''} end
if redis.call('SADD', KEYS[5], ARGV[6]) == 0 then
  redis.call('HINCRBY', KEYS[4], 'duplicates', 1)
  return 'duplicate'
end
redis.call('PEXPIRE', KEYS[5], ARGV[9])
if not owner then return 'orphaned' end
redis.call('XADD', KEYS[6], '*', 'm', ARGV[7])
return 'sent'
"""

# KEYS: in ; ARGV: group, consumer, ack (1|0), ids...
# Only entries still pending under this consumer: a late worker neither
# heartbeats nor acknowledges what another worker claimed from it.
HOLD = """
local held = 0
for i = 4, #ARGV do
  local mine = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[i], ARGV[i], 1, ARGV[2])
  if #mine > 0 then
    held = held + 1
    if ARGV[3] == '1' then
      redis.call('XACK', KEYS[1], ARGV[1], ARGV[i])
      redis.call('XDEL', KEYS[1], ARGV[i])
    else
      redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[i], 'JUSTID')
    end
  end
end
return held
"""

# KEYS: lease, owner ; ARGV: session_id, gateway
CLAIM = """
local generation = redis.call('HINCRBY', KEYS[1], ARGV[1], 1)
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
return generation
"""

# KEYS: lease, owner, seen ; ARGV: session_id, gateway
RELEASE = """
if redis.call('HGET', KEYS[2], ARGV[1]) == ARGV[2] then
  redis.call('HDEL', KEYS[2], ARGV[1])
  redis.call('DEL', KEYS[3])
  return 1
end
return 0
"""
