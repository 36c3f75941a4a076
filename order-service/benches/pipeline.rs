//! Purchase pipeline benchmark, each figure beside a baseline measured in
//! the same run on the same servers:
//!
//! 1. Confirmed orders/s: `BENCH_ORDERS` orders (default 2000) placed over
//!    HTTP (32 at a time) and driven by the saga runners through the fake
//!    payment provider (HTTP, no faults) to `confirmed` with their outbox
//!    rows — against `pgbench` running the same SQL a purchase writes (the
//!    hold and the order; charged and the payment; sold, confirmed and the
//!    outbox row: three transactions), with as many clients as there are
//!    saga runners.
//! 2. Relay events/s: `BENCH_EVENTS` outbox rows (default 20000) published
//!    by the relay (claim, produce with acks=all, mark) — against a raw
//!    rdkafka producer with the same settings sending the same payloads and
//!    headers in batches of the same size to the same broker.
//!
//! `cargo bench -p order-service --bench pipeline` (needs Redis, PostgreSQL
//! with `pgbench`, and the Kafka broker).

mod support;

use std::process::Command;
use std::time::{Duration, Instant};

use futures::future::join_all;
use futures::stream::{self, StreamExt};
use order_service::payments::provider::{self, Provider};
use order_service::relay::{self, RelayConfig};
use order_service::{kafka, AppState, ServeConfig};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::FutureRecord;
use serde_json::json;
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

const RUNNERS: usize = 8;
const BATCH: i64 = 200;

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The SQL of one purchase, as the saga writes it, for pgbench.
const PGBENCH_SCRIPT: &str = r"
BEGIN;
UPDATE inventory SET reserved = reserved + 1, version = version + 1 WHERE event_id = 'pgbench' AND reserved + sold + 1 <= capacity;
INSERT INTO orders (order_id, event_id, fan_id, quantity, amount_cents, status, hold_expires_at) VALUES (gen_random_uuid(), 'pgbench', 'fan', 1, 4500, 'reserved', now() + interval '600 seconds') RETURNING order_id \gset
COMMIT;
BEGIN;
UPDATE orders SET status = 'charged', next_attempt_at = now(), updated_at = now() WHERE order_id = ':order_id' AND status = 'reserved';
INSERT INTO payments (order_id, amount_cents, status) VALUES (':order_id', 4500, 'captured') ON CONFLICT (order_id) DO NOTHING;
COMMIT;
BEGIN;
SELECT status FROM orders WHERE order_id = ':order_id' FOR UPDATE;
UPDATE inventory SET reserved = reserved - 1, sold = sold + 1 WHERE event_id = 'pgbench' RETURNING sold;
UPDATE orders SET status = 'confirmed', first_seat = 1, hold_expires_at = NULL, next_attempt_at = NULL, updated_at = now() WHERE order_id = ':order_id';
INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('order', ':order_id', 'boxoffice.order.confirmed.v1', '{}');
COMMIT;
";

async fn count(pool: &PgPool, sql: &str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
}

async fn confirmed_orders_per_s(pool: &PgPool, database_url: &str, orders: usize) {
    let cancel = CancellationToken::new();
    let provider_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let provider_url = format!("http://{}", provider_listener.local_addr().unwrap());
    let stop = cancel.clone();
    tokio::spawn(provider::serve(
        provider_listener,
        Provider::default(),
        async move { stop.cancelled().await },
    ));

    let prefix = format!("bench{}", uuid::Uuid::new_v4().simple());
    let mut config = ServeConfig::defaults();
    config.redis_prefix = prefix;
    config.relay = false;
    config.saga_runners = RUNNERS;
    config.payment.payment_url = provider_url;
    let service = boxoffice_contract::auth::ServiceTokenArgs::new("bench-service-token");
    config.service = service.clone();
    let redis =
        redis::aio::ConnectionManager::new(redis::Client::open(config.redis_url.as_str()).unwrap())
            .await
            .unwrap();
    let state = AppState::new(pool.clone(), redis, config).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let stop = cancel.clone();
    let server = tokio::spawn(order_service::serve(listener, state, async move {
        stop.cancelled().await
    }));
    let http = reqwest::Client::builder()
        .default_headers(service.header().unwrap())
        .build()
        .unwrap();
    let created = http
        .put(format!("{url}/internal/events/bench"))
        .json(&json!({ "name": "Bench", "capacity": orders, "price_cents": 4_500 }))
        .send()
        .await
        .unwrap();
    assert!(created.status().is_success());

    let started = Instant::now();
    let statuses: Vec<u16> = stream::iter(0..orders)
        .map(|fan| {
            let (http, url) = (http.clone(), url.clone());
            async move {
                http.post(format!("{url}/internal/orders"))
                    .json(&json!({
                        "order_id": uuid::Uuid::now_v7(), "event_id": "bench",
                        "fan_id": format!("fan-{fan}"), "quantity": 1,
                    }))
                    .send()
                    .await
                    .unwrap()
                    .status()
                    .as_u16()
            }
        })
        .buffer_unordered(32)
        .collect()
        .await;
    assert!(statuses.iter().all(|s| *s == 202));
    while count(
        pool,
        "SELECT count(*) FROM orders WHERE event_id = 'bench' AND status = 'confirmed'",
    )
    .await
        < orders as i64
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let elapsed = started.elapsed().as_secs_f64();
    cancel.cancel();
    server.await.unwrap().unwrap();
    let saga_rate = orders as f64 / elapsed;

    // Baseline: the same SQL through pgbench, as many clients as runners.
    sqlx::query(
        "INSERT INTO events (event_id, name, price_cents) VALUES ('pgbench', 'pgbench', 4500)",
    )
    .execute(pool)
    .await
    .unwrap();
    sqlx::query("INSERT INTO inventory (event_id, capacity) VALUES ('pgbench', 100000000)")
        .execute(pool)
        .await
        .unwrap();
    let script = std::env::temp_dir().join(format!("pipeline-{}.sql", uuid::Uuid::new_v4()));
    std::fs::write(&script, PGBENCH_SCRIPT).unwrap();
    let output = Command::new("pgbench")
        .args(["-n", "-c", &RUNNERS.to_string(), "-j", "2", "-T", "8", "-f"])
        .arg(&script)
        .arg(database_url)
        .output()
        .expect("running pgbench");
    std::fs::remove_file(&script).ok();
    let text = String::from_utf8_lossy(&output.stdout);
    let pgbench_tps: f64 = text
        .lines()
        .find_map(|l| l.strip_prefix("tps = "))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            panic!(
                "no tps in pgbench output:\n{text}\n{}",
                String::from_utf8_lossy(&output.stderr)
            )
        });
    println!(
        "confirmed orders: {orders} in {elapsed:.2} s = {saga_rate:.0}/s (HTTP place + HTTP charge + 3 transactions each)"
    );
    println!("pgbench, the same SQL, {RUNNERS} clients: {pgbench_tps:.0} purchases/s");
    println!("ratio: {:.2}", saga_rate / pgbench_tps);
}

async fn relay_events_per_s(pool: &PgPool, events: usize) {
    let brokers = std::env::var("KAFKA_BROKERS").unwrap_or_else(|_| "127.0.0.1:9092".into());
    let id = uuid::Uuid::new_v4().simple().to_string();
    let (relay_topic, raw_topic) = (format!("bench-relay-{id}"), format!("bench-raw-{id}"));
    kafka::ensure_topics(&brokers, &[&relay_topic, &raw_topic], 6)
        .await
        .unwrap();
    let order = order_service::store::Order {
        order_id: uuid::Uuid::now_v7(),
        event_id: "bench".into(),
        fan_id: "fan-1".into(),
        quantity: 2,
        amount_cents: 9_000,
        status: "confirmed".into(),
        failure_reason: None,
        first_seat: Some(1),
    };
    let payload = serde_json::to_value(order_service::saga::confirmed_event(&order, 1)).unwrap();
    sqlx::query(
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
         SELECT 'order', gen_random_uuid()::text, 'boxoffice.order.confirmed.v1', $1
         FROM generate_series(1, $2)",
    )
    .bind(&payload)
    .bind(events as i64)
    .execute(pool)
    .await
    .unwrap();
    let producer = kafka::producer(&brokers).unwrap();
    let config = RelayConfig {
        topic: relay_topic,
        batch: BATCH,
        retention: Duration::from_secs(3_600),
        idle: Duration::from_millis(10),
        crash_after_publish: false,
    };
    // Warm the connection and metadata once before timing either side.
    relay::relay_batch(
        pool,
        &producer,
        &RelayConfig {
            batch: 1,
            ..config.clone()
        },
        &mut relay::Blocked::default(),
    )
    .await
    .unwrap();
    let started = Instant::now();
    let mut published = 1;
    while published < events {
        published += relay::relay_batch(pool, &producer, &config, &mut relay::Blocked::default())
            .await
            .unwrap();
    }
    let relay_rate = (events - 1) as f64 / started.elapsed().as_secs_f64();

    let body = serde_json::to_vec(&payload).unwrap();
    let keys: Vec<String> = (0..events)
        .map(|_| uuid::Uuid::new_v4().to_string())
        .collect();
    let raw = kafka::producer(&brokers).unwrap();
    raw.send(
        FutureRecord::to(&raw_topic).key("warm").payload(&body),
        Duration::from_secs(30),
    )
    .await
    .unwrap();
    let started = Instant::now();
    for chunk in keys.chunks(BATCH as usize) {
        let sends = chunk.iter().map(|key| {
            let headers = OwnedHeaders::new()
                .insert(Header {
                    key: "ce_type",
                    value: Some("boxoffice.order.confirmed.v1"),
                })
                .insert(Header {
                    key: "content-type",
                    value: Some("application/cloudevents+json"),
                });
            raw.send(
                FutureRecord::to(&raw_topic)
                    .key(key.as_str())
                    .payload(&body)
                    .headers(headers),
                Duration::from_secs(30),
            )
        });
        for result in join_all(sends).await {
            result.map_err(|(e, _)| e).unwrap();
        }
    }
    let raw_rate = events as f64 / started.elapsed().as_secs_f64();
    println!(
        "relay: {events} outbox rows published at {relay_rate:.0} events/s (batches of {BATCH}, acks=all, idempotent)"
    );
    println!("raw rdkafka producer, same settings and batches: {raw_rate:.0} events/s");
    println!("ratio: {:.2}", relay_rate / raw_rate);
}

#[tokio::main]
async fn main() {
    boxoffice_contract::telemetry::init(false);
    let db = support::BenchDb::create().await;
    let database_url = db.url.clone();
    let pool = PgPoolOptions::new()
        .max_connections(24)
        .connect_with(db.connect.clone())
        .await
        .unwrap();

    confirmed_orders_per_s(&pool, &database_url, env_or("BENCH_ORDERS", 2_000)).await;
    relay_events_per_s(&pool, env_or("BENCH_EVENTS", 20_000)).await;

    pool.close().await;
    db.drop().await;
}
