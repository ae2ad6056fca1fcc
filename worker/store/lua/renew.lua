-- KEYS: lease. ARGV: token, ttl_ms. 1 renewed, 0 the lease is not ours any more.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
