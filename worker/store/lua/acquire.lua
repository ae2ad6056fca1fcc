-- ARGV: ttl_ms, worker_id, attempt ('' = the state's), job JSON for a job never submitted,
-- nonce. The lease holds '<token>:<nonce>', this acquire's own value: a fence compares
-- all of it, so if a failover loses an acquire and the counter grants its token again,
-- the two owners still differ.
local st = redis.call('HMGET', KEYS[2], 'attempt', 'status')
local current = tonumber(st[1])
if current == nil then
  -- No state: a new job, or one whose keys expired after it settled, which its
  -- settlement record remembers: a delivery of that attempt (or an earlier one) is refused.
  local rec = settled_record()
  if rec then
    local asked = tonumber(ARGV[3]) or rec[1]
    if asked < rec[1] then return {'stale', tostring(rec[1]), rec[2]} end
    if asked == rec[1] then return {'settled', tostring(asked), rec[2]} end
  end
end
local attempt = tonumber(ARGV[3]) or current or 1
if current ~= nil then
  if attempt < current then return {'stale', tostring(current), st[2] or ''} end
  if attempt == current and TERMINAL[st[2]] then
    return {'settled', tostring(attempt), st[2]}
  end
end
local holder = redis.call('GET', KEYS[1])
if holder then return {'held', tostring(attempt), string.match(holder, '^[^:]*')} end
if attempt == current and st[2] == 'running' then
  return {'orphaned', tostring(attempt), 'running'}
end
local token = redis.call('HINCRBY', KEYS[2], 'fence', 1)
local value = tostring(token)
if ARGV[5] and ARGV[5] ~= '' then value = value .. ':' .. ARGV[5] end
redis.call('SET', KEYS[1], value, 'PX', ARGV[1])
redis.call('HSET', KEYS[2], 'attempt', attempt, 'status', 'running', 'token', token,
  'worker', ARGV[2], 'started_at', now_ms())
if redis.call('HEXISTS', KEYS[2], 'job') == 0 then redis.call('HSET', KEYS[2], 'job', ARGV[4]) end
for i = 2, 4 do redis.call('PERSIST', KEYS[i]) end
return {'acquired', tostring(attempt), tostring(token)}
