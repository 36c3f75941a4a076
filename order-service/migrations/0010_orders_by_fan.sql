-- The per-fan limit counts a fan's seats across all its orders of an event.
CREATE INDEX orders_by_fan ON orders (event_id, fan_id);
