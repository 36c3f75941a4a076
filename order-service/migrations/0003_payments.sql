-- The saga talks to a payment provider: orders back off between attempts
-- under a lease, and a capture that must be given back waits as `refunding`.

ALTER TABLE orders
    ADD COLUMN attempts integer NOT NULL DEFAULT 0,
    -- Not before this time may a runner take the order up again (a backoff,
    -- or the lease of the runner working on it).
    ADD COLUMN next_attempt_at timestamptz DEFAULT now();

DROP INDEX orders_unfinished;
CREATE INDEX orders_unfinished ON orders (next_attempt_at NULLS FIRST)
    WHERE status IN ('pending', 'reserved', 'charged');

ALTER TABLE payments DROP CONSTRAINT payments_status_check;
ALTER TABLE payments ADD CONSTRAINT payments_status_check
    CHECK (status IN ('captured', 'refunding', 'refunded'));
CREATE INDEX payments_refunding ON payments (order_id) WHERE status = 'refunding';
