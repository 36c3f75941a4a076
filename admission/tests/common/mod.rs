//! A real order service for admin writes, which keep each event's settings in PostgreSQL.
#![allow(dead_code)]

use boxoffice_contract::auth::ServiceTokenArgs;
use redis::aio::ConnectionManager;
use tokio_util::sync::CancellationToken;

/// The internal plane's token in these tests (admission and order service alike).
pub const SERVICE_TOKEN: &str = "test-service-token-of-at-least-32-bytes";

pub fn service() -> ServiceTokenArgs {
    ServiceTokenArgs::new(SERVICE_TOKEN)
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
