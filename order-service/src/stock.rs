//! The edge's view of remaining seats, kept in step with Postgres.
//!
//! The gateway answers "sold out" from this view without touching Postgres.
//! It may lag (a write to Redis can fail or arrive late), which is safe: the
//! conditional UPDATE in Postgres still refuses to oversell, and the next
//! change of stock publishes a newer version.

use boxoffice_contract::keys::EventKeys;
use redis::aio::ConnectionManager;
use redis::Script;

use crate::store::Stock;

#[derive(Clone)]
pub struct StockView {
    redis: ConnectionManager,
    prefix: String,
    script: Script,
}

impl StockView {
    pub fn new(redis: ConnectionManager, prefix: &str) -> Self {
        Self {
            redis,
            prefix: prefix.to_owned(),
            script: Script::new(include_str!("stock_set.lua")),
        }
    }

    /// Publishes `stock` unless Redis already holds a newer version. A failure
    /// is logged, not returned: Postgres has the truth and the order stands.
    pub async fn publish(&self, event_id: &str, stock: Stock) {
        let keys = EventKeys::new(&self.prefix, event_id);
        let mut redis = self.redis.clone();
        let result: redis::RedisResult<i32> = self
            .script
            .key(keys.stock())
            .arg(stock.remaining())
            .arg(stock.version)
            .invoke_async(&mut redis)
            .await;
        if let Err(error) = result {
            tracing::warn!(event_id, %error, "could not publish the stock view to Redis");
        }
    }

    pub async fn ping(&self) -> bool {
        let mut redis = self.redis.clone();
        redis::cmd("PING")
            .query_async::<String>(&mut redis)
            .await
            .is_ok()
    }
}
