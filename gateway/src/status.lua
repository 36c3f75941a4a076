-- Where a queued fan stands. Read-only.
-- KEYS: 1 config, 2 queue, 3 active, 4 stock ; ARGV: 1 fan id, 2 now (ms)
-- Returns {outcome, a, rate in milli-fans/s}:
--   waiting a=position (1 = next) | admitted a=expiry (ms) | expired | sold-out | unknown
local cfg = redis.call('HMGET', KEYS[1], 'rate', 'paused')
if not cfg[1] then return {'unknown', 0, 0} end
if tonumber(redis.call('HGET', KEYS[4], 'remaining') or '1') <= 0 then return {'sold-out', 0, 0} end
local rate = 0
if cfg[2] ~= '1' then rate = math.floor(tonumber(cfg[1]) * 1000) end
local rank = redis.call('ZRANK', KEYS[2], ARGV[1])
if rank then return {'waiting', rank + 1, rate} end
local expiry = tonumber(redis.call('ZSCORE', KEYS[3], ARGV[1]) or '0')
if expiry > tonumber(ARGV[2]) then return {'admitted', expiry, rate} end
return {'expired', 0, rate}
