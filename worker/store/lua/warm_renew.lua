-- KEYS: slot. ARGV: owner, ttl_ms, register (1: record a new idle slot).
-- 1: the idle slot's lease runs ttl_ms from now; 0: it is not this owner's idle slot
-- any more (claimed, or lapsed: the pool then destroys it).
local value = 'idle ' .. ARGV[1]
if ARGV[3] == '1' then
  if redis.call('SET', KEYS[1], value, 'NX', 'PX', ARGV[2]) then
    return 1
  end
  return 0
end
if redis.call('GET', KEYS[1]) ~= value then
  return 0
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
