-- Puts an event's settings back into Redis if Redis lost them.
-- KEYS: 1 config, 2 events set ; ARGV: 1 event id, 2.. field, value pairs
-- Returns 1 if restored, 0 if the settings were there (never overwritten:
-- what Redis holds is newer, e.g. an adaptive rate).
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], unpack(ARGV, 2))
redis.call('SADD', KEYS[2], ARGV[1])
return 1
