//! Outbox relays against the real broker: several at once publish every row
//! exactly once in the normal path, in id order per key.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::brokers;
use order_service::kafka::{self, Publisher};
use order_service::relay::{self, RelayConfig};
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::producer::FutureRecord;
use rdkafka::{ClientConfig, Message};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

#[sqlx::test(migrator = "order_service::MIGRATOR")]
async fn two_relays_publish_every_row_once_in_order_per_key(pool: PgPool) {
    let topic = format!("relay-{}", uuid::Uuid::new_v4().simple());
    kafka::ensure_topics(&brokers(), &[&topic], 3)
        .await
        .unwrap();
    // 600 rows over 20 keys; each payload carries its sequence within its key.
    sqlx::query(
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
         SELECT 'order', 'key-' || (n % 20), 'test', jsonb_build_object('id', n::text, 'seq', n / 20)
         FROM generate_series(0, 599) AS n",
    )
    .execute(&pool)
    .await
    .unwrap();

    let cancel = CancellationToken::new();
    let config = RelayConfig {
        topic: topic.clone(),
        batch: 25,
        retention: Duration::from_secs(3_600),
        idle: Duration::from_millis(20),
        crash_after_publish: false,
    };
    let relays: Vec<_> = (0..2)
        .map(|_| {
            tokio::spawn(relay::run(
                pool.clone(),
                kafka::producer(&brokers()).unwrap(),
                config.clone(),
                relay::RelayHealth::default(),
                || kafka::producer(&brokers()),
                cancel.clone(),
            ))
        })
        .collect();

    let consumer = reader(&topic);
    let mut by_key: HashMap<String, Vec<i64>> = HashMap::new();
    let mut total = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while total < 600 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "only {total} of 600 arrived"
        );
        let Ok(Ok(message)) = tokio::time::timeout(Duration::from_secs(1), consumer.recv()).await
        else {
            continue;
        };
        let key = String::from_utf8_lossy(message.key().unwrap()).into_owned();
        let payload: serde_json::Value =
            serde_json::from_slice(message.payload().unwrap()).unwrap();
        by_key
            .entry(key)
            .or_default()
            .push(payload["seq"].as_i64().unwrap());
        total += 1;
    }
    // Nothing more arrives: no duplicates.
    let extra = tokio::time::timeout(Duration::from_secs(2), consumer.recv()).await;
    assert!(extra.is_err(), "a duplicate arrived");
    assert_eq!(by_key.len(), 20);
    for (key, seqs) in &by_key {
        assert_eq!(
            *seqs,
            (0..30).collect::<Vec<i64>>(),
            "{key} out of order or incomplete"
        );
    }
    let unpublished: i64 =
        sqlx::query_scalar("SELECT count(*) FROM outbox WHERE published_at IS NULL")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(unpublished, 0);

    cancel.cancel();
    for relay in relays {
        relay.await.unwrap();
    }
}

/// One partition whose broker is down (librdkafka's mock cluster: a fault
/// tansu cannot produce) must not stall the outbox: the other aggregates' rows
/// are published, the failing aggregate's wait, then follow in order.
#[sqlx::test(migrator = "order_service::MIGRATOR")]
async fn a_failing_partition_blocks_only_its_own_aggregates(pool: PgPool) {
    use rdkafka::mocking::MockCluster;

    let mock = MockCluster::new(2).unwrap();
    let topic = "relay-mock";
    mock.create_topic(topic, 2, 1).unwrap();
    mock.partition_leader(topic, 0, Some(1)).unwrap();
    mock.partition_leader(topic, 1, Some(2)).unwrap();
    let producer: Publisher = ClientConfig::new()
        .set("bootstrap.servers", mock.bootstrap_servers())
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("message.timeout.ms", "1500")
        .create()
        .unwrap();
    // Which keys land on which partition (the producer's own partitioner).
    let mut by_partition: HashMap<i32, Vec<String>> = HashMap::new();
    for n in 0..40 {
        let key = format!("order-{n}");
        let delivery = producer
            .send(
                FutureRecord::to(topic).key(&key).payload("probe"),
                Duration::from_secs(5),
            )
            .await
            .unwrap();
        by_partition
            .entry(delivery.partition)
            .or_default()
            .push(key);
    }
    let bad = by_partition[&1][0].clone();
    let good: Vec<String> = by_partition[&0].iter().take(5).cloned().collect();

    // The failing aggregate's three rows come first, then one row per good key;
    // a batch of 4 would never get past them if the whole batch failed.
    let mut keys = vec![bad.clone(), bad.clone(), bad.clone()];
    keys.extend(good.iter().cloned());
    for (seq, key) in keys.iter().enumerate() {
        sqlx::query(
            "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
             VALUES ('order', $1, 'test', jsonb_build_object('id', $2::text))",
        )
        .bind(key)
        .bind(seq.to_string())
        .execute(&pool)
        .await
        .unwrap();
    }
    // Partition 1's only broker goes down.
    mock.broker_down(2).unwrap();

    let config = RelayConfig {
        topic: topic.into(),
        batch: 4,
        retention: Duration::from_secs(3_600),
        idle: Duration::from_millis(20),
        crash_after_publish: false,
    };
    let mut blocked = relay::Blocked::default();
    for _ in 0..4 {
        let _ = relay::relay_batch(&pool, &producer, &config, &mut blocked).await;
    }
    let published = |pool: PgPool| async move {
        sqlx::query_scalar::<_, String>(
            "SELECT aggregate_id FROM outbox WHERE published_at IS NOT NULL ORDER BY id",
        )
        .fetch_all(&pool)
        .await
        .unwrap()
    };
    assert_eq!(
        published(pool.clone()).await,
        good,
        "the healthy aggregates went on"
    );

    // The partition comes back: the blocked aggregate follows, all of it.
    mock.broker_up(2).unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    for _ in 0..4 {
        let _ = relay::relay_batch(&pool, &producer, &config, &mut blocked).await;
    }
    let all = published(pool.clone()).await;
    assert_eq!(all.len(), 8, "{all:?}");
}

/// A fatal librdkafka error (injected with librdkafka's own test hook) makes
/// every send fail for good: the relay notices, builds a new producer, says
/// so while it cannot, and the outbox flows again.
#[sqlx::test(migrator = "order_service::MIGRATOR")]
async fn a_fatal_producer_error_is_noticed_and_the_producer_rebuilt(pool: PgPool) {
    let topic = format!("relay-fatal-{}", uuid::Uuid::new_v4().simple());
    kafka::ensure_topics(&brokers(), &[&topic], 1)
        .await
        .unwrap();
    let producer = kafka::producer(&brokers()).unwrap();
    let reason = std::ffi::CString::new("injected by the test").unwrap();
    // SAFETY: the producer's handle is live for the call; librdkafka copies the reason.
    let injected = unsafe {
        rdkafka::bindings::rd_kafka_test_fatal_error(
            producer.client().native_ptr(),
            rdkafka::bindings::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_OUT_OF_ORDER_SEQUENCE_NUMBER,
            reason.as_ptr(),
        )
    };
    assert_eq!(
        injected,
        rdkafka::bindings::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR
    );
    assert!(
        producer.client().fatal_error().is_some(),
        "the producer is fatally failed"
    );

    sqlx::query(
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
         SELECT 'order', 'key-' || n, 'test', jsonb_build_object('id', n::text)
         FROM generate_series(1, 5) AS n",
    )
    .execute(&pool)
    .await
    .unwrap();
    let health = relay::RelayHealth::default();
    let rebuilds = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let cancel = CancellationToken::new();
    let task = tokio::spawn(relay::run(
        pool.clone(),
        producer,
        RelayConfig {
            topic,
            batch: 10,
            retention: Duration::from_secs(3_600),
            idle: Duration::from_millis(20),
            crash_after_publish: false,
        },
        health.clone(),
        {
            let rebuilds = rebuilds.clone();
            move || {
                rebuilds.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                kafka::producer(&brokers())
            }
        },
        cancel.clone(),
    ));
    let mut published = 0;
    for _ in 0..300 {
        published = sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM outbox WHERE published_at IS NOT NULL",
        )
        .fetch_one(&pool)
        .await
        .unwrap();
        if published == 5 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    cancel.cancel();
    task.await.unwrap();
    assert_eq!(published, 5, "the outbox flowed again");
    assert_eq!(rebuilds.load(std::sync::atomic::Ordering::SeqCst), 1);
    assert_eq!(health.fatal(), None, "ready again once rebuilt");
}

/// While the relay's producer is unusable, the order service is not ready,
/// and says why.
#[sqlx::test(migrator = "order_service::MIGRATOR")]
async fn readiness_says_when_the_outbox_producer_has_failed(pool: PgPool) {
    let config = {
        let mut c = order_service::ServeConfig::defaults();
        c.redis_url = common::redis_url();
        c.kafka_brokers = brokers();
        c.saga_runners = 0;
        c.relay = false;
        c.ticket_store = common::ticket_store("readyz");
        c
    };
    let service = common::OrderService::start(pool, config).await;
    let ready = || async {
        service
            .http
            .get(format!("{}/readyz", service.url))
            .send()
            .await
            .unwrap()
    };
    assert_eq!(ready().await.status(), 200);
    service
        .relay
        .set_fatal(Some("OutOfOrderSequenceNumber: injected".into()));
    let answer = ready().await;
    assert_eq!(answer.status(), 503);
    let body: serde_json::Value = answer.json().await.unwrap();
    assert!(
        body["detail"]
            .as_str()
            .unwrap()
            .contains("outbox producer failed: OutOfOrderSequenceNumber"),
        "{body}"
    );
    service.relay.set_fatal(None);
    assert_eq!(ready().await.status(), 200);
    service.stop().await;
}

/// An idle relay does not poll the outbox: the trigger's notification wakes
/// it, so a row written after a quiet spell is published at once (the
/// bound leaves room for a busy machine). The fallback poll is a minute
/// here, so only the notification can do it.
#[sqlx::test(migrator = "order_service::MIGRATOR")]
async fn an_idle_relay_is_woken_by_the_outbox_notification(pool: PgPool) {
    let topic = format!("relay-notify-{}", uuid::Uuid::new_v4().simple());
    kafka::ensure_topics(&brokers(), &[&topic], 1)
        .await
        .unwrap();
    let cancel = CancellationToken::new();
    let task = tokio::spawn(relay::run(
        pool.clone(),
        kafka::producer(&brokers()).unwrap(),
        RelayConfig {
            topic: topic.clone(),
            batch: 10,
            retention: Duration::from_secs(3_600),
            idle: Duration::from_secs(60),
            crash_after_publish: false,
        },
        relay::RelayHealth::default(),
        || kafka::producer(&brokers()),
        cancel.clone(),
    ));
    // Quiet long enough for the relay to have found the outbox empty and waited.
    tokio::time::sleep(Duration::from_secs(5)).await;

    let written = tokio::time::Instant::now();
    sqlx::query(
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
         VALUES ('order', 'key-1', 'test', '{\"id\": \"1\"}')",
    )
    .execute(&pool)
    .await
    .unwrap();
    loop {
        let published: bool = sqlx::query_scalar(
            "SELECT published_at IS NOT NULL FROM outbox WHERE aggregate_id = 'key-1'",
        )
        .fetch_one(&pool)
        .await
        .unwrap();
        if published {
            break;
        }
        assert!(
            written.elapsed() < Duration::from_secs(5),
            "not published {:?} after the write",
            written.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let latency = written.elapsed();
    eprintln!("published {latency:?} after the write");

    // And it is on the topic.
    let consumer = reader(&topic);
    let message = tokio::time::timeout(Duration::from_secs(30), consumer.recv())
        .await
        .expect("the row reached the topic")
        .unwrap();
    assert_eq!(message.key(), Some(&b"key-1"[..]));

    cancel.cancel();
    task.await.unwrap();
    assert!(
        latency < Duration::from_secs(3),
        "published after {latency:?}"
    );
}

/// A consumer of `topic` from its start, in a group of its own, committing
/// nothing: what a test reads the relay's output with.
fn reader(topic: &str) -> StreamConsumer {
    let consumer: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .set("group.id", format!("reader-{topic}"))
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    consumer.subscribe(&[topic]).unwrap();
    consumer
}

/// The `/proc` entry of this process's thread named `name`, if it runs.
fn thread_dir(name: &str) -> Option<std::path::PathBuf> {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .find_map(|task| {
            let dir = task.ok()?.path();
            let comm = std::fs::read_to_string(dir.join("comm")).ok()?;
            (comm.trim_end() == name).then_some(dir)
        })
}

/// How many times a thread has blocked (waited) so far.
fn waits(dir: &std::path::Path) -> u64 {
    let status = std::fs::read_to_string(dir.join("status")).unwrap();
    status
        .lines()
        .find_map(|line| line.strip_prefix("voluntary_ctxt_switches:"))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// An idle publisher's polling thread waits a second at a time. Each of its
/// waits ends in about a millisecond of busy polling (rdkafka's poll loop),
/// so rdkafka's own `FutureProducer`, waiting 100 ms at a time, costs ten
/// times as much idle: about 30 waits in these 3 seconds instead of 3.
#[tokio::test]
async fn an_idle_publishers_thread_wakes_about_once_a_second() {
    let topic = format!("publisher-idle-{}", uuid::Uuid::new_v4().simple());
    kafka::ensure_topics(&brokers(), &[&topic], 1)
        .await
        .unwrap();
    let publisher = kafka::producer(&brokers()).unwrap();
    // Connected, with the topic's metadata: from here on it has nothing to do.
    publisher
        .send(
            FutureRecord::to(&topic).key("k").payload("v"),
            Duration::from_secs(5),
        )
        .await
        .unwrap();
    let thread = thread_dir(publisher.poll_thread()).expect("the polling thread runs");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = waits(&thread);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let woke = waits(&thread) - before;
    assert!(woke <= 8, "{woke} waits in 3 s of idle");
}

/// Clones share one polling thread, which ends soon after the last clone.
#[tokio::test]
async fn the_polling_thread_ends_after_the_last_clone() {
    let publisher = kafka::producer(&brokers()).unwrap();
    let name = publisher.poll_thread().to_owned();
    let clone = publisher.clone();
    assert_eq!(clone.poll_thread(), name);
    drop(publisher);
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert!(thread_dir(&name).is_some(), "a clone still needs it");
    drop(clone);
    let mut ended = false;
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if thread_dir(&name).is_none() {
            ended = true;
            break;
        }
    }
    assert!(ended, "{name} still runs 5 s after the last clone went");
}

/// While librdkafka's queue is full a send is retried until its queue
/// timeout; past it the send fails with `QueueFull` and hands the record back.
#[tokio::test]
async fn a_full_queue_is_retried_until_the_queue_timeout() {
    use rdkafka::error::KafkaError;
    use rdkafka::types::RDKafkaErrorCode;

    let topic = format!("publisher-full-{}", uuid::Uuid::new_v4().simple());
    kafka::ensure_topics(&brokers(), &[&topic], 1)
        .await
        .unwrap();
    let publisher: Publisher = ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .set("queue.buffering.max.messages", "1")
        .set("linger.ms", "500")
        .create()
        .unwrap();
    let first = {
        let (publisher, topic) = (publisher.clone(), topic.clone());
        tokio::spawn(async move {
            publisher
                .send(
                    FutureRecord::to(&topic).key("1").payload("first"),
                    Duration::ZERO,
                )
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (error, record) = publisher
        .send(
            FutureRecord::to(&topic).key("2").payload("refused"),
            Duration::ZERO,
        )
        .await
        .unwrap_err();
    assert_eq!(
        error,
        KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull)
    );
    assert_eq!(record.topic(), topic);
    assert_eq!(record.key(), Some(&b"2"[..]));
    assert_eq!(record.payload(), Some(&b"refused"[..]));
    let waited = publisher
        .send(
            FutureRecord::to(&topic).key("3").payload("waited"),
            Duration::from_secs(10),
        )
        .await
        .unwrap();
    let first = first.await.unwrap().unwrap();
    assert_eq!((first.partition, waited.partition), (0, 0));
    assert!(waited.offset > first.offset, "{first:?} then {waited:?}");
}
