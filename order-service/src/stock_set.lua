-- Publishes the edge view of an event's remaining seats.
-- KEYS[1] = P:{E}:stock ; ARGV[1] = remaining ; ARGV[2] = inventory version ;
-- ARGV[3] = seats held by orders still paying (they may come back).
-- Guarantee: the view only moves forward. Two order-service replicas may
-- finish their transactions in one order and reach Redis in the other; the
-- older version is then ignored, so the view never shows a stale "seats left"
-- after a newer "sold out".
local current = tonumber(redis.call('HGET', KEYS[1], 'version') or '-1')
if tonumber(ARGV[2]) > current then
  redis.call('HSET', KEYS[1], 'remaining', ARGV[1], 'held', ARGV[3], 'version', ARGV[2])
  return 1
end
return 0
