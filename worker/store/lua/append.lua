-- ARGV: token, attempt, maxlen, ttl_s, settled_ttl_s, then (seq, terminal status or '',
-- line) triples. The terminal status 'handed_back' (a draining worker's job.completed)
-- ends the attempt without settling the job: the next attempt is queued in the same call.
-- -1: fenced (the lease is not ours). Otherwise the number of lines appended; a seq at
-- or below the last one written (a retried batch whose reply was lost) is skipped.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -1 end
local st = redis.call('HMGET', KEYS[2], 'ev_attempt', 'ev_seq')
local last = 0
if st[1] == ARGV[2] then last = tonumber(st[2]) or 0 end
local written = 0
for i = 6, #ARGV, 3 do
  local seq = tonumber(ARGV[i])
  if seq > last then
    local id = redis.call('XADD', KEYS[3], '*', 'event', ARGV[i + 2])
    last = seq
    written = written + 1
    redis.call('HSET', KEYS[2], 'ev_attempt', ARGV[2], 'ev_seq', last)
    if ARGV[i + 1] == 'handed_back' then
      hand_back(id)
      break
    end
    if ARGV[i + 1] ~= '' then settle(ARGV[i + 1], ARGV[4], ARGV[5]) end
  end
end
if written > 0 then trim_events(ARGV[3]) end
return written
