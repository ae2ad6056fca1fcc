"""The Lua programs that make leases, fencing and settling atomic.

Every per-job program touches only keys of one job (one Redis Cluster slot, thanks to
the ``{J}`` hash tag); the global ``acpw:leases`` index is updated outside them, as a
hint for the reaper, never as the source of truth.

Key order for the per-job programs: ``lease``, ``state``, ``events``, ``control``.
The state hash fields they own:

    attempt     current attempt number          status      queued|running|<terminal>
    fence       last fencing token issued       token       token of the current owner
    worker      current owner's worker id       ev_attempt  attempt of the last event
    ev_seq      seq of the last event written   started_at / settled_at (ms)
    events_trimmed_until    id of the last event trimmed off the stream (absent: none)
    spec_digest     digest of the current attempt's canonical job spec (``SUBMIT``)
    attempt_after   stream id after which the current attempt's events begin (``SUBMIT``)

The events stream is bounded by trimming, never by ``XADD ... MAXLEN``: see ``_TRIM``.
"""

from __future__ import annotations

_TERMINAL = """
local TERMINAL = {succeeded=true, failed=true, cancelled=true, timed_out=true, lost=true}
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function settle(status, ttl)
  redis.call('HSET', KEYS[2], 'status', status, 'settled_at', now_ms())
  for i = 2, 4 do redis.call('EXPIRE', KEYS[i], ttl) end
end
"""

TRIMMED_UNTIL = "events_trimmed_until"
"""State hash field: every event removed from the stream has an id at or below it."""

# The stream keeps the newest ``maxlen`` events (at least 1). Trimming reads what it removes
# (XRANGE has no ids-only form), so it runs only once the stream is over by more than
# ``min(maxlen // 10, 64)`` (at least one event), and reads in pages of 64: a trim holds at
# most 64 events in memory however large they are, and each event is read about once more
# in its life. The id of the last entry removed goes to the state hash in the same program
# that removes it (Redis 7.0's max-deleted-entry-id does not follow MAXLEN trims), so no
# entry is ever gone without the watermark covering it, and none at or below it is left:
# XTRIM MINID of the first entry kept removes exactly the entries read. A reader whose
# cursor is below the watermark has lost events.
_TRIM = f"""
local function trim_events(maxlen)
  maxlen = math.max(1, tonumber(maxlen))
  local excess = redis.call('XLEN', KEYS[3]) - maxlen
  if excess <= math.max(1, math.min(64, math.floor(maxlen / 10))) then return end
  local cursor, last = '-', nil
  while excess > 0 do
    local page = redis.call('XRANGE', KEYS[3], cursor, '+', 'COUNT', math.min(excess, 64))
    last = page[#page][1]
    cursor = '(' .. last
    excess = excess - #page
  end
  local kept = redis.call('XRANGE', KEYS[3], cursor, '+', 'COUNT', 1)
  redis.call('HSET', KEYS[2], '{TRIMMED_UNTIL}', last)
  redis.call('XTRIM', KEYS[3], 'MINID', kept[1][1])
end
"""


ACQUIRE = (
    _TERMINAL
    + """
-- ARGV: ttl_ms, worker_id, attempt ('' = the state's), job JSON for a job never submitted
local st = redis.call('HMGET', KEYS[2], 'attempt', 'status')
local current = tonumber(st[1])
local attempt = tonumber(ARGV[3]) or current or 1
if current ~= nil then
  if attempt < current then return {'stale', tostring(current), st[2] or ''} end
  if attempt == current and TERMINAL[st[2]] then
    return {'settled', tostring(attempt), st[2]}
  end
end
local holder = redis.call('GET', KEYS[1])
if holder then return {'held', tostring(attempt), holder} end
if attempt == current and st[2] == 'running' then
  return {'orphaned', tostring(attempt), 'running'}
end
local token = redis.call('HINCRBY', KEYS[2], 'fence', 1)
redis.call('SET', KEYS[1], token, 'PX', ARGV[1])
redis.call('HSET', KEYS[2], 'attempt', attempt, 'status', 'running', 'token', token,
  'worker', ARGV[2], 'started_at', now_ms())
if redis.call('HEXISTS', KEYS[2], 'job') == 0 then redis.call('HSET', KEYS[2], 'job', ARGV[4]) end
for i = 2, 4 do redis.call('PERSIST', KEYS[i]) end
return {'acquired', tostring(attempt), tostring(token)}
"""
)

RENEW = """
-- ARGV: token, ttl_ms. 1 renewed, 0 the lease is not ours any more.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
"""

RELEASE = """
-- ARGV: token. 1 released, 0 not ours.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
"""

APPEND = (
    _TERMINAL
    + _TRIM
    + """
-- ARGV: token, attempt, maxlen, ttl_s, then (seq, terminal status or '', line) triples.
-- -1: fenced (the lease is not ours). Otherwise the number of lines appended; a seq at
-- or below the last one written (a retried batch whose reply was lost) is skipped.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -1 end
local st = redis.call('HMGET', KEYS[2], 'ev_attempt', 'ev_seq')
local last = 0
if st[1] == ARGV[2] then last = tonumber(st[2]) or 0 end
local written = 0
for i = 5, #ARGV, 3 do
  local seq = tonumber(ARGV[i])
  if seq > last then
    redis.call('XADD', KEYS[3], '*', 'event', ARGV[i + 2])
    last = seq
    written = written + 1
    redis.call('HSET', KEYS[2], 'ev_attempt', ARGV[2], 'ev_seq', last)
    if ARGV[i + 1] ~= '' then settle(ARGV[i + 1], ARGV[4]) end
  end
end
if written > 0 then trim_events(ARGV[3]) end
return written
"""
)

MARK_LOST = (
    _TERMINAL
    + _TRIM
    + """
-- ARGV: attempt, expected last seq, line (seq = expected + 1), ttl_s, maxlen.
-- 'lost' written; 'alive' lease held; 'moved' another attempt; 'settled' nothing to do;
-- 'retry' an event landed since the caller read the state.
if redis.call('EXISTS', KEYS[1]) == 1 then return 'alive' end
local st = redis.call('HMGET', KEYS[2], 'attempt', 'status', 'ev_attempt', 'ev_seq')
if st[1] ~= ARGV[1] then return 'moved' end
if st[2] ~= 'running' then return 'settled' end
local last = 0
if st[3] == ARGV[1] then last = tonumber(st[4]) or 0 end
if last ~= tonumber(ARGV[2]) then return 'retry' end
redis.call('HINCRBY', KEYS[2], 'fence', 1)
redis.call('XADD', KEYS[3], '*', 'event', ARGV[3])
trim_events(ARGV[5])
redis.call('HSET', KEYS[2], 'ev_attempt', ARGV[1], 'ev_seq', last + 1, 'token', '')
settle('lost', ARGV[4])
return 'lost'
"""
)

SUBMIT = (
    _TERMINAL
    + """
-- ARGV: job JSON, new_attempt ('1' or '0'), digest of the canonical spec.
-- Returns {outcome, attempt, status, digest stored}: 'created' a new job, 'retried' a new
-- attempt of a settled job (which may change the spec), 'exists' nothing changed (same
-- spec, or a job whose state records no digest: the caller compares its 'job'),
-- 'conflict' nothing changed: the job exists with another spec.
local function events_end()
  local last = redis.call('XREVRANGE', KEYS[3], '+', '-', 'COUNT', 1)
  if #last == 0 then return '0-0' end
  return last[1][1]
end
local st = redis.call('HMGET', KEYS[2], 'attempt', 'status', 'spec_digest')
if st[1] == false then
  redis.call('HSET', KEYS[2], 'attempt', 1, 'status', 'queued', 'job', ARGV[1],
    'submitted_at', now_ms(), 'spec_digest', ARGV[3], 'attempt_after', events_end())
  return {'created', '1', 'queued', ARGV[3]}
end
if ARGV[2] == '1' and TERMINAL[st[2]] then
  local attempt = tonumber(st[1]) + 1
  redis.call('HSET', KEYS[2], 'attempt', attempt, 'status', 'queued', 'job', ARGV[1],
    'submitted_at', now_ms(), 'enqueued', '0', 'spec_digest', ARGV[3],
    'attempt_after', events_end())
  redis.call('HDEL', KEYS[2], 'settled_at', 'started_at', 'worker', 'token')
  for i = 2, 4 do redis.call('PERSIST', KEYS[i]) end
  return {'retried', tostring(attempt), 'queued', ARGV[3]}
end
if st[3] and st[3] ~= ARGV[3] then return {'conflict', st[1], st[2], st[3]} end
return {'exists', st[1], st[2], st[3] or ''}
"""
)

PUT_INTERACTION = """
-- KEYS: lease, interactions. ARGV: token ('' for a job run outside the service, which
-- holds no lease), interaction id, record JSON, ttl_s.
-- 1 written; 0 fenced: the lease is not the writer's, nothing was written.
if ARGV[1] ~= '' and redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[2], ARGV[2], ARGV[3])
redis.call('EXPIRE', KEYS[2], ARGV[4])
return 1
"""
