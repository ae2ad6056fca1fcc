-- KEYS: slot. ARGV: owner. 1: this owner's idle slot is gone from the record (never
-- claimable again); 0: it was not idle (a claim took it) or not this owner's.
if redis.call('GET', KEYS[1]) ~= 'idle ' .. ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1])
return 1
