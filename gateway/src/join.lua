-- Puts a fan in the waiting room.
-- KEYS: 1 config, 2 queue, 3 seq, 4 active, 5 stock, 6 joins ; ARGV: 1 fan id, 2 now (ms)
-- Returns {outcome, a, b, rate in milli-fans/s}:
--   waiting a=position b=1 when the fan was already queued | admitted a=expiry (ms)
--   not-open a=ms until joining opens | unknown | closed | sold-out | room-full
-- Guarantees: a fan is queued at most once and a repeat join keeps the first
-- place; the queue never grows past max_queue; nobody joins a sold-out event.
-- Order: before opens_at (prequeue) a fan's score is the first 48 bits of
-- SHA-1(seed:fan), a random order fixed by the seed whose SHA-256 was
-- published in advance; from opens_at, 2^48 + join sequence, strictly FIFO
-- behind every prequeue fan.
local cfg = redis.call('HMGET', KEYS[1], 'prequeue_at_ms', 'max_queue', 'state', 'rate', 'paused', 'opens_at_ms', 'seed')
if not cfg[1] then return {'unknown', 0, 0, 0} end
if cfg[3] == 'closed' then return {'closed', 0, 0, 0} end
if tonumber(redis.call('HGET', KEYS[5], 'remaining') or '1') <= 0 then return {'sold-out', 0, 0, 0} end
local now = tonumber(ARGV[2])
if now < tonumber(cfg[1]) then return {'not-open', tonumber(cfg[1]) - now, 0, 0} end
local rate = 0
if cfg[5] ~= '1' then rate = math.floor(tonumber(cfg[4]) * 1000) end
local rank = redis.call('ZRANK', KEYS[2], ARGV[1])
if rank then return {'waiting', rank + 1, 1, rate} end
local expiry = tonumber(redis.call('ZSCORE', KEYS[4], ARGV[1]) or '0')
if expiry > now then return {'admitted', expiry, 1, rate} end
if redis.call('ZCARD', KEYS[2]) >= tonumber(cfg[2]) then return {'room-full', 0, 0, rate} end
local score
if now < tonumber(cfg[6]) then
  score = tonumber(string.sub(redis.sha1hex(cfg[7] .. ':' .. ARGV[1]), 1, 12), 16)
else
  local seq = redis.call('INCR', KEYS[3])
  score = 281474976710656 + seq
  -- A (sequence → time) sample a second, so ops can see how long the head has waited.
  local newest = redis.call('ZRANGE', KEYS[6], -1, -1)[1]
  if not newest or now - tonumber(string.match(newest, ':(%d+)$')) >= 1000 then
    redis.call('ZADD', KEYS[6], seq, seq .. ':' .. ARGV[2])
    redis.call('ZREMRANGEBYRANK', KEYS[6], 0, -86401)
  end
end
-- Formatted by hand: Lua would print a large number as %.14g and lose digits.
redis.call('ZADD', KEYS[2], string.format('%.0f', score), ARGV[1])
return {'waiting', redis.call('ZRANK', KEYS[2], ARGV[1]) + 1, 0, rate}
