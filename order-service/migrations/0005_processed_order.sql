-- The order in which events took effect, for audits (and the tests that
-- check one key's events never overtake each other).
ALTER TABLE processed_events ADD COLUMN seq bigint GENERATED ALWAYS AS IDENTITY;
