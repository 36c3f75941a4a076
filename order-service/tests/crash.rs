//! Crashes of the real `order-service` binary (kill -9, abort between
//! publish and mark): every saga finishes after a restart, nothing is lost
//! or doubled, and a duplicate publish costs the consumer nothing.

mod common;

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::*;
use futures::future::join_all;
use order_service::payments::provider::Knobs;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::{ClientConfig, Message};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

struct Service {
    child: Child,
    url: String,
}

/// A failed test must not leave its order service running.
impl Drop for Service {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.child.kill().ok();
            self.child.wait().ok();
        }
    }
}

/// Starts `order-service serve` and waits until it answers.
async fn spawn(env: &[(&str, String)]) -> Service {
    let port = free_port();
    let mut command = Command::new(env!("CARGO_BIN_EXE_order-service"));
    command
        .arg("serve")
        .env("ORDER_SERVICE_LISTEN", format!("127.0.0.1:{port}"))
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null());
    for (name, value) in env {
        command.env(name, value);
    }
    let mut child = command.spawn().expect("spawning order-service");
    let url = format!("http://127.0.0.1:{port}");
    let http = internal_client();
    for _ in 0..200 {
        if let Ok(response) = http.get(format!("{url}/healthz")).send().await {
            if response.status().is_success() {
                return Service { child, url };
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    child.kill().ok();
    child.wait().ok();
    panic!("order-service did not come up on port {port}");
}

fn base_env(db: &str, prefix: &str, provider_url: &str) -> Vec<(&'static str, String)> {
    vec![
        ("DATABASE_URL", db.to_owned()),
        ("REDIS_URL", redis_url()),
        ("KAFKA_BROKERS", brokers()),
        ("BOXOFFICE_REDIS_PREFIX", prefix.to_owned()),
        ("BOXOFFICE_ORDER_TOPIC", format!("order-events-{prefix}")),
        ("BOXOFFICE_WORKER_GROUP", format!("ticket-issuer-{prefix}")),
        ("BOXOFFICE_PARTITIONS", "1".into()),
        ("PAYMENT_URL", provider_url.to_owned()),
        ("BOXOFFICE_TICKET_STORE", ticket_store(prefix)),
        ("PAYMENT_ATTEMPT_TIMEOUT_MS", "1000".into()),
        ("PAYMENT_RETRIES", "1".into()),
        ("PAYMENT_BACKOFF_MAX_MS", "100".into()),
        ("BOXOFFICE_SERVICE_TOKEN", SERVICE_TOKEN.into()),
        ("PAYMENT_API_KEY", SERVICE_TOKEN.into()),
        ("BOXOFFICE_TICKET_SECRET", TICKET_SECRET.into()),
        ("BOXOFFICE_ALLOW_DEV_SECRETS", "true".into()),
    ]
}

async fn count(pool: &PgPool, sql: &str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
}

#[sqlx::test(migrator = "order_service::MIGRATOR")]
async fn kill_9_mid_saga_then_restart_finishes_every_saga_once(pool: PgPool) {
    let cancel = CancellationToken::new();
    // A slow provider, so the kill lands with sagas in flight.
    let knobs = Knobs {
        latency_ms: 150,
        ..Knobs::default()
    };
    let (provider, provider_url) = start_provider(knobs, &cancel).await;
    let prefix = format!("t{}", uuid::Uuid::new_v4().simple());
    let mut env = base_env(&database_url(&pool).await, &prefix, &provider_url);
    env.push(("BOXOFFICE_RELAY", "false".into()));
    env.push(("BOXOFFICE_SAGA_RUNNERS", "4".into()));
    let mut service = spawn(&env).await;
    let http = internal_client();
    create_event(&http, &service.url, "ev", 60).await;
    let purchases = (0..60).map(|fan| {
        let (http, url) = (http.clone(), service.url.clone());
        async move { place(&http, &url, "ev", &format!("fan-{fan}"), 1).await.0 }
    });
    assert!(join_all(purchases).await.iter().all(|s| *s == 202));

    // Kill -9 once some orders are confirmed and others are not.
    loop {
        let confirmed = count(
            &pool,
            "SELECT count(*) FROM orders WHERE status = 'confirmed'",
        )
        .await;
        if confirmed >= 10 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    service.child.kill().unwrap();
    service.child.wait().unwrap();
    let unfinished = count(
        &pool,
        "SELECT count(*) FROM orders WHERE status IN ('reserved', 'charged')",
    )
    .await;
    assert!(unfinished > 0, "the kill came too late to test anything");

    let mut restarted = spawn(&env).await;
    wait_settled(&pool, Duration::from_secs(90)).await;
    let confirmed = check_orders(&pool, "ev", 60).await;
    assert_eq!(
        confirmed.len(),
        60,
        "a healthy provider confirms every order"
    );
    check_books(&provider, &confirmed);
    restarted.child.kill().unwrap();
    restarted.child.wait().unwrap();
    cancel.cancel();
}

/// Reads every message of `topic` from the start with a group of its own.
async fn read_all(topic: &str, expected: usize) -> Vec<(String, String)> {
    let consumer: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .set("group.id", format!("reader-{}", uuid::Uuid::new_v4()))
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    consumer.subscribe(&[topic]).unwrap();
    let mut seen = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while seen.len() < expected && tokio::time::Instant::now() < deadline {
        if let Ok(Ok(message)) = tokio::time::timeout(Duration::from_secs(1), consumer.recv()).await
        {
            let key = String::from_utf8_lossy(message.key().unwrap_or_default()).into_owned();
            let payload: serde_json::Value =
                serde_json::from_slice(message.payload().unwrap_or_default()).unwrap();
            seen.push((key, payload["id"].as_str().unwrap_or_default().to_owned()));
        }
    }
    seen
}

#[sqlx::test(migrator = "order_service::MIGRATOR")]
async fn a_relay_killed_between_publish_and_mark_publishes_twice_and_tickets_once(pool: PgPool) {
    let cancel = CancellationToken::new();
    let (_provider, provider_url) = start_provider(Knobs::default(), &cancel).await;
    let prefix = format!("t{}", uuid::Uuid::new_v4().simple());
    let topic = format!("order-events-{prefix}");
    order_service::kafka::ensure_topics(&brokers(), &[&topic], 1)
        .await
        .unwrap();
    let mut env = base_env(&database_url(&pool).await, &prefix, &provider_url);
    env.push(("BOXOFFICE_SAGA_RUNNERS", "1".into()));

    // First life: the relay publishes the order's event, then dies before marking it.
    let mut crashing = env.clone();
    crashing.push(("BOXOFFICE_CRASH_AFTER_PUBLISH", "true".into()));
    let service = spawn(&crashing).await;
    let http = internal_client();
    create_event(&http, &service.url, "ev", 10).await;
    let (status, order_id) = place(&http, &service.url, "ev", "fan", 3).await;
    assert_eq!(status, 202);
    let exit = tokio::task::spawn_blocking(move || {
        let mut service = service;
        service.child.wait().unwrap()
    })
    .await
    .unwrap();
    assert!(!exit.success(), "the relay should have aborted: {exit:?}");
    assert_eq!(
        count(
            &pool,
            "SELECT count(*) FROM outbox WHERE published_at IS NULL"
        )
        .await,
        1,
        "the row must still be unmarked"
    );

    // Second life: the row is published again and marked.
    let mut service = spawn(&env).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while count(
        &pool,
        "SELECT count(*) FROM outbox WHERE published_at IS NULL",
    )
    .await
        > 0
    {
        assert!(tokio::time::Instant::now() < deadline, "never re-published");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let messages = read_all(&topic, 2).await;
    assert_eq!(messages.len(), 2, "{messages:?}");
    assert_eq!(messages[0], messages[1], "one event, published twice");
    assert_eq!(messages[0].0, order_id.to_string());

    // The consumer absorbs the duplicate: one ticket set.
    let group = format!("ticket-issuer-{prefix}");
    let worker = {
        let mut c = order_service::WorkerConfig::defaults();
        c.kafka_brokers = brokers();
        c.topic = topic.clone();
        c.group = group.clone();
        c.commit_interval_ms = 100;
        c.ticket_store = ticket_store(&prefix);
        c
    };
    let worker = tokio::spawn(order_service::worker::run(
        worker,
        pool.clone(),
        cancel.clone(),
    ));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    loop {
        let lag = order_service::health::BrokerProbe::new(&brokers(), &group, &topic)
            .unwrap()
            .lag()
            .await;
        let done = matches!(&lag, Ok(partitions) if partitions.iter().all(|(_, lag)| *lag == 0));
        if done && count(&pool, "SELECT count(*) FROM tickets").await == 3 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not consumed: {lag:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(count(&pool, "SELECT count(*) FROM tickets").await, 3);
    assert_eq!(
        count(&pool, "SELECT count(*) FROM processed_events").await,
        1
    );

    cancel.cancel();
    let stats = worker.await.unwrap().unwrap();
    assert_eq!((stats.issued, stats.duplicates), (1, 1), "{stats:?}");
    service.child.kill().unwrap();
    service.child.wait().unwrap();
}
