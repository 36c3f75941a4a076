-- Puts fans in the waiting room: the joins that reached one gateway together
-- (gateway/src/joins.rs), each as if it had come alone, in the order given.
-- KEYS: 1 queue, 2 seq, 3 active, 4 joins
-- ARGV: 1 now (ms), 2 max_queue, 3 '1' to record a (sequence, time) sample,
--       then for each fan its id and its prequeue score ('' once open)
-- Returns one line a fan, in their order, each 'OUTCOME A B' (one string: one
-- bulk reply costs less to send and to parse than an array): waiting
-- A=position B=1 if already queued | admitted A=expiry (ms) 1 | room-full 0 0
-- Guarantees: a fan is queued at most once and a repeat join keeps the first
-- place (a fan twice in one call included); the queue never grows past
-- max_queue. The caller has checked, from the event's settings, that the
-- event exists, is not closed or sold out and takes joins now.
-- Order: during prequeue the score is the fan's place in the seeded shuffle
-- (below 2^48); from opening it is 2^48 + join sequence, strictly FIFO behind
-- every prequeue fan, so a new FIFO fan is always last in line.
-- Cost: Lua's own, about 2.6 us a call and 0.6 us a redis.call, is most of a
-- script's; so the fans are looked up by two ZMSCOREs and the new FIFO fans
-- numbered by one INCRBY and added by one ZADD, however many come in a call.
local now, max_queue = tonumber(ARGV[1]), tonumber(ARGV[2])
local fans = {}
for i = 4, #ARGV, 2 do fans[#fans + 1] = ARGV[i] end
local in_line = redis.call('ZMSCORE', KEYS[1], unpack(fans))
local expiries = redis.call('ZMSCORE', KEYS[3], unpack(fans))
local queued = redis.call('ZCARD', KEYS[1])
local seq -- the last join sequence given, once a FIFO fan is added
local adds, placed, answers = {}, {}, {}
-- New FIFO fans wait in `adds` and are added, with their sequence numbers,
-- before any rank is read.
local function add_waiting()
  local count = #adds
  if count == 0 then return end
  seq = redis.call('INCRBY', KEYS[2], count)
  local scored = {}
  for i, fan in ipairs(adds) do
    -- Formatted by hand: Lua would print a large number as %.14g and lose digits.
    scored[2 * i - 1] = string.format('%.0f', 281474976710656 + seq - count + i)
    scored[2 * i] = fan
  end
  redis.call('ZADD', KEYS[1], unpack(scored))
  adds = {}
end
for n, fan in ipairs(fans) do
  local prequeue = ARGV[3 + 2 * n]
  local expiry = tonumber(expiries[n] or '0')
  if in_line[n] or placed[fan] then
    add_waiting()
    answers[n] = string.format('waiting %d 1', redis.call('ZRANK', KEYS[1], fan) + 1)
  elseif expiry > now then
    answers[n] = string.format('admitted %d 1', expiry)
  elseif queued >= max_queue then
    answers[n] = 'room-full 0 0'
  elseif prequeue ~= '' then
    -- Ahead of every FIFO fan: those still in `adds` do not change its rank.
    redis.call('ZADD', KEYS[1], prequeue, fan)
    queued = queued + 1
    placed[fan] = true
    answers[n] = string.format('waiting %d 0', redis.call('ZRANK', KEYS[1], fan) + 1)
  else
    queued = queued + 1
    placed[fan] = true
    adds[#adds + 1] = fan
    -- Last in line: its place is the length of the line with it.
    answers[n] = string.format('waiting %d 0', queued)
  end
end
add_waiting()
if seq and ARGV[3] == '1' then
  redis.call('ZADD', KEYS[4], seq, string.format('%d:%s', seq, ARGV[1]))
  redis.call('ZREMRANGEBYRANK', KEYS[4], 0, -86401)
end
return table.concat(answers, '\n')
