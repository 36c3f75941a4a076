-- Relays claim only the oldest unpublished row of each aggregate, so
-- competing relays never publish one aggregate's events out of order.
CREATE INDEX outbox_unpublished_by_aggregate ON outbox (aggregate_id, id) WHERE published_at IS NULL;
