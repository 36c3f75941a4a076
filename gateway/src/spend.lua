-- Spends an access token on a purchase.
-- KEYS: 1 jti, 2 active, 3 stock, 4 config
-- ARGV: 1 fan id, 2 idempotency key ('' if none), 3 fresh order id, 4 ttl (s), 5 quantity
-- Returns {outcome, order id}: fresh (buy as ARGV[3]) | replay (same idempotency
-- key as the spend: buy as the stored order id again) | used | revoked |
-- closed (ops closed the sale: nothing new is bought; a replay of a purchase
-- made before still answers its order) | sold-out | all-held (no seat free,
-- some held by fans paying: may come back) | too-many a=limit
-- Guarantees: a token is spent at most once, and only for a valid quantity
-- while seats remain and ops have not revoked it; spending and leaving the
-- active set (freeing the slot for the next fan) are one step.
local stored = redis.call('GET', KEYS[1])
if stored == '!revoked' then return {'revoked', ''} end
-- The limit holds for a replay too: a retry may not ask for more.
local limit = tonumber(redis.call('HGET', KEYS[4], 'per_fan_limit') or '0')
if tonumber(ARGV[5]) > limit then return {'too-many', tostring(limit)} end
if stored then
  local key, order = string.match(stored, '^(.*)|([^|]*)$')
  if ARGV[2] ~= '' and key == ARGV[2] then return {'replay', order} end
  return {'used', ''}
end
if redis.call('HGET', KEYS[4], 'state') == 'closed' then return {'closed', ''} end
local stock = redis.call('HMGET', KEYS[3], 'remaining', 'held')
if tonumber(stock[1] or '1') <= 0 then
  if tonumber(stock[2] or '0') > 0 then return {'all-held', ''} end
  return {'sold-out', ''}
end
redis.call('SET', KEYS[1], ARGV[2] .. '|' .. ARGV[3], 'EX', ARGV[4])
redis.call('ZREM', KEYS[2], ARGV[1])
return {'fresh', ARGV[3]}
