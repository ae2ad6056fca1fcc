-- Publishing an attempt's broker message exactly once. ARGV: op, attempt, claim id, hold_ms.
--   claim: 1 when the caller may publish: the attempt is current and queued, its message
--     not sent, and no other claim is live (a claim lapses hold_ms after it was taken, so
--     a submitter that died between claim and publish does not block the job for good).
--     A live claim with the caller's own claim id is taken again: a submit interrupted
--     mid-publish (a failover) retried by the same client publishes at once.
--   reclaim: as claim, but whether the message was sent is not asked (``Client.requeue``:
--     after Redis came back from an older snapshot, a queued attempt's message may have
--     been consumed already); still only for the current attempt, queued, with no live
--     claim, so requeues racing each other or a submit publish one message at a time.
--   done: the message was published: enqueued = 1, the claim (if still ours) dropped.
--   release: the publish failed: the claim (if still ours) dropped, so a retry publishes.
-- done and release do nothing to a later attempt (0).
local st = redis.call('HMGET', KEYS[2], 'attempt', 'status', 'enqueued', 'enqueue_claim')
if st[1] ~= ARGV[2] then return 0 end
local op = ARGV[1]
if op == 'claim' or op == 'reclaim' then
  if st[2] ~= 'queued' or (op == 'claim' and st[3] == '1') then return 0 end
  if st[4] and string.sub(st[4], 1, #ARGV[3] + 1) ~= ARGV[3] .. ' ' then
    local lapses = tonumber(string.match(st[4], ' (%d+)$'))
    if lapses and lapses > now_ms() then return 0 end
  end
  redis.call('HSET', KEYS[2], 'enqueue_claim', ARGV[3] .. ' ' .. (now_ms() + tonumber(ARGV[4])))
  return 1
end
if op == 'done' then redis.call('HSET', KEYS[2], 'enqueued', '1') end
if st[4] and string.sub(st[4], 1, #ARGV[3] + 1) == ARGV[3] .. ' ' then
  redis.call('HDEL', KEYS[2], 'enqueue_claim')
end
return 1
