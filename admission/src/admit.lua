-- One admission tick for one event.
-- KEYS: 1 config, 2 queue, 3 active, 4 admit state, 5 lease, 6 stock, 7 admits (rate samples)
-- ARGV: 1 replica id, 2 now (ms), 3 lease (ms), 4 longest tick counted (ms)
-- Returns {admitted or -1 when another replica leads, active, queue length,
--          admitted total, the rate in force in milli-fans/s}: a standby
--          reads the same settings, so every replica reports the same rate
--          (none keeps one from when it led).
--
-- Guarantees, all in one atomic step:
-- * only the lease holder admits, so two replicas never double the rate;
-- * lapsed admissions leave the active set first, so their slots return;
-- * at most rate * dt fans, with the fraction carried to the next tick, and
--   dt capped at ARGV[4], so a late tick or a failover admits at most one
--   extra tick's worth;
-- * never more than max_active active at once;
-- * nobody before opens_at, while paused, after closing or once sold out.
local now = tonumber(ARGV[2])
local cfg = redis.call('HMGET', KEYS[1], 'rate', 'max_active', 'access_ttl_s', 'opens_at_ms', 'paused', 'state')
local rate = tonumber(cfg[1]) or 0
local max_active = tonumber(cfg[2]) or 0
local ttl_ms = (tonumber(cfg[3]) or 0) * 1000
local opens_at = tonumber(cfg[4]) or 0
local remaining = tonumber(redis.call('HGET', KEYS[6], 'remaining') or '1')
local open = now >= opens_at and cfg[5] ~= '1' and cfg[6] ~= 'closed' and remaining > 0 and rate > 0
if not open then rate = 0 end

local holder = redis.call('GET', KEYS[5])
if holder and holder ~= ARGV[1] then
  return {-1, redis.call('ZCOUNT', KEYS[3], now, '+inf'), redis.call('ZCARD', KEYS[2]),
          tonumber(redis.call('HGET', KEYS[4], 'admitted_total') or '0'), math.floor(rate * 1000)}
end
redis.call('SET', KEYS[5], ARGV[1], 'PX', ARGV[3])

redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
local active = redis.call('ZCARD', KEYS[3])

local state = redis.call('HMGET', KEYS[4], 'last_ms', 'carry', 'admitted_total', 'sampled_ms')
local last = tonumber(state[1] or ARGV[2])
local carry = tonumber(state[2] or '0')
local total = tonumber(state[3] or '0')
local dt = math.min(math.max(now - last, 0), tonumber(ARGV[4])) / 1000

local admitted = 0
if open then
  local budget = carry + rate * dt
  local n = math.floor(budget)
  carry = budget - n
  if n > max_active - active then
    n = math.max(max_active - active, 0)
    carry = 0
  end
  if n > 0 then
    local popped = redis.call('ZPOPMIN', KEYS[2], n)
    -- Formatted by hand: Lua would print a large number as %.14g and lose digits.
    local expires = string.format('%.0f', now + ttl_ms)
    for i = 1, #popped, 2 do
      redis.call('ZADD', KEYS[3], expires, popped[i])
      admitted = admitted + 1
    end
    if admitted < n then carry = 0 end
    total = total + admitted
  end
else
  carry = 0
end
redis.call('HSET', KEYS[4], 'last_ms', ARGV[2], 'carry', carry, 'admitted_total', total)

-- One (time, total) sample a second, a minute's worth kept, for admit_rate_1m.
if now - tonumber(state[4] or '0') >= 1000 then
  redis.call('LPUSH', KEYS[7], ARGV[2] .. ':' .. total)
  redis.call('LTRIM', KEYS[7], 0, 60)
  redis.call('HSET', KEYS[4], 'sampled_ms', ARGV[2])
end
return {admitted, active + admitted, redis.call('ZCARD', KEYS[2]), total, math.floor(rate * 1000)}
