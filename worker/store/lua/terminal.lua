-- Shared by the programs that settle a job: the terminal statuses, Redis's clock in ms,
-- and settling (status, settled_at, and the job's TTL on KEYS[2..4]).
local TERMINAL = {succeeded=true, failed=true, cancelled=true, timed_out=true, lost=true}
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function settle(status, ttl)
  redis.call('HSET', KEYS[2], 'status', status, 'settled_at', now_ms())
  for i = 2, 4 do redis.call('EXPIRE', KEYS[i], ttl) end
end
