-- A draining worker hands its attempt back (called by append.lua with the id of the
-- attempt's job.completed): the job is not settled (no settled_at, no TTL, no settlement
-- record); the next attempt is queued as `submit --new-attempt` would queue it, with the
-- same spec, its broker message not yet published (enqueued 0: the worker publishes it
-- next, and a `submit` or `requeue` of the job would too). The lease is dropped here, so
-- from this call on the handed-back owner's token is refused everywhere (events,
-- interaction records, renewals) and the next attempt's delivery is never refused `held`.
local function hand_back(after)
  local attempt = tonumber(redis.call('HGET', KEYS[2], 'attempt')) + 1
  redis.call('HSET', KEYS[2], 'attempt', attempt, 'status', 'queued', 'enqueued', '0',
    'submitted_at', now_ms(), 'attempt_after', after)
  redis.call('HDEL', KEYS[2], 'started_at', 'settled_at', 'worker', 'token', 'enqueue_claim')
  redis.call('DEL', KEYS[1])
end
