-- KEYS: slot. ARGV: owner, job, attempt, token, ttl_ms.
-- 1: the idle slot of this owner is now the attempt's (one use: never idle again);
-- 0: it is gone (its lease lapsed, a reaper judged it) or another claim took it first.
if redis.call('GET', KEYS[1]) ~= 'idle ' .. ARGV[1] then
  return 0
end
redis.call('SET', KEYS[1], 'claimed ' .. ARGV[2] .. ' ' .. ARGV[3] .. ' ' .. ARGV[4],
  'PX', ARGV[5])
return 1
