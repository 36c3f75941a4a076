-- Refunds are claimed under a lease and retried with backoff, like charges:
-- no transaction stays open across the provider call, and a refund the
-- provider refuses waits before it is tried again.
ALTER TABLE payments
    ADD COLUMN refund_attempts integer NOT NULL DEFAULT 0,
    -- Not before this time may a runner take the refund up again (a backoff,
    -- or the lease of the runner working on it).
    ADD COLUMN next_refund_at timestamptz NOT NULL DEFAULT now();

DROP INDEX payments_refunding;
CREATE INDEX payments_refunding ON payments (next_refund_at) WHERE status = 'refunding';
