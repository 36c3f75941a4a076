-- The W3C trace context of the purchase that placed an order, kept with the
-- order and copied onto its outbox rows, so the relay can put it in the Kafka
-- headers and the ticket worker continues the same trace.
ALTER TABLE orders ADD COLUMN traceparent text;
ALTER TABLE outbox ADD COLUMN traceparent text;
