-- Puts fans in the waiting room: the joins that reached one gateway together
-- (gateway/src/joins.rs), each as if it had come alone, in the order given.
-- KEYS: 1 queue, 2 seq, 3 active, 4 joins
-- ARGV: 1 now (ms), 2 max_queue, 3 '1' to record a (sequence, time) sample,
--       4 '1' if prequeue scores follow the ids ('0' once the line is open),
--       then the fans' ids, then (if ARGV[4] is '1') each fan's prequeue score
--       in the same order ('' for a fan that joins once the line is open)
-- Returns the line's length before the call, then one line a fan, in their
-- order, all in one string (one bulk reply costs less to send and to parse
-- than an array): '' a new fan put last in line (its place is the length
-- before the call plus the fans placed up to and including it: the '' lines
-- and the 'waiting A 0' ones) | waiting A=position B=1 if already queued |
-- admitted A=expiry (ms) 1 | room-full 0 0
-- Guarantees: a fan is queued at most once and a repeat join keeps the first
-- place (a fan twice in one call included); the queue never grows past
-- max_queue. The caller has checked, from the event's settings, that the
-- event exists, is not closed or sold out and takes joins now.
-- Order: during prequeue the score is the fan's place in the seeded shuffle
-- (below 2^48); from opening it is 2^48 + join sequence, strictly FIFO behind
-- every prequeue fan, so a new FIFO fan is always last in line.
-- Cost: Lua's own is most of a script's (about 64,000 instructions of Redis a
-- call and 13,400 a new fan, against 10,400-10,900 for a whole bare ZADD:
-- scripts/join_script_cost.sh), and a new fan's share is mostly the strings
-- and tables it makes. So the fans are looked up by two ZMSCOREs and the new
-- FIFO fans numbered by one INCRBY and added by one ZADD, however many come
-- in a call; a new FIFO fan, the crowd's usual join, gets no answer string of
-- its own; and numbers are written with '%d' (an integer's digits), not as
-- floats ('%.0f', or Lua's own tostring), whose formatting is glibc's
-- costliest path.
local now, max_queue = tonumber(ARGV[1]), tonumber(ARGV[2])
local prequeue = ARGV[4] == '1'
local n = prequeue and (#ARGV - 4) / 2 or #ARGV - 4
local in_line = redis.call('ZMSCORE', KEYS[1], unpack(ARGV, 5, 4 + n))
local expiries = redis.call('ZMSCORE', KEYS[3], unpack(ARGV, 5, 4 + n))
local queued = redis.call('ZCARD', KEYS[1])
local before = queued
local seq -- the last join sequence given, once a FIFO fan is added
local adds, added, placed, answers = {}, 0, {}, {}
-- New FIFO fans wait in `adds` and are added, with their sequence numbers,
-- before any rank is read.
local function add_waiting()
  if added == 0 then return end
  seq = redis.call('INCRBY', KEYS[2], string.format('%d', added))
  local scored = {}
  for i = 1, added do
    -- 2^48 + sequence is below 2^53: '%d' writes it exactly.
    scored[2 * i - 1] = string.format('%d', 281474976710656 + seq - added + i)
    scored[2 * i] = adds[i]
  end
  redis.call('ZADD', KEYS[1], unpack(scored))
  adds, added = {}, 0
end
for i = 1, n do
  local fan = ARGV[4 + i]
  local expiry = expiries[i]
  if in_line[i] or placed[fan] then
    add_waiting()
    answers[i] = string.format('waiting %d 1', redis.call('ZRANK', KEYS[1], fan) + 1)
  elseif expiry and tonumber(expiry) > now then
    answers[i] = string.format('admitted %d 1', expiry)
  elseif queued >= max_queue then
    answers[i] = 'room-full 0 0'
  elseif prequeue and ARGV[4 + n + i] ~= '' then
    -- Ahead of every FIFO fan: those still in `adds` do not change its rank.
    redis.call('ZADD', KEYS[1], ARGV[4 + n + i], fan)
    queued = queued + 1
    placed[fan] = true
    answers[i] = string.format('waiting %d 0', redis.call('ZRANK', KEYS[1], fan) + 1)
  else
    -- Last in line: its place is the length of the line with it, which the
    -- caller counts from `before`.
    queued = queued + 1
    placed[fan] = true
    added = added + 1
    adds[added] = fan
    answers[i] = ''
  end
end
add_waiting()
if seq and ARGV[3] == '1' then
  redis.call('ZADD', KEYS[4], string.format('%d', seq), string.format('%d:%s', seq, ARGV[1]))
  redis.call('ZREMRANGEBYRANK', KEYS[4], 0, -86401)
end
return string.format('%d', before) .. '\n' .. table.concat(answers, '\n')
