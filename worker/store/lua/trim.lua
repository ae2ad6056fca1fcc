-- The stream keeps the newest `maxlen` events (at least 1). Trimming reads what it removes
-- (XRANGE has no ids-only form), so it runs only once the stream is over by more than
-- min(maxlen // 10, 64) (at least one event), and reads in pages of 64: a trim holds at
-- most 64 events in memory however large they are, and each event is read about once more
-- in its life. The id of the last entry removed goes to the state hash
-- (events_trimmed_until) in the same program that removes it (Redis 7.0's
-- max-deleted-entry-id does not follow MAXLEN trims), so no entry is ever gone without the
-- watermark covering it, and none at or below it is left: XTRIM MINID of the first entry
-- kept removes exactly the entries read. A reader whose cursor is below the watermark has
-- lost events.
local function trim_events(maxlen)
  maxlen = math.max(1, tonumber(maxlen))
  local excess = redis.call('XLEN', KEYS[3]) - maxlen
  if excess <= math.max(1, math.min(64, math.floor(maxlen / 10))) then return end
  local cursor, last = '-', nil
  while excess > 0 do
    local page = redis.call('XRANGE', KEYS[3], cursor, '+', 'COUNT', math.min(excess, 64))
    last = page[#page][1]
    cursor = '(' .. last
    excess = excess - #page
  end
  local kept = redis.call('XRANGE', KEYS[3], cursor, '+', 'COUNT', 1)
  redis.call('HSET', KEYS[2], 'events_trimmed_until', last)
  redis.call('XTRIM', KEYS[3], 'MINID', kept[1][1])
end
