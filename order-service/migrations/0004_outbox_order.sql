-- Lets a relay see, for the aggregates it claimed, which earlier rows are
-- still unpublished, so competing relays never reorder one aggregate's events.
CREATE INDEX outbox_unpublished_by_aggregate ON outbox (aggregate_id, id) WHERE published_at IS NULL;
