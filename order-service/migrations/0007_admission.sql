-- One admission buys once, even when Redis loses the record of a spent
-- access token (a restart without persistence, a failover, an eviction):
-- the token's jti is kept with the order and is unique, so PostgreSQL is the
-- final guard. The key the purchase was made with tells a retry (the same
-- key finds the same order) from a second purchase (refused).
ALTER TABLE orders ADD COLUMN admission_id text, ADD COLUMN idempotency_key text;
CREATE UNIQUE INDEX orders_one_per_admission ON orders (admission_id) WHERE admission_id IS NOT NULL;
