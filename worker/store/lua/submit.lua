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
  -- A job whose keys expired after it settled goes on from the attempt its settlement
  -- record names, so the old attempt's messages stay refused (stale).
  local rec = settled_record()
  local attempt = 1
  if rec then attempt = rec[1] + 1 end
  redis.call('HSET', KEYS[2], 'attempt', attempt, 'status', 'queued', 'job', ARGV[1],
    'submitted_at', now_ms(), 'spec_digest', ARGV[3], 'attempt_after', events_end())
  return {'created', tostring(attempt), 'queued', ARGV[3]}
end
if ARGV[2] == '1' and TERMINAL[st[2]] then
  local attempt = tonumber(st[1]) + 1
  redis.call('HSET', KEYS[2], 'attempt', attempt, 'status', 'queued', 'job', ARGV[1],
    'submitted_at', now_ms(), 'enqueued', '0', 'spec_digest', ARGV[3],
    'attempt_after', events_end())
  redis.call('HDEL', KEYS[2], 'settled_at', 'started_at', 'worker', 'token', 'enqueue_claim')
  for i = 2, 4 do redis.call('PERSIST', KEYS[i]) end
  return {'retried', tostring(attempt), 'queued', ARGV[3]}
end
if st[3] and st[3] ~= ARGV[3] then return {'conflict', st[1], st[2], st[3]} end
return {'exists', st[1], st[2], st[3] or ''}
