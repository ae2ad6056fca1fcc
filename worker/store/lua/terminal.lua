-- Shared by the programs that settle a job: the terminal statuses, Redis's clock in ms,
-- and settling (status, settled_at, and the job's TTL on KEYS[2..4]). Settling also
-- writes the settlement record KEYS[5] (attempt, status, settled_at), which outlives the
-- job's other keys (settled_ttl, never below ttl): a broker message of the job delivered
-- again after they expired is refused by it instead of running as a new job.
local TERMINAL = {succeeded=true, failed=true, cancelled=true, timed_out=true, lost=true}
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function settle(status, ttl, settled_ttl)
  local now = now_ms()
  redis.call('HSET', KEYS[2], 'status', status, 'settled_at', now)
  for i = 2, 4 do redis.call('EXPIRE', KEYS[i], ttl) end
  local attempt = redis.call('HGET', KEYS[2], 'attempt')
  redis.call('DEL', KEYS[5])
  redis.call('HSET', KEYS[5], 'attempt', attempt, 'status', status, 'settled_at', now)
  redis.call('EXPIRE', KEYS[5], math.max(tonumber(settled_ttl), tonumber(ttl)))
end
-- The settlement record of a job whose state is gone: {attempt, status}, or nil.
local function settled_record()
  local rec = redis.call('HMGET', KEYS[5], 'attempt', 'status')
  if rec[1] == false then return nil end
  return {tonumber(rec[1]), rec[2] or ''}
end
