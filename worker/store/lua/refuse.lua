-- ARGV: reason. Count a delivery refused the lease (duplicates, last_refusal) in the
-- job's state; when its keys expired, in its settlement record (no state is made for it).
-- 2 counted in the state, 5 in the record, 0 nowhere (neither exists).
if redis.call('EXISTS', KEYS[2]) == 1 then
  redis.call('HINCRBY', KEYS[2], 'duplicates', 1)
  redis.call('HSET', KEYS[2], 'last_refusal', ARGV[1])
  return 2
end
if redis.call('EXISTS', KEYS[5]) == 0 then return 0 end
redis.call('HINCRBY', KEYS[5], 'duplicates', 1)
redis.call('HSET', KEYS[5], 'last_refusal', ARGV[1])
return 5
