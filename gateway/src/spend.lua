-- Spends an access token on a purchase.
-- KEYS: 1 jti, 2 active, 3 stock, 4 config, 5 held-over (of this fan)
-- ARGV: 1 fan id, 2 idempotency key ('' if none), 3 fresh order id, 4 ttl (s),
--       5 quantity, 6 the token's jti, 7 the token's exp (s), 8 now (ms)
-- Returns {outcome, order id}: fresh (buy as ARGV[3]) | replay (same idempotency
-- key as the spend: buy as the stored order id again) | used | revoked |
-- closed (ops closed the sale: nothing new is bought; a replay of a purchase
-- made before still answers its order) | sold-out | all-held (no seat free,
-- some held by fans paying: may come back; the second value is the expiry (ms)
-- the admission was renewed to, '' if the token is not the fan's current
-- admission) | too-many a=limit
-- Guarantees: a token is spent at most once, and only for a valid quantity
-- while seats remain and ops have not revoked it; spending and leaving the
-- active set (freeing the slot for the next fan) are one step. While every
-- seat is only held, the fan's admission is renewed for access_ttl_s from now
-- (its active-set entry moves on, so it still counts against max_active; its
-- jti stays, so it still buys once), and the spent mark outlives every token
-- of the admission.
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
local now = tonumber(ARGV[8])
local score = tonumber(redis.call('ZSCORE', KEYS[2], ARGV[1]) or '0')
local stock = redis.call('HMGET', KEYS[3], 'remaining', 'held')
if tonumber(stock[1] or '1') <= 0 then
  if tonumber(stock[2] or '0') <= 0 then return {'sold-out', ''} end
  if score <= now then return {'all-held', ''} end
  -- Is the token the fan's current admission? A renewed one is named by its
  -- held-over key; one never renewed by its expiry, the second its status
  -- poll put in the token's exp. (A token of an earlier admission, lapsed,
  -- is neither.)
  local expiry = string.format('%.0f', score)
  local current
  local held_over = redis.call('GET', KEYS[5])
  if held_over then
    local jti, renewed = string.match(held_over, '^(.*)|([^|]*)$')
    if renewed == expiry then current = (jti == ARGV[6]) end
  end
  if current == nil then current = math.floor(score / 1000) == tonumber(ARGV[7]) end
  if not current then return {'all-held', ''} end
  local ttl_ms = tonumber(redis.call('HGET', KEYS[4], 'access_ttl_s') or '0') * 1000
  local renewed = now + ttl_ms
  if renewed <= score then return {'all-held', expiry} end
  renewed = string.format('%.0f', renewed)
  redis.call('ZADD', KEYS[2], 'XX', renewed, ARGV[1])
  redis.call('SET', KEYS[5], ARGV[6] .. '|' .. renewed, 'PX', ttl_ms + 60000)
  return {'all-held', renewed}
end
-- The spent mark lives as long as the token spent, or as the admission (a
-- renewal's token outlives the first one), whichever is later.
local ttl = tonumber(ARGV[4])
if score > now then ttl = math.max(ttl, math.ceil((score - now) / 1000) + 60) end
redis.call('SET', KEYS[1], ARGV[2] .. '|' .. ARGV[3], 'EX', ttl)
redis.call('ZREM', KEYS[2], ARGV[1])
return {'fresh', ARGV[3]}
