-- Revokes a fan's current admission.
-- KEYS: 1 active, 2 jti key of that admission's access token
-- ARGV: 1 fan id, 2 the admission's expiry (ms) the jti was made from, 3 ttl (s)
-- Returns 1 when revoked, 0 when the fan holds no such admission (any more).
-- Guarantee: the fan leaves the active set (the slot returns) and the
-- admission's access token, if not yet spent, can never be spent: its jti is
-- marked revoked in the same step. A spent token stays spent.
local expiry = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not expiry or string.format('%.0f', tonumber(expiry)) ~= ARGV[2] then return 0 end
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('SET', KEYS[2], '!revoked', 'EX', ARGV[3], 'NX')
return 1
