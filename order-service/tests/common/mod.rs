//! An order service (API + saga runners) and a fake payment provider, each
//! on 127.0.0.1:0, against the test's own Postgres database and Redis
//! prefix. The provider runs in this process so tests can read its books.
#![allow(dead_code)]

use std::time::Duration;

use order_service::payments::provider::{self, Knobs, Provider};
use order_service::ServeConfig;
use serde_json::json;
use sqlx::PgPool;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// The internal plane's token in tests (the binaries refuse `test-…` values
/// unless BOXOFFICE_ALLOW_DEV_SECRETS is set, which the spawned ones get).
pub const SERVICE_TOKEN: &str = "test-service-token-of-at-least-32-bytes";
/// The ticket secret of spawned workers.
pub const TICKET_SECRET: &str = "test-ticket-secret-of-at-least-32-bytes";

/// A client that calls the internal API as the gateway does, with the service token.
pub fn internal_client() -> reqwest::Client {
    reqwest::Client::builder()
        .default_headers(
            boxoffice_contract::auth::ServiceTokenArgs::new(SERVICE_TOKEN)
                .header()
                .unwrap(),
        )
        .build()
        .unwrap()
}

pub fn redis_url() -> String {
    std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

pub fn brokers() -> String {
    std::env::var("KAFKA_BROKERS").unwrap_or_else(|_| "127.0.0.1:9092".into())
}

pub async fn listener() -> (TcpListener, String) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    (listener, url)
}

/// The URL of the test's own database (the sqlx::test pool's), for the
/// real binaries the crash tests spawn.
pub async fn database_url(pool: &PgPool) -> String {
    let name: String = sqlx::query_scalar("SELECT current_database()")
        .fetch_one(pool)
        .await
        .unwrap();
    let base = std::env::var("DATABASE_URL").expect("DATABASE_URL");
    let (server, _) = base.rsplit_once('/').expect("a database in DATABASE_URL");
    format!("{server}/{name}")
}

/// A fake provider served from this process.
pub async fn start_provider(knobs: Knobs, cancel: &CancellationToken) -> (Provider, String) {
    let provider = Provider::new(knobs);
    let (listener, url) = listener().await;
    let stop = cancel.clone();
    tokio::spawn(provider::serve(listener, provider.clone(), async move {
        stop.cancelled().await
    }));
    (provider, url)
}

/// Serve settings for a test: its own prefix and topic, no relay, quick payments.
pub fn config(prefix: &str, provider_url: &str) -> ServeConfig {
    let mut c = ServeConfig::defaults();
    c.redis_url = redis_url();
    c.redis_prefix = prefix.to_owned();
    c.kafka_brokers = brokers();
    c.topic = format!("order-events-{prefix}");
    c.worker_group = format!("ticket-issuer-{prefix}");
    c.replication = order_service::kafka::Replication::SINGLE_BROKER;
    c.relay = false;
    c.saga_runners = 8;
    c.db_connections = 20;
    c.payment.payment_url = provider_url.to_owned();
    c.payment.payment_attempt_timeout_ms = 300;
    c.payment.payment_backoff_ms = 20;
    c.payment.payment_backoff_max_ms = 200;
    c.ticket_store = ticket_store(prefix);
    c.service = boxoffice_contract::auth::ServiceTokenArgs::new(SERVICE_TOKEN);
    c
}

/// A ticket directory of the test's own.
pub fn ticket_store(name: &str) -> String {
    std::env::temp_dir()
        .join(format!("boxoffice-tickets-{name}"))
        .display()
        .to_string()
}

pub struct OrderService {
    pub url: String,
    pub http: reqwest::Client,
    /// The running service's relay health (readiness reads it).
    pub relay: order_service::relay::RelayHealth,
    cancel: CancellationToken,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl OrderService {
    pub async fn start(pool: PgPool, config: ServeConfig) -> Self {
        boxoffice_contract::telemetry::init(false);
        let redis = redis::aio::ConnectionManager::new(redis::Client::open(redis_url()).unwrap())
            .await
            .unwrap();
        let state = order_service::AppState::new(pool, redis, config).unwrap();
        let relay = state.relay.clone();
        let (listener, url) = listener().await;
        let cancel = CancellationToken::new();
        let stop = cancel.clone();
        let task = tokio::spawn(order_service::serve(listener, state, async move {
            stop.cancelled().await
        }));
        Self {
            url,
            http: internal_client(),
            relay,
            cancel,
            task,
        }
    }

    /// `GET /internal/orders/{id}` as JSON.
    pub async fn order(&self, order_id: Uuid) -> serde_json::Value {
        self.http
            .get(format!("{}/internal/orders/{order_id}", self.url))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    pub async fn stop(self) {
        self.cancel.cancel();
        self.task.await.unwrap().unwrap();
    }
}

pub async fn create_event(http: &reqwest::Client, base: &str, event_id: &str, capacity: i32) {
    let response = http
        .put(format!("{base}/internal/events/{event_id}"))
        .json(&json!({ "name": "Test", "capacity": capacity, "price_cents": 4_500 }))
        .send()
        .await
        .unwrap();
    assert!(
        response.status().is_success(),
        "{:?}",
        response.text().await
    );
}

/// Places one order; returns the HTTP status and the order id.
pub async fn place(
    http: &reqwest::Client,
    base: &str,
    event_id: &str,
    fan: &str,
    quantity: i32,
) -> (u16, Uuid) {
    let order_id = Uuid::now_v7();
    let response = http
        .post(format!("{base}/internal/orders"))
        .json(&json!({ "order_id": order_id, "event_id": event_id, "fan_id": fan, "quantity": quantity }))
        .send()
        .await
        .unwrap();
    (response.status().as_u16(), order_id)
}

/// Waits until no order is unfinished and no capture waits for its refund.
pub async fn wait_settled(pool: &PgPool, within: Duration) {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let open: i64 = sqlx::query_scalar(
            "SELECT (SELECT count(*) FROM orders WHERE status IN ('pending', 'reserved', 'charged'))
                  + (SELECT count(*) FROM payments WHERE status = 'refunding')",
        )
        .fetch_one(pool)
        .await
        .unwrap();
        if open == 0 {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{open} orders or refunds still open after {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The invariants of a settled event: never oversold, sold equals the
/// confirmed quantities, nothing left held, every order confirmed or failed,
/// exactly one outbox row per confirmed order and none for the others.
pub async fn check_orders(pool: &PgPool, event_id: &str, capacity: i32) -> Vec<Uuid> {
    let (reserved, sold): (i32, i32) =
        sqlx::query_as("SELECT reserved, sold FROM inventory WHERE event_id = $1")
            .bind(event_id)
            .fetch_one(pool)
            .await
            .unwrap();
    let confirmed_quantity: Option<i64> = sqlx::query_scalar(
        "SELECT sum(quantity) FROM orders WHERE event_id = $1 AND status = 'confirmed'",
    )
    .bind(event_id)
    .fetch_one(pool)
    .await
    .unwrap();
    assert!(sold <= capacity, "oversold: {sold} > {capacity}");
    assert_eq!(i64::from(sold), confirmed_quantity.unwrap_or(0));
    assert_eq!(reserved, 0, "seats still held after every order settled");
    let odd: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM orders WHERE status NOT IN ('confirmed', 'failed')",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    assert_eq!(odd, 0);
    let outbox_mismatch: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM orders o
         WHERE (SELECT count(*) FROM outbox x WHERE x.aggregate_id = o.order_id::text)
               <> CASE WHEN o.status = 'confirmed' THEN 1 ELSE 0 END",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    assert_eq!(
        outbox_mismatch, 0,
        "orders without exactly their one outbox row"
    );
    sqlx::query_scalar("SELECT order_id FROM orders WHERE status = 'confirmed' ORDER BY order_id")
        .fetch_all(pool)
        .await
        .unwrap()
}

/// The provider's books agree with the orders: exactly one capture per
/// confirmed order, and no money kept for any other key.
pub fn check_books(provider: &Provider, confirmed: &[Uuid]) {
    use order_service::payments::ChargeStatus;
    let confirmed: std::collections::HashSet<String> =
        confirmed.iter().map(|id| id.to_string()).collect();
    let mut kept = std::collections::HashSet::new();
    for record in provider.records() {
        assert!(record.captures <= 1, "double charge: {record:?}");
        if record.charge.status == ChargeStatus::Captured {
            kept.insert(record.charge.idempotency_key.clone());
        }
    }
    assert_eq!(kept, confirmed, "captures kept ≠ confirmed orders");
}
