-- Puts a fan in the waiting room.
-- KEYS: 1 queue, 2 seq, 3 active, 4 joins
-- ARGV: 1 fan id, 2 now (ms), 3 max_queue, 4 prequeue score ('' once open),
--       5 '1' to record a (sequence, time) sample
-- Returns 'OUTCOME A B', one string (one bulk reply costs less to send and to
-- parse than an array): waiting A=position B=1 if already queued |
--   admitted A=expiry (ms) | room-full
-- Guarantees: a fan is queued at most once and a repeat join keeps the first
-- place; the queue never grows past max_queue. The caller has checked, from
-- the event's settings, that the event exists, is not closed or sold out and
-- takes joins now.
-- Order: during prequeue the score is the fan's place in the seeded shuffle
-- (below 2^48); from opening it is 2^48 + join sequence, strictly FIFO behind
-- every prequeue fan, so a new FIFO fan is always last in line.
local rank = redis.call('ZRANK', KEYS[1], ARGV[1])
if rank then return string.format('waiting %d 1', rank + 1) end
local expiry = tonumber(redis.call('ZSCORE', KEYS[3], ARGV[1]) or '0')
if expiry > tonumber(ARGV[2]) then return string.format('admitted %d 1', expiry) end
local queued = redis.call('ZCARD', KEYS[1])
if queued >= tonumber(ARGV[3]) then return 'room-full 0 0' end
if ARGV[4] ~= '' then
  redis.call('ZADD', KEYS[1], ARGV[4], ARGV[1])
  return string.format('waiting %d 0', redis.call('ZRANK', KEYS[1], ARGV[1]) + 1)
end
local seq = redis.call('INCR', KEYS[2])
-- Formatted by hand: Lua would print a large number as %.14g and lose digits.
redis.call('ZADD', KEYS[1], string.format('%.0f', 281474976710656 + seq), ARGV[1])
if ARGV[5] == '1' then
  redis.call('ZADD', KEYS[4], seq, seq .. ':' .. ARGV[2])
  redis.call('ZREMRANGEBYRANK', KEYS[4], 0, -86401)
end
-- Last in line, behind the `queued` fans counted above.
return string.format('waiting %d 0', queued + 1)
