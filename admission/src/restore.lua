-- Puts an event's settings back into Redis if Redis lost them.
-- KEYS: 1 config ; ARGV: field, value pairs (one hash slot: the caller adds
-- the event to the events set itself)
-- Returns 1 if restored, 0 if the settings were there. A whole hash always
-- has its seed (PUT writes it in one step); without one, fields are filled in
-- but never overwritten: a field Redis has (say a rate the adaptive
-- controller wrote after the loss) is newer than PostgreSQL's copy.
if redis.call('HEXISTS', KEYS[1], 'seed') == 1 then return 0 end
for i = 1, #ARGV, 2 do
  redis.call('HSETNX', KEYS[1], ARGV[i], ARGV[i + 1])
end
return 1
