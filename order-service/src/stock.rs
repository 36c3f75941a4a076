//! The edge's view of remaining seats, kept in step with Postgres.
//!
//! The gateway answers "sold out" from this view without touching Postgres.
//! It may lag (a write to Redis can fail or arrive late), which is safe: the
//! conditional UPDATE in Postgres still refuses to oversell. It must not lag
//! for long: at "sold out" no further change would publish a seat released
//! by a decline or a lapsed hold, so [`reconcile`] republishes every event's
//! stock from Postgres periodically (and at start).

use std::time::Duration;

use boxoffice_contract::keys::EventKeys;
use boxoffice_contract::redis_link::RedisLink;
use redis::Script;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use crate::store::Stock;

#[derive(Clone)]
pub struct StockView {
    redis: RedisLink,
    prefix: String,
    script: Script,
}

impl StockView {
    pub fn new(redis: impl Into<RedisLink>, prefix: &str) -> Self {
        Self {
            redis: redis.into(),
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
            .arg(stock.reserved)
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

/// Republishes every event's stock every `every` until `cancel`, the first
/// time at once. One query and one Redis script per event per period.
pub async fn reconcile(view: StockView, pool: PgPool, every: Duration, cancel: CancellationToken) {
    let mut tick = tokio::time::interval(every.max(Duration::from_millis(10)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tick.tick() => {}
        }
        let rows =
            sqlx::query!("SELECT event_id, capacity, reserved, sold, version FROM inventory")
                .fetch_all(&pool)
                .await;
        match rows {
            Ok(rows) => {
                for row in rows {
                    let stock = Stock {
                        capacity: row.capacity,
                        reserved: row.reserved,
                        sold: row.sold,
                        version: row.version,
                    };
                    view.publish(&row.event_id, stock).await;
                }
            }
            Err(error) => {
                tracing::warn!(%error, "could not read the stock to reconcile the edge view")
            }
        }
    }
}
