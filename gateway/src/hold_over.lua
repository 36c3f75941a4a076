-- Renews a spent access token's mark, when PostgreSQL answered `seats-held`
-- to the purchase it was spent on (the edge's view had a seat free).
-- KEYS: 1 jti
-- ARGV: 1 ttl (s): at least as long as the renewed token lives
-- Returns 1 when renewed, 0 when the token is not spent (or was revoked).
-- Guarantee: the mark (idempotency key and order id) lives as long as any
-- token of the admission, so a renewed token can only retry that purchase.
local stored = redis.call('GET', KEYS[1])
if not stored or stored == '!revoked' then return 0 end
if redis.call('TTL', KEYS[1]) < tonumber(ARGV[1]) then redis.call('EXPIRE', KEYS[1], ARGV[1]) end
return 1
