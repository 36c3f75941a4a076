-- The admission service's settings of each event (rate, times, limits, the
-- shuffle seed...), as the fields of its Redis hash. Redis serves them; this
-- copy lets the admission service put them back if Redis loses them.
ALTER TABLE events ADD COLUMN settings jsonb;
