-- KEYS: lease, interactions. ARGV: token ('' for a job run outside the service, which
-- holds no lease), interaction id, record JSON, ttl_s.
-- 1 written; 0 fenced: the lease is not the writer's, nothing was written.
if ARGV[1] ~= '' and redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[2], ARGV[2], ARGV[3])
redis.call('EXPIRE', KEYS[2], ARGV[4])
return 1
