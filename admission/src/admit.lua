-- One admission tick for one event.
-- KEYS: 1 config, 2 queue, 3 active, 4 admit state, 5 lease, 6 stock
-- ARGV: 1 replica id, 2 now (ms), 3 lease (ms), 4 longest tick counted (ms)
-- Returns {admitted, active} or {-1, 0} when another replica holds the lease.
--
-- Guarantees, all in one atomic step:
-- * only the lease holder admits, so two replicas never double the rate;
-- * lapsed admissions leave the active set first, so their slots return;
-- * at most rate * dt fans, with the fraction carried to the next tick, and
--   dt capped at ARGV[4], so a late tick or a failover admits at most one
--   extra tick's worth;
-- * never more than max_active active at once;
-- * nobody before opens_at, while paused, after closing or once sold out.
local holder = redis.call('GET', KEYS[5])
if holder and holder ~= ARGV[1] then
  return {-1, 0}
end
redis.call('SET', KEYS[5], ARGV[1], 'PX', ARGV[3])

local now = tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
local active = redis.call('ZCARD', KEYS[3])

local cfg = redis.call('HMGET', KEYS[1], 'rate', 'max_active', 'access_ttl_s', 'opens_at_ms', 'paused', 'state')
local rate = tonumber(cfg[1]) or 0
local max_active = tonumber(cfg[2]) or 0
local ttl_ms = (tonumber(cfg[3]) or 0) * 1000
local opens_at = tonumber(cfg[4]) or 0
local remaining = tonumber(redis.call('HGET', KEYS[6], 'remaining') or '1')

local last = tonumber(redis.call('HGET', KEYS[4], 'last_ms') or ARGV[2])
local carry = tonumber(redis.call('HGET', KEYS[4], 'carry') or '0')
local dt = math.min(math.max(now - last, 0), tonumber(ARGV[4])) / 1000

local open = now >= opens_at and cfg[5] ~= '1' and cfg[6] ~= 'closed' and remaining > 0
if not open or rate <= 0 then
  redis.call('HSET', KEYS[4], 'last_ms', now, 'carry', 0)
  return {0, active}
end

local budget = carry + rate * dt
local n = math.floor(budget)
carry = budget - n
if n > max_active - active then
  n = math.max(max_active - active, 0)
  carry = 0
end

local admitted = 0
if n > 0 then
  local popped = redis.call('ZPOPMIN', KEYS[2], n)
  -- Formatted by hand: Lua would print a large number as %.14g and lose digits.
  local expires = string.format('%.0f', now + ttl_ms)
  for i = 1, #popped, 2 do
    redis.call('ZADD', KEYS[3], expires, popped[i])
    admitted = admitted + 1
  end
  if admitted < n then carry = 0 end
  redis.call('HINCRBY', KEYS[4], 'admitted_total', admitted)
end
redis.call('HSET', KEYS[4], 'last_ms', now, 'carry', carry)
return {admitted, active + admitted}
