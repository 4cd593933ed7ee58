"""The Lua scripts of `supervisor.stores._redis.RedisStore`: each write (and
each read that must see one moment) is one script, so it is atomic on its
session's slot. The keys each takes are the store's (``KEYS[1]`` the
record's hash, ``KEYS[2]`` the events stream, ``KEYS[3]`` the inputs hash)."""

from __future__ import annotations

__all__ = [
    "ACQUIRE",
    "BIND_IDENTITY",
    "CLAIM_INPUT",
    "COMMIT",
    "CREATE",
    "DELETE",
    "FENCE",
    "MARK_HANDLED",
    "RECORD_CLIENT_SEQ",
    "RENEW",
]

_NOW_MS = "local t = redis.call('TIME') local now = t[1] * 1000 + math.floor(t[2] / 1000) "

# ARGV: lease_ms, ttl_ms, the field args ('td' and the token digest first). A
# create sent again after its answer was lost finds its own session (its token
# digest, fresh for each create, and epoch 1: nobody wrote since) and answers
# as the first did.
CREATE = (
    _NOW_MS
    + """
if redis.call('EXISTS', KEYS[1]) == 1 then
  if redis.call('HGET', KEYS[1], 'td') == ARGV[4]
     and redis.call('HGET', KEYS[1], 'epoch') == '1' then return 1 end
  return 0
end
redis.call('DEL', KEYS[2], KEYS[3])
redis.call('HSET', KEYS[1], 'epoch', 1, 'lease_until', now + tonumber(ARGV[1]),
           unpack(ARGV, 3))
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
"""
)

# Marks client events handled (`actors._client_seqs.ClientWatermark.with_handled`,
# alike): the session hash's ``cs`` is the watermark, ``ch`` the runs handled
# above it ("first-last,first-last").
MARK_HANDLED = """
local function mark_handled(key, seqs)
  local last = tonumber(redis.call('HGET', key, 'cs') or '0')
  local runs = {}
  for first, final in string.gmatch(redis.call('HGET', key, 'ch') or '', '(%d+)-(%d+)') do
    runs[#runs + 1] = {tonumber(first), tonumber(final)}
  end
  for _, seq in ipairs(seqs) do
    if seq > last then
      local i = 1
      while i <= #runs and runs[i][2] < seq - 1 do i = i + 1 end
      if i > #runs or runs[i][1] > seq + 1 then
        table.insert(runs, i, {seq, seq})
      else
        if seq < runs[i][1] then runs[i][1] = seq end
        if seq > runs[i][2] then runs[i][2] = seq end
        if i < #runs and runs[i + 1][1] <= runs[i][2] + 1 then
          if runs[i + 1][2] > runs[i][2] then runs[i][2] = runs[i + 1][2] end
          table.remove(runs, i + 1)
        end
      end
    end
  end
  while #runs > 0 and runs[1][1] <= last + 1 do
    if runs[1][2] > last then last = runs[1][2] end
    table.remove(runs, 1)
  end
  local parts = {}
  for i, run in ipairs(runs) do parts[i] = string.format('%d-%d', run[1], run[2]) end
  redis.call('HSET', key, 'cs', string.format('%d', last), 'ch', table.concat(parts, ','))
end
"""

# ARGV: epoch, lease_ms, ttl_ms, expect_digest|'', trim_through|'', n_field_args,
# the field args, n_settles, the settled input keys, n_handled, the handled
# client_seqs, then 4 per event: sequence, encoded, created_at, encoded_bytes.
# Appends must follow the stored head (or the commit's new trim boundary, past
# which a store_lost skip or an ack moved the journal), one after another: an
# owner whose store lost its last writes (a replica promoted without them)
# writing on from its own head would leave a hole a later owner replays past.
COMMIT = (
    _NOW_MS
    + MARK_HANDLED
    + """
local epoch = redis.call('HGET', KEYS[1], 'epoch')
if not epoch then return -1 end
if tonumber(epoch) ~= tonumber(ARGV[1]) then return -2 end
if tonumber(redis.call('HGET', KEYS[1], 'lease_until')) < now then return -3 end
if ARGV[4] ~= '' and redis.call('HGET', KEYS[1], 'td') ~= ARGV[4] then return -4 end
local nf = tonumber(ARGV[6])
local ns = tonumber(ARGV[7 + nf])
local nh = tonumber(ARGV[8 + nf + ns])
local first = 9 + nf + ns + nh
local top = tonumber(redis.call('HGET', KEYS[1], 'ns')) - 1
if ARGV[5] ~= '' and tonumber(ARGV[5]) > top then top = tonumber(ARGV[5]) end
for i = first, #ARGV, 4 do
  local seq = tonumber(ARGV[i])
  if seq ~= top + 1 then return -5 end
  top = seq
end
for i = first, #ARGV, 4 do
  redis.call('XADD', KEYS[2], '0-' .. ARGV[i], 'e', ARGV[i + 1], 't', ARGV[i + 2],
             'b', ARGV[i + 3])
end
if ARGV[5] ~= '' then
  redis.call('XTRIM', KEYS[2], 'MINID', '0-' .. (tonumber(ARGV[5]) + 1))
end
if nf > 0 then
  redis.call('HSET', KEYS[1], unpack(ARGV, 7, 6 + nf))
elseif first <= #ARGV then
  redis.call('HSET', KEYS[1], 'ns', top + 1)
end
for i = 8 + nf, 7 + nf + ns do redis.call('HSET', KEYS[3], ARGV[i], '') end
if nh > 0 then
  local handled = {}
  for i = 9 + nf + ns, 8 + nf + ns + nh do handled[#handled + 1] = tonumber(ARGV[i]) end
  mark_handled(KEYS[1], handled)
end
redis.call('HSET', KEYS[1], 'lease_until', now + tonumber(ARGV[2]))
redis.call('PEXPIRE', KEYS[1], ARGV[3])
redis.call('PEXPIRE', KEYS[2], ARGV[3])
redis.call('PEXPIRE', KEYS[3], ARGV[3])
return 1
"""
)

ACQUIRE = (
    _NOW_MS
    + """
if redis.call('HGET', KEYS[1], 'td') ~= ARGV[3] then return false end
local epoch = redis.call('HINCRBY', KEYS[1], 'epoch', 1)
redis.call('HSET', KEYS[1], 'lease_until', now + tonumber(ARGV[1]))
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('PEXPIRE', KEYS[2], ARGV[2])
redis.call('PEXPIRE', KEYS[3], ARGV[2])
return {redis.call('HGETALL', KEYS[1]), redis.call('XRANGE', KEYS[2], '-', '+')}
"""
)

# ARGV: epoch, lease_ms, ttl_ms, nonce. The fence's answer may be lost too: a
# fence sent again with the same nonce finds its own epoch (``fn``) and answers
# as the first did, never "replaced" by itself.
FENCE = (
    _NOW_MS
    + """
local epoch = redis.call('HGET', KEYS[1], 'epoch')
if not epoch then return -1 end
local ours = tonumber(epoch) == tonumber(ARGV[1]) + 1
  and redis.call('HGET', KEYS[1], 'fn') == ARGV[4]
if not ours then
  if tonumber(epoch) ~= tonumber(ARGV[1]) then return -2 end
  if tonumber(redis.call('HGET', KEYS[1], 'lease_until')) < now then return -3 end
  redis.call('HINCRBY', KEYS[1], 'epoch', 1)
  redis.call('HSET', KEYS[1], 'fn', ARGV[4])
end
redis.call('HSET', KEYS[1], 'lease_until', now + tonumber(ARGV[2]))
redis.call('PEXPIRE', KEYS[1], ARGV[3])
redis.call('PEXPIRE', KEYS[2], ARGV[3])
redis.call('PEXPIRE', KEYS[3], ARGV[3])
return redis.call('HGETALL', KEYS[1])
"""
)

RENEW = (
    _NOW_MS
    + """
local epoch = redis.call('HGET', KEYS[1], 'epoch')
if not epoch or tonumber(epoch) ~= tonumber(ARGV[1]) then return 0 end
if tonumber(redis.call('HGET', KEYS[1], 'lease_until')) < now then return 0 end
redis.call('HSET', KEYS[1], 'lease_until', now + tonumber(ARGV[2]))
redis.call('PEXPIRE', KEYS[1], ARGV[3])
redis.call('PEXPIRE', KEYS[2], ARGV[3])
redis.call('PEXPIRE', KEYS[3], ARGV[3])
return 1
"""
)

DELETE = """
local epoch = redis.call('HGET', KEYS[1], 'epoch')
if epoch and tonumber(epoch) == tonumber(ARGV[1]) then
  redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
end
return 1
"""

BIND_IDENTITY = """
if redis.call('EXISTS', KEYS[1]) == 1 then redis.call('HSET', KEYS[1], 'idn', ARGV[1]) end
return 1
"""

# ARGV: client_seq, handled (`MARK_HANDLED`).
RECORD_CLIENT_SEQ = (
    MARK_HANDLED
    + """
if redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
mark_handled(KEYS[1], {tonumber(ARGV[1])})
return 1
"""
)

# ARGV: claimant, input key, ttl_ms. 1: claimed (now, or by this claimant's
# earlier try whose reply was lost); 0: answered; -1: no session.
CLAIM_INPUT = """
if redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
local held = redis.call('HGET', KEYS[3], ARGV[2])
if held == '' then return 0 end
if held == ARGV[1] then return 1 end
redis.call('HSET', KEYS[3], ARGV[2], ARGV[1])
redis.call('PEXPIRE', KEYS[3], ARGV[3])
return 1
"""
