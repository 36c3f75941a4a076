-- Order latency over the last minute feeds adaptive admission; read by update time.
CREATE INDEX orders_by_update ON orders (updated_at);
