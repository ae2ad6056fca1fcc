-- ARGV: attempt, expected last seq, line (seq = expected + 1), ttl_s, maxlen, settled_ttl_s.
-- 'lost' written; 'alive' lease held; 'moved' another attempt; 'settled' nothing to do;
-- 'retry' an event landed since the caller read the state.
if redis.call('EXISTS', KEYS[1]) == 1 then return 'alive' end
local st = redis.call('HMGET', KEYS[2], 'attempt', 'status', 'ev_attempt', 'ev_seq')
if st[1] ~= ARGV[1] then return 'moved' end
if st[2] ~= 'running' then return 'settled' end
local last = 0
if st[3] == ARGV[1] then last = tonumber(st[4]) or 0 end
if last ~= tonumber(ARGV[2]) then return 'retry' end
redis.call('HINCRBY', KEYS[2], 'fence', 1)
redis.call('XADD', KEYS[3], '*', 'event', ARGV[3])
trim_events(ARGV[5])
redis.call('HSET', KEYS[2], 'ev_attempt', ARGV[1], 'ev_seq', last + 1, 'token', '')
settle('lost', ARGV[4], ARGV[6])
return 'lost'
