//! Worker pool benchmark: throughput with `c` workers and a service time `S`
//! (simulated extra time per message plus the real Postgres transaction and
//! PDF), printed beside the ideal c/S; and how long a burst takes to drain
//! (lag back to 0) against N / (c/S).
//!
//! A burst of `BENCH_MESSAGES` (default 600) `OrderConfirmed` events for as
//! many orders is produced to a fresh 6-partition topic, then a worker pool
//! starts on it (its own database, topic and group per configuration).
//!
//! `cargo bench -p order-service --bench workers` (needs PostgreSQL and the broker).

mod support;

use std::time::{Duration, Instant};

use boxoffice_contract::envelope::{CloudEvent, OrderConfirmed, ORDER_CONFIRMED_V1};
use order_service::{kafka, WorkerConfig, Workers};
use rdkafka::producer::FutureRecord;
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

async fn count(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM processed_events")
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn run(pool: &PgPool, brokers: &str, messages: usize, workers: usize, service_ms: u64) {
    let id = Uuid::new_v4().simple().to_string();
    let topic = format!("bench-workers-{id}");
    let partitions: i32 = std::env::var("BENCH_PARTITIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    kafka::ensure_topics(brokers, &[&topic], partitions)
        .await
        .unwrap();
    sqlx::query("TRUNCATE processed_events, tickets, orders CASCADE")
        .execute(pool)
        .await
        .unwrap();
    let producer = kafka::producer(brokers).unwrap();
    let mut sends = Vec::new();
    for i in 0..messages {
        let order = OrderConfirmed {
            order_id: Uuid::now_v7(),
            event_id: "bench".into(),
            fan_id: format!("fan-{i}"),
            quantity: 1,
            first_seat: i as i32 + 1,
            amount_cents: 100,
        };
        sqlx::query(
            "INSERT INTO orders (order_id, event_id, fan_id, quantity, amount_cents, status, first_seat)
             VALUES ($1, 'bench', $2, 1, 100, 'confirmed', $3)",
        )
        .bind(order.order_id)
        .bind(&order.fan_id)
        .bind(order.first_seat)
        .execute(pool)
        .await
        .unwrap();
        let key = order.order_id.to_string();
        let event = CloudEvent::new(ORDER_CONFIRMED_V1, key.clone(), order);
        sends.push((key, serde_json::to_vec(&event).unwrap()));
    }
    for chunk in sends.chunks(200) {
        let pending: Vec<_> = chunk
            .iter()
            .map(|(key, payload)| {
                producer.send(
                    FutureRecord::to(&topic).key(key).payload(payload),
                    Duration::from_secs(30),
                )
            })
            .collect();
        for result in futures::future::join_all(pending).await {
            result.map_err(|(e, _)| e).unwrap();
        }
    }

    let mut config = WorkerConfig::defaults();
    config.kafka_brokers = brokers.to_owned();
    config.topic = topic.clone();
    config.group = format!("bench-{id}");
    config.workers = Workers::Fixed(workers);
    config.extra_service_ms = service_ms;
    config.commit_interval_ms = 200;
    config.ticket_store = std::env::temp_dir()
        .join(format!("bench-tickets-{id}"))
        .display()
        .to_string();
    let cancel = CancellationToken::new();
    let started = Instant::now();
    let worker = tokio::spawn(order_service::worker::run(
        config,
        pool.clone(),
        cancel.clone(),
    ));
    let mut first = None;
    loop {
        let done = count(pool).await as usize;
        if first.is_none() && done > 0 {
            first = Some((Instant::now(), done));
        }
        if done >= messages {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let finished = Instant::now();
    cancel.cancel();
    let stats = worker.await.unwrap().unwrap();
    let (first_at, first_done) = first.unwrap();
    let throughput =
        (messages - first_done) as f64 / finished.duration_since(first_at).as_secs_f64();
    let ideal = workers as f64 / (service_ms as f64 / 1000.0);
    let drain = finished.duration_since(first_at).as_secs_f64();
    println!(
        "c = {workers:>2}, S = {service_ms} ms (+ the real work): {throughput:>6.0} msg/s vs c/S = {ideal:.0} msg/s → {:.0} %  (max in flight {})",
        100.0 * throughput / ideal,
        stats.max_in_flight
    );
    println!(
        "        burst of {messages}: first effect after {:.2} s (group join), lag 0 after {:.2} s more; N/(c/S) = {:.2} s",
        first_at.duration_since(started).as_secs_f64(),
        drain,
        messages as f64 / ideal
    );
}

#[tokio::main]
async fn main() {
    boxoffice_contract::telemetry::init(false);
    let brokers = std::env::var("KAFKA_BROKERS").unwrap_or_else(|_| "127.0.0.1:9092".into());
    let messages: usize = std::env::var("BENCH_MESSAGES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(600);
    let db = support::BenchDb::create().await;
    let pool = PgPoolOptions::new()
        .max_connections(40)
        .connect_with(db.connect.clone())
        .await
        .unwrap();
    sqlx::query("INSERT INTO events (event_id, name, price_cents) VALUES ('bench', 'Bench', 100)")
        .execute(&pool)
        .await
        .unwrap();

    let configs: Vec<(usize, u64)> = std::env::var("BENCH_CONFIGS")
        .ok()
        .map(|v| {
            v.split(',')
                .map(|p| {
                    let (c, s) = p.split_once('x').unwrap();
                    (c.parse().unwrap(), s.parse().unwrap())
                })
                .collect()
        })
        .unwrap_or(vec![(8, 50), (32, 50)]);
    for (workers, service_ms) in configs {
        run(&pool, &brokers, messages, workers, service_ms).await;
    }

    pool.close().await;
    db.drop().await;
}
