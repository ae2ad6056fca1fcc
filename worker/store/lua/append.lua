-- ARGV: token, attempt, maxlen, ttl_s, settled_ttl_s, gap ('0' refuse, '1' accept), then
-- (seq, terminal status or '', line) triples. The terminal status 'handed_back' (a
-- draining worker's job.completed) ends the attempt without settling the job: the next
-- attempt is queued in the same call.
-- -1: fenced (the lease is not ours). {-2, last}: the batch begins past last + 1, so
-- lines this attempt had written are gone (a failover to a replica that did not have
-- them yet); with gap '1' it is written anyway and the missing seqs are recorded in the
-- state's ev_gap ("from-to", comma-separated). Otherwise the number of lines appended; a
-- seq at or below the last one written (a retried batch whose reply was lost) is skipped.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -1 end
local st = redis.call('HMGET', KEYS[2], 'ev_attempt', 'ev_seq', 'ev_gap')
local last = 0
if st[1] == ARGV[2] then last = tonumber(st[2]) or 0 end
local first = tonumber(ARGV[7])
if first ~= nil and first > last + 1 then
  if ARGV[6] ~= '1' then return {-2, last} end
  local gap = (last + 1) .. '-' .. (first - 1)
  if st[3] then gap = st[3] .. ',' .. gap end
  redis.call('HSET', KEYS[2], 'ev_gap', gap)
end
local written = 0
for i = 7, #ARGV, 3 do
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
