//! The ticket worker pool against the real broker and Postgres: duplicates,
//! per-key order under parallelism, poison messages and redrive, SIGTERM
//! drain and kill -9 of the real binary, and `--workers auto`.

mod common;

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use boxoffice_contract::envelope::{CloudEvent, OrderConfirmed, ORDER_CONFIRMED_V1};
use common::{brokers, database_url};
use order_service::kafka::Publisher;
use order_service::worker::dlq;
use order_service::{kafka, WorkerConfig, Workers};
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::Message;
use rdkafka::producer::FutureRecord;
use rdkafka::ClientConfig;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// A topic and group of the test's own.
fn names() -> (String, String) {
    let id = Uuid::new_v4().simple().to_string();
    (format!("orders-{id}"), format!("issuer-{id}"))
}

fn config(topic: &str, group: &str) -> WorkerConfig {
    let mut c = WorkerConfig::defaults();
    c.kafka_brokers = brokers();
    c.topic = topic.to_owned();
    c.group = group.to_owned();
    c.commit_interval_ms = 100;
    c.retry_backoff_ms = 50;
    c.ticket_store = common::ticket_store(group);
    c
}

/// `n` confirmed orders of `quantity` seats, in consecutive seats.
async fn seed_orders(pool: &PgPool, n: usize, quantity: i32) -> Vec<OrderConfirmed> {
    sqlx::query("INSERT INTO events (event_id, name, price_cents) VALUES ('ev', 'Ev', 100) ON CONFLICT DO NOTHING")
        .execute(pool)
        .await
        .unwrap();
    let taken: i64 = sqlx::query_scalar("SELECT coalesce(sum(quantity), 0) FROM orders")
        .fetch_one(pool)
        .await
        .unwrap();
    let mut orders = Vec::new();
    for i in 0..n {
        let order = OrderConfirmed {
            order_id: Uuid::now_v7(),
            event_id: "ev".into(),
            fan_id: format!("fan-{i}"),
            quantity,
            first_seat: taken as i32 + 1 + i as i32 * quantity,
            amount_cents: 100 * i64::from(quantity),
        };
        insert_order(pool, &order).await;
        orders.push(order);
    }
    orders
}

async fn insert_order(pool: &PgPool, order: &OrderConfirmed) {
    sqlx::query(
        "INSERT INTO orders (order_id, event_id, fan_id, quantity, amount_cents, status, first_seat)
         VALUES ($1, $2, $3, $4, $5, 'confirmed', $6)",
    )
    .bind(order.order_id)
    .bind(&order.event_id)
    .bind(&order.fan_id)
    .bind(order.quantity)
    .bind(order.amount_cents)
    .bind(order.first_seat)
    .execute(pool)
    .await
    .unwrap();
}

fn envelope(order: &OrderConfirmed) -> (Uuid, Vec<u8>) {
    let event = CloudEvent::new(
        ORDER_CONFIRMED_V1,
        order.order_id.to_string(),
        order.clone(),
    );
    (event.id, serde_json::to_vec(&event).unwrap())
}

async fn produce(producer: &Publisher, topic: &str, key: &str, payload: &[u8]) {
    producer
        .send(
            FutureRecord::to(topic).key(key).payload(payload),
            Duration::from_secs(30),
        )
        .await
        .map_err(|(e, _)| e)
        .unwrap();
}

/// Produces each order's event keyed by its order id, as the relay does.
async fn produce_keyed_by_order(topic: &str, orders: &[OrderConfirmed]) {
    let producer = kafka::producer(&brokers()).unwrap();
    for order in orders {
        produce(
            &producer,
            topic,
            &order.order_id.to_string(),
            &envelope(order).1,
        )
        .await;
    }
}

/// Waits until the group has committed everything on the topic.
async fn wait_consumed(topic: &str, group: &str, within: Duration) {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let lag = order_service::health::BrokerProbe::new(&brokers(), group, topic)
            .unwrap()
            .lag()
            .await;
        if matches!(&lag, Ok(p) if !p.is_empty() && p.iter().all(|(_, lag)| *lag == 0)) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "still lagging: {lag:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The health endpoint's broker reading (lag, DLQ depth) is shared by the
/// callers within its time to live, and read afresh after it.
#[tokio::test]
async fn the_lag_reading_is_shared_within_its_ttl() {
    let (topic, group) = names();
    kafka::ensure_topics(&brokers(), &[&topic], 1)
        .await
        .unwrap();
    // Long enough for three sends on a busy machine.
    let ttl = Duration::from_secs(5);
    let probe = order_service::health::BrokerProbe::new(&brokers(), &group, &topic)
        .unwrap()
        .with_reading_ttl(ttl);
    let first = probe.reading().await;
    assert_eq!((first.lag, first.dlq_messages), (Some(0), Some(0)));
    let producer = kafka::producer(&brokers()).unwrap();
    for key in ["a", "b", "c"] {
        produce(&producer, &topic, key, b"{}").await;
    }
    assert_eq!(
        probe.clone().reading().await,
        first,
        "within the TTL: the same reading"
    );
    tokio::time::sleep_until(first.at + ttl).await;
    let fresh = probe.reading().await;
    assert!(fresh.at > first.at);
    assert_eq!(fresh.lag, Some(3), "{fresh:?}");
}

/// Runs an in-process worker until its group has consumed the whole topic,
/// then stops it and returns what it did.
async fn consume_all(
    config: WorkerConfig,
    pool: &PgPool,
    within: Duration,
) -> order_service::worker::WorkerStats {
    let (topic, group) = (config.topic.clone(), config.group.clone());
    let cancel = CancellationToken::new();
    let worker = tokio::spawn(order_service::worker::run(
        config,
        pool.clone(),
        cancel.clone(),
    ));
    wait_consumed(&topic, &group, within).await;
    cancel.cancel();
    worker.await.unwrap().unwrap()
}

async fn count(pool: &PgPool, sql: &str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
}

#[sqlx::test(migrator = "order_service::MIGRATOR")]
async fn the_same_event_delivered_three_times_makes_one_ticket_set(pool: PgPool) {
    let (topic, group) = names();
    kafka::ensure_topics(&brokers(), &[&topic], 2)
        .await
        .unwrap();
    let order = seed_orders(&pool, 1, 3).await.remove(0);
    let (_, payload) = envelope(&order);
    let producer = kafka::producer(&brokers()).unwrap();
    for _ in 0..3 {
        produce(&producer, &topic, &order.order_id.to_string(), &payload).await;
    }
    let stats = consume_all(config(&topic, &group), &pool, Duration::from_secs(60)).await;
    assert_eq!((stats.issued, stats.duplicates), (1, 2), "{stats:?}");
    assert_eq!(count(&pool, "SELECT count(*) FROM tickets").await, 3);
}

#[sqlx::test(migrator = "order_service::MIGRATOR")]
async fn keys_run_in_parallel_but_each_key_in_order(pool: PgPool) {
    let (topic, group) = names();
    kafka::ensure_topics(&brokers(), &[&topic], 4)
        .await
        .unwrap();
    // 50 keys, 3 events each, produced interleaved: k0 k1 … k49 k0 k1 …
    let orders = seed_orders(&pool, 150, 1).await;
    let producer = kafka::producer(&brokers()).unwrap();
    let mut produced: std::collections::HashMap<String, Vec<Uuid>> = Default::default();
    for (i, order) in orders.iter().enumerate() {
        let key = format!("key-{}", i % 50);
        let (id, payload) = envelope(order);
        produce(&producer, &topic, &key, &payload).await;
        produced.entry(key).or_default().push(id);
    }
    let mut config = config(&topic, &group);
    config.workers = Workers::Fixed(8);
    config.extra_service_ms = 30;
    let stats = consume_all(config, &pool, Duration::from_secs(90)).await;
    assert_eq!(stats.issued, 150, "{stats:?}");
    assert!(
        stats.max_in_flight >= 4,
        "the pool was not used in parallel: {stats:?}"
    );
    assert!(
        stats.max_in_flight <= 8,
        "more than the pool at once: {stats:?}"
    );
    // The order each event took effect in, per key, is the order it was produced in.
    let applied: Vec<(Uuid,)> =
        sqlx::query_as("SELECT event_id FROM processed_events ORDER BY seq")
            .fetch_all(&pool)
            .await
            .unwrap();
    let position: std::collections::HashMap<Uuid, usize> = applied
        .iter()
        .enumerate()
        .map(|(i, (id,))| (*id, i))
        .collect();
    for (key, ids) in &produced {
        let positions: Vec<usize> = ids.iter().map(|id| position[id]).collect();
        assert!(
            positions.windows(2).all(|w| w[0] < w[1]),
            "{key} took effect out of order: {positions:?}"
        );
    }
}

/// Reads every message of `topic` from the start (a group of its own).
async fn read_all(topic: &str, expected: usize) -> Vec<rdkafka::message::OwnedMessage> {
    let consumer: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .set("group.id", format!("reader-{}", Uuid::new_v4()))
        .set("auto.offset.reset", "earliest")
        .create()
        .unwrap();
    consumer.subscribe(&[topic]).unwrap();
    let mut seen = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while seen.len() < expected && tokio::time::Instant::now() < deadline {
        if let Ok(Ok(m)) = tokio::time::timeout(Duration::from_secs(1), consumer.recv()).await {
            seen.push(m.detach());
        }
    }
    seen
}

#[sqlx::test(migrator = "order_service::MIGRATOR")]
async fn a_poison_message_goes_to_the_dlq_and_its_partition_moves_on(pool: PgPool) {
    let (topic, group) = names();
    kafka::ensure_topics(&brokers(), &[&topic], 1)
        .await
        .unwrap();
    let orders = seed_orders(&pool, 2, 2).await;
    let producer = kafka::producer(&brokers()).unwrap();
    produce(&producer, &topic, "a", &envelope(&orders[0]).1).await;
    produce(&producer, &topic, "poison", b"{ not json").await;
    produce(&producer, &topic, "b", &envelope(&orders[1]).1).await;

    let stats = consume_all(config(&topic, &group), &pool, Duration::from_secs(60)).await;
    assert_eq!((stats.issued, stats.dead_lettered), (2, 1), "{stats:?}");
    assert_eq!(count(&pool, "SELECT count(*) FROM tickets").await, 4);

    let letters = read_all(&format!("{topic}.dlq"), 1).await;
    assert_eq!(letters.len(), 1);
    let letter = &letters[0];
    assert_eq!(letter.payload(), Some(&b"{ not json"[..]));
    assert_eq!(letter.key(), Some(&b"poison"[..]));
    assert_eq!(dlq::header(letter, dlq::ERROR_CLASS), Some("fatal"));
    assert!(dlq::header(letter, dlq::REASON)
        .unwrap()
        .contains("not a CloudEvent"));
    assert_eq!(
        dlq::header(letter, dlq::ORIGINAL_TOPIC),
        Some(topic.as_str())
    );
    assert_eq!(dlq::header(letter, dlq::ORIGINAL_PARTITION), Some("0"));
    assert_eq!(dlq::header(letter, dlq::ORIGINAL_OFFSET), Some("1"));
}

#[sqlx::test(migrator = "order_service::MIGRATOR")]
async fn an_out_of_range_quantity_is_dead_lettered_and_its_key_moves_on(pool: PgPool) {
    let (topic, group) = names();
    kafka::ensure_topics(&brokers(), &[&topic], 1)
        .await
        .unwrap();
    let orders = seed_orders(&pool, 2, 2).await;
    // A well-formed event whose seat range would overflow (it panicked the
    // handler once, leaving its key busy and the partition's commit frozen).
    let mut huge = orders[0].clone();
    huge.order_id = Uuid::now_v7();
    huge.quantity = i32::MAX;
    let producer = kafka::producer(&brokers()).unwrap();
    produce(&producer, &topic, "same-key", &envelope(&huge).1).await;
    produce(&producer, &topic, "same-key", &envelope(&orders[0]).1).await;
    produce(&producer, &topic, "b", &envelope(&orders[1]).1).await;

    let stats = consume_all(config(&topic, &group), &pool, Duration::from_secs(60)).await;
    assert_eq!((stats.issued, stats.dead_lettered), (2, 1), "{stats:?}");
    assert_eq!(count(&pool, "SELECT count(*) FROM tickets").await, 4);
    let letters = read_all(&format!("{topic}.dlq"), 1).await;
    assert_eq!(dlq::header(&letters[0], dlq::ERROR_CLASS), Some("fatal"));
    assert!(dlq::header(&letters[0], dlq::REASON)
        .unwrap()
        .contains("quantity"));
}

#[sqlx::test(migrator = "order_service::MIGRATOR")]
async fn an_outage_longer_than_the_backoff_pauses_the_work_and_dead_letters_nothing(pool: PgPool) {
    let (topic, group) = names();
    kafka::ensure_topics(&brokers(), &[&topic], 1)
        .await
        .unwrap();
    let orders = seed_orders(&pool, 2, 1).await;
    let mut config = config(&topic, &group);
    config.retry_backoff_ms = 50;
    config.retry_max_backoff_ms = 200;
    // The ticket store fails: a file where its `orders/` folder must go.
    std::fs::create_dir_all(&config.ticket_store).unwrap();
    let blocker = std::path::Path::new(&config.ticket_store).join("orders");
    std::fs::write(&blocker, b"in the way").unwrap();
    produce_keyed_by_order(&topic, &orders).await;

    // Four seconds of outage: the old 50/200/800 ms schedule dead-lettered
    // both messages as exhausted after about a second.
    let heal = tokio::spawn({
        let blocker = blocker.clone();
        async move {
            tokio::time::sleep(Duration::from_secs(4)).await;
            std::fs::remove_file(&blocker).unwrap();
        }
    });
    let stats = consume_all(config, &pool, Duration::from_secs(90)).await;
    heal.await.unwrap();
    assert_eq!((stats.issued, stats.dead_lettered), (2, 0), "{stats:?}");
    assert_eq!(count(&pool, "SELECT count(*) FROM tickets").await, 2);
}

#[sqlx::test(migrator = "order_service::MIGRATOR")]
async fn a_dead_letter_redriven_after_its_cause_is_fixed_takes_effect(pool: PgPool) {
    let (topic, group) = names();
    kafka::ensure_topics(&brokers(), &[&topic], 1)
        .await
        .unwrap();
    seed_orders(&pool, 0, 1).await;
    // An event for an order the database does not have (yet): a foreign-key
    // violation, which fails the same way every time: fatal.
    let missing = OrderConfirmed {
        order_id: Uuid::now_v7(),
        event_id: "ev".into(),
        fan_id: "late".into(),
        quantity: 2,
        first_seat: 1,
        amount_cents: 200,
    };
    let producer = kafka::producer(&brokers()).unwrap();
    produce(&producer, &topic, "late", &envelope(&missing).1).await;
    let cancel = CancellationToken::new();
    let worker = tokio::spawn(order_service::worker::run(
        config(&topic, &group),
        pool.clone(),
        cancel.clone(),
    ));
    wait_consumed(&topic, &group, Duration::from_secs(60)).await;
    assert_eq!(count(&pool, "SELECT count(*) FROM tickets").await, 0);

    // The cause is fixed; the dead letter is sent back and takes effect.
    insert_order(&pool, &missing).await;
    let redrive = order_service::RedriveConfig {
        kafka_brokers: brokers(),
        from: format!("{topic}.dlq"),
        to: None,
        group: format!("redrive-{group}"),
        max: None,
    };
    assert_eq!(dlq::redrive(&redrive).await.unwrap(), 1);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while count(&pool, "SELECT count(*) FROM tickets").await < 2 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the redriven event never took effect"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        dlq::redrive(&redrive).await.unwrap(),
        0,
        "a second redrive finds nothing new"
    );
    cancel.cancel();
    let stats = worker.await.unwrap().unwrap();
    assert_eq!((stats.issued, stats.dead_lettered), (1, 1), "{stats:?}");
}

#[sqlx::test(migrator = "order_service::MIGRATOR")]
async fn auto_sizes_the_pool_from_littles_law(pool: PgPool) {
    let (topic, group) = names();
    kafka::ensure_topics(&brokers(), &[&topic], 1)
        .await
        .unwrap();
    let mut config = config(&topic, &group);
    config.workers = Workers::Auto;
    config.arrival_rate = 200.0;
    config.service_time_ms = 50.0;
    config.utilization = 0.5;
    let cancel = CancellationToken::new();
    let worker = tokio::spawn(order_service::worker::run(config, pool, cancel.clone()));
    tokio::time::sleep(Duration::from_millis(500)).await;
    cancel.cancel();
    let stats = worker.await.unwrap().unwrap();
    // λ × S / ρ = 200 × 0.05 / 0.5 = 20.
    assert_eq!(stats.pool_size, 20);
}

// ---- the real binary, where a process must die ----

struct WorkerProcess {
    child: Child,
    metrics: String,
}

/// A failed test must not leave its worker running (it would hold the test
/// database open and consume the next run's messages).
impl Drop for WorkerProcess {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.child.kill().ok();
            self.child.wait().ok();
        }
    }
}

fn spawn_worker(db: &str, topic: &str, group: &str, env: &[(&str, &str)]) -> WorkerProcess {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut command = Command::new(env!("CARGO_BIN_EXE_order-service"));
    command
        .arg("worker")
        .env("WORKER_LISTEN", format!("127.0.0.1:{port}"))
        .env("DATABASE_URL", db)
        .env("KAFKA_BROKERS", brokers())
        .env("BOXOFFICE_ORDER_TOPIC", topic)
        .env("BOXOFFICE_WORKER_GROUP", group)
        .env("BOXOFFICE_COMMIT_INTERVAL_MS", "100")
        .env("BOXOFFICE_MAX_POLL_INTERVAL_MS", "15000")
        .env("BOXOFFICE_TICKET_STORE", common::ticket_store(group))
        .env("BOXOFFICE_TICKET_SECRET", common::TICKET_SECRET)
        .env("BOXOFFICE_ALLOW_DEV_SECRETS", "true")
        .env(
            "RUST_LOG",
            std::env::var("WORKER_LOG").unwrap_or_else(|_| "warn".into()),
        )
        .stdout(Stdio::null());
    if let Ok(dir) = std::env::var("WORKER_LOG_DIR") {
        let file = std::fs::File::create(format!("{dir}/worker-{port}.log")).unwrap();
        command.stdout(file);
    }
    for (name, value) in env {
        command.env(name, value);
    }
    WorkerProcess {
        child: command.spawn().expect("spawning the worker"),
        metrics: format!("http://127.0.0.1:{port}/metrics"),
    }
}

/// A gauge from the worker's /metrics, or `None` before it answers.
async fn gauge(url: &str, name: &str) -> Option<f64> {
    let text = reqwest::get(url).await.ok()?.text().await.ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
}

#[sqlx::test(migrator = "order_service::MIGRATOR")]
async fn sigterm_with_twenty_in_flight_drains_commits_and_exits_zero(pool: PgPool) {
    let (topic, group) = names();
    kafka::ensure_topics(&brokers(), &[&topic], 2)
        .await
        .unwrap();
    let orders = seed_orders(&pool, 20, 1).await;
    produce_keyed_by_order(&topic, &orders).await;
    let db = database_url(&pool).await;
    let worker = spawn_worker(
        &db,
        &topic,
        &group,
        &[
            ("BOXOFFICE_WORKERS", "32"),
            ("BOXOFFICE_EXTRA_SERVICE_MS", "3000"),
        ],
    );
    // All twenty in the middle of their (slow) service time.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while gauge(&worker.metrics, "boxoffice_worker_in_flight").await != Some(20.0) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "never had 20 in flight"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        count(&pool, "SELECT count(*) FROM processed_events").await,
        0
    );
    // SAFETY: signalling a child we own.
    unsafe { libc::kill(worker.child.id() as i32, libc::SIGTERM) };
    let status = tokio::task::spawn_blocking(move || {
        let mut worker = worker;
        worker.child.wait().unwrap()
    })
    .await
    .unwrap();
    assert!(status.success(), "{status:?}");
    assert_eq!(
        count(&pool, "SELECT count(*) FROM processed_events").await,
        20
    );
    assert_eq!(count(&pool, "SELECT count(*) FROM tickets").await, 20);
    // Committed before exit: a restart has nothing to re-process.
    wait_consumed(&topic, &group, Duration::from_secs(5)).await;
}

#[sqlx::test(migrator = "order_service::MIGRATOR")]
async fn kill_9_mid_batch_then_restart_processes_every_message_once_in_effect(pool: PgPool) {
    let (topic, group) = names();
    kafka::ensure_topics(&brokers(), &[&topic], 2)
        .await
        .unwrap();
    let orders = seed_orders(&pool, 40, 2).await;
    produce_keyed_by_order(&topic, &orders).await;
    let db = database_url(&pool).await;
    let mut worker = spawn_worker(
        &db,
        &topic,
        &group,
        &[
            ("BOXOFFICE_WORKERS", "4"),
            ("BOXOFFICE_EXTRA_SERVICE_MS", "200"),
            ("BOXOFFICE_WORKER_INSTANCE", "worker-0"),
            // The default: the static member's session is then 45 s.
            ("BOXOFFICE_MAX_POLL_INTERVAL_MS", "60000"),
        ],
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while count(&pool, "SELECT count(*) FROM processed_events").await < 8 {
        assert!(tokio::time::Instant::now() < deadline, "too slow to start");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    worker.child.kill().unwrap();
    worker.child.wait().unwrap();
    let before = count(&pool, "SELECT count(*) FROM processed_events").await;
    assert!(before < 40, "the kill came too late to test anything");
    // Back after a pause, as a pod rescheduled: on tansu, with its 3 s holds
    // of a static member's JoinGroup and SyncGroup, the first heartbeat then
    // comes more than 10 s after the last one: a 10 s session lapsed, the
    // member was evicted, and the group could wedge.
    tokio::time::sleep(Duration::from_secs(6)).await;

    let mut restarted = spawn_worker(
        &db,
        &topic,
        &group,
        &[
            ("BOXOFFICE_WORKERS", "4"),
            ("BOXOFFICE_WORKER_INSTANCE", "worker-0"),
            ("BOXOFFICE_MAX_POLL_INTERVAL_MS", "60000"),
        ],
    );
    wait_consumed(&topic, &group, Duration::from_secs(90)).await;
    assert_eq!(
        count(&pool, "SELECT count(*) FROM processed_events").await,
        40
    );
    assert_eq!(count(&pool, "SELECT count(*) FROM tickets").await, 80);
    let doubled: i64 = count(
        &pool,
        "SELECT count(*) FROM (SELECT order_id FROM tickets GROUP BY order_id HAVING count(*) <> 2) x",
    )
    .await;
    assert_eq!(doubled, 0);
    // It took its old place: its session outlived the pause, so the group
    // neither evicted it nor took its partitions back.
    assert_eq!(
        counter(
            &restarted.metrics,
            "boxoffice_worker_partitions_revoked_total"
        )
        .await,
        0.0,
        "the restarted static member was rebalanced"
    );
    assert_eq!(
        gauge(&restarted.metrics, "boxoffice_worker_assigned_partitions").await,
        Some(2.0)
    );
    restarted.child.kill().unwrap();
    restarted.child.wait().unwrap();
}

/// A counter from the worker's /metrics (0 when it was never incremented).
async fn counter(url: &str, name: &str) -> f64 {
    let text = reqwest::get(url).await.unwrap().text().await.unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
        .unwrap_or(0.0)
}

#[sqlx::test(migrator = "order_service::MIGRATOR")]
async fn a_rebalance_drains_in_flight_work_and_commits_before_giving_partitions_away(pool: PgPool) {
    let (topic, group) = names();
    kafka::ensure_topics(&brokers(), &[&topic], 4)
        .await
        .unwrap();
    let orders = seed_orders(&pool, 80, 1).await;
    produce_keyed_by_order(&topic, &orders).await;
    let db = database_url(&pool).await;
    let slow = [
        ("BOXOFFICE_WORKERS", "8"),
        ("BOXOFFICE_EXTRA_SERVICE_MS", "2000"),
    ];
    let mut first = spawn_worker(&db, &topic, &group, &slow);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while gauge(&first.metrics, "boxoffice_worker_in_flight").await < Some(8.0) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the first worker never filled its pool"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A second member joins while eight messages are in the middle of their work.
    let mut second = spawn_worker(&db, &topic, &group, &slow);
    wait_consumed(&topic, &group, Duration::from_secs(120)).await;
    assert_eq!(
        count(&pool, "SELECT count(*) FROM processed_events").await,
        80
    );
    let duplicate = "boxoffice_worker_events_total{outcome=\"duplicate\"}";
    let issued = "boxoffice_worker_events_total{outcome=\"issued\"}";
    let (a, b) = (
        counter(&first.metrics, duplicate).await,
        counter(&second.metrics, duplicate).await,
    );
    // Without the drain, the new owner would redeliver what was in flight.
    assert_eq!(
        (a, b),
        (0.0, 0.0),
        "messages handled twice across the rebalance"
    );
    let shared = (
        counter(&first.metrics, issued).await,
        counter(&second.metrics, issued).await,
    );
    assert_eq!(shared.0 + shared.1, 80.0, "{shared:?}");
    assert!(
        shared.1 > 0.0,
        "the second member never got work: {shared:?}"
    );
    // The first member gave its four partitions back and got its share again.
    let revoked = "boxoffice_worker_partitions_revoked_total";
    assert!(counter(&first.metrics, revoked).await >= 4.0);
    let held = (
        gauge(&first.metrics, "boxoffice_worker_assigned_partitions").await,
        gauge(&second.metrics, "boxoffice_worker_assigned_partitions").await,
    );
    assert_eq!(
        held.0.zip(held.1).map(|(a, b)| a + b),
        Some(4.0),
        "{held:?}"
    );
    for worker in [&mut first, &mut second] {
        // SAFETY: signalling a child we own.
        unsafe { libc::kill(worker.child.id() as i32, libc::SIGTERM) };
        assert!(worker.child.wait().unwrap().success());
    }
}

/// A member killed for good (kill -9, never restarted): its partitions do
/// not stay with it. tansu 0.6.0 keeps a dead member's assignment; the
/// survivor sees them behind and unmoved, not its own, leaves the group and
/// joins again, and gets them. Every order gets its tickets once.
#[sqlx::test(migrator = "order_service::MIGRATOR")]
async fn a_dead_members_partitions_go_to_the_survivor(pool: PgPool) {
    let (topic, group) = names();
    kafka::ensure_topics(&brokers(), &[&topic], 4)
        .await
        .unwrap();
    let orders = seed_orders(&pool, 80, 1).await;
    produce_keyed_by_order(&topic, &orders).await;
    let db = database_url(&pool).await;
    // ORPHAN_TIMEOUT_MS=0 turns the watch off, to see this test fail without it.
    let watch = std::env::var("ORPHAN_TIMEOUT_MS").unwrap_or_else(|_| "5000".into());
    let env = [
        ("BOXOFFICE_WORKERS", "2"),
        ("BOXOFFICE_EXTRA_SERVICE_MS", "500"),
        ("BOXOFFICE_ORPHAN_TIMEOUT_MS", watch.as_str()),
    ];
    let mut survivor = spawn_worker(&db, &topic, &group, &env);
    let issued = "boxoffice_worker_events_total{outcome=\"issued\"}";
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while gauge(&survivor.metrics, "boxoffice_worker_in_flight").await < Some(1.0) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the first worker never started"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut doomed = spawn_worker(&db, &topic, &group, &env);
    while gauge(&doomed.metrics, issued).await < Some(1.0) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the second worker never got work"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    doomed.child.kill().unwrap();
    doomed.child.wait().unwrap();
    assert!(
        count(&pool, "SELECT count(*) FROM processed_events").await < 60,
        "the kill came too late to leave anything behind"
    );

    wait_consumed(&topic, &group, Duration::from_secs(120)).await;
    assert_eq!(
        count(&pool, "SELECT count(*) FROM processed_events").await,
        80
    );
    let not_once: i64 = count(
        &pool,
        "SELECT count(*) FROM orders o WHERE (SELECT count(*) FROM tickets t WHERE t.order_id = o.order_id) <> 1",
    )
    .await;
    assert_eq!(not_once, 0);
    assert!(counter(&survivor.metrics, "boxoffice_worker_resubscribes_total").await >= 1.0);
    // SAFETY: signalling a child we own.
    unsafe { libc::kill(survivor.child.id() as i32, libc::SIGTERM) };
    assert!(survivor.child.wait().unwrap().success());
}
