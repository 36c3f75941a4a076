//! What the admission tests share: an event of their own in Redis under a
//! fresh key prefix, and a real order service for admin writes, which keep
//! each event's settings in PostgreSQL.
#![allow(dead_code)]

use boxoffice_contract::auth::ServiceTokenArgs;
use boxoffice_contract::event::EventConfig;
use boxoffice_contract::keys::{events_key, EventKeys};
use redis::aio::ConnectionManager;
use redis::AsyncCommands;
use tokio_util::sync::CancellationToken;

/// The internal plane's token in these tests (admission and order service alike).
pub const SERVICE_TOKEN: &str = "test-service-token-of-at-least-32-bytes";

pub fn service() -> ServiceTokenArgs {
    ServiceTokenArgs::new(SERVICE_TOKEN)
}

/// A connection to the test Redis, a fresh key prefix (so tests run side by
/// side), and the event `ev` under it with `config`, listed among the
/// prefix's events as admission finds them.
pub async fn event(config: &EventConfig) -> (ConnectionManager, String, EventKeys) {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let mut redis = ConnectionManager::new(redis::Client::open(url).unwrap())
        .await
        .unwrap();
    let prefix = format!("t{}", uuid::Uuid::new_v4().simple());
    let keys = EventKeys::new(&prefix, "ev");
    let _: () = redis
        .hset_multiple(keys.config(), &config.to_fields())
        .await
        .unwrap();
    let _: () = redis.sadd(events_key(&prefix), "ev").await.unwrap();
    (redis, prefix, keys)
}

/// Deletes every key under `prefix`.
pub async fn cleanup(mut redis: ConnectionManager, prefix: &str) {
    let keys: Vec<String> = redis.keys(format!("{prefix}:*")).await.unwrap();
    let _: () = redis.del(keys).await.unwrap();
}

/// A real order service on the test's database, where admin writes keep the
/// event's settings; the event `event_id` exists there.
pub async fn order_service(
    pool: sqlx::PgPool,
    prefix: &str,
    redis: ConnectionManager,
    event_id: &str,
) -> (String, CancellationToken) {
    sqlx::query("INSERT INTO events (event_id, name, price_cents) VALUES ($1, 'Test', 100)")
        .bind(event_id)
        .execute(&pool)
        .await
        .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let mut config = order_service::ServeConfig::defaults();
    config.redis_prefix = prefix.to_owned();
    config.saga_runners = 0;
    config.relay = false;
    config.service = service();
    config.ticket_store = std::env::temp_dir()
        .join(format!("boxoffice-tickets-{prefix}"))
        .display()
        .to_string();
    let state = order_service::AppState::new(pool, redis, config).unwrap();
    let cancel = CancellationToken::new();
    let stop = cancel.clone();
    tokio::spawn(order_service::serve(listener, state, async move {
        stop.cancelled().await
    }));
    (url, cancel)
}
