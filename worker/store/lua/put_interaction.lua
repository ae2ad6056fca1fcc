-- KEYS: lease, interactions. ARGV: token ('' for a job run outside the service, which
-- holds no lease), interaction id, record JSON, ttl_s.
-- 1 written; 0 fenced: the lease is not the writer's, nothing was written. The lease's
-- token is compared (its part before ':'), not the acquire's nonce.
if ARGV[1] ~= '' then
  local holder = redis.call('GET', KEYS[1])
  if not holder or string.match(holder, '^[^:]*') ~= ARGV[1] then return 0 end
end
redis.call('HSET', KEYS[2], ARGV[2], ARGV[3])
redis.call('EXPIRE', KEYS[2], ARGV[4])
return 1
