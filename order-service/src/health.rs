//! How the purchase pipeline is doing, for adaptive admission and for ops:
//! order latency, the outbox backlog, the ticket workers' consumer lag, the
//! dead-letter topic's depth and order outcomes.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use crate::kafka::EnvOptions;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Health {
    /// 95th percentile of placed → confirmed over the last minute; `None` without orders.
    pub order_latency_p95_ms: Option<f64>,
    /// Outbox rows not yet published.
    pub outbox_backlog: i64,
    /// Age of the oldest unpublished outbox row.
    pub outbox_oldest_age_s: f64,
    /// Messages on the order topic the ticket workers have not committed; `None` if the broker did not say.
    pub consumer_lag: Option<i64>,
    /// Messages in the dead-letter topic; `None` if the broker did not say.
    #[serde(default)]
    pub dlq_messages: Option<i64>,
    /// Orders by status (of one event when asked with `?event_id=`).
    #[serde(default)]
    pub orders: BTreeMap<String, i64>,
    /// Age of the oldest order not yet confirmed or failed: during a payment
    /// outage nothing confirms, so the latency above says nothing while this grows.
    #[serde(default)]
    pub oldest_unsettled_age_s: f64,
    /// Orders failed over the last minute for a reason of ours (a lapsed
    /// hold, a cancelled payment), declined cards not counted.
    #[serde(default)]
    pub orders_failed_1m: i64,
    /// Orders confirmed over the last minute.
    #[serde(default)]
    pub orders_confirmed_1m: i64,
    /// Whether the payment client's circuit breaker lets calls through.
    #[serde(default = "yes")]
    pub payments_available: bool,
}

fn yes() -> bool {
    true
}

pub async fn database(pool: &PgPool, event_id: Option<&str>) -> sqlx::Result<Health> {
    let outbox = sqlx::query!(
        r#"SELECT count(*) AS "backlog!", extract(epoch FROM now() - min(created_at))::float8 AS "oldest?"
         FROM outbox WHERE published_at IS NULL"#,
    )
    .fetch_one(pool)
    .await?;
    let (backlog, oldest) = (outbox.backlog, outbox.oldest);
    let p95: Option<f64> = sqlx::query_scalar!(
        r#"SELECT (percentile_cont(0.95) WITHIN GROUP (ORDER BY extract(epoch FROM updated_at - created_at)) * 1000)::float8 AS "p95?"
         FROM orders WHERE status = 'confirmed' AND updated_at > now() - interval '60 seconds'"#,
    )
    .fetch_one(pool)
    .await?;
    let settled = sqlx::query!(
        r#"SELECT (SELECT extract(epoch FROM now() - min(created_at))::float8 FROM orders
                 WHERE status IN ('pending', 'reserved', 'charged')) AS "unsettled?",
                count(*) FILTER (WHERE status = 'failed' AND failure_reason IS DISTINCT FROM 'payment-declined') AS "failed!",
                count(*) FILTER (WHERE status = 'confirmed') AS "confirmed!"
         FROM orders WHERE status IN ('failed', 'confirmed') AND updated_at > now() - interval '60 seconds'"#,
    )
    .fetch_one(pool)
    .await?;
    let (unsettled, failed, confirmed) = (settled.unsettled, settled.failed, settled.confirmed);
    let orders = sqlx::query!(
        r#"SELECT status, count(*) AS "count!" FROM orders WHERE $1::text IS NULL OR event_id = $1 GROUP BY status"#,
        event_id,
    )
    .fetch_all(pool)
    .await?
    .into_iter()
    .map(|r| (r.status, r.count));
    Ok(Health {
        order_latency_p95_ms: p95,
        outbox_backlog: backlog,
        outbox_oldest_age_s: oldest.unwrap_or(0.0),
        consumer_lag: None,
        dlq_messages: None,
        orders: orders.collect(),
        oldest_unsettled_age_s: unsettled.unwrap_or(0.0),
        orders_failed_1m: failed,
        orders_confirmed_1m: confirmed,
        payments_available: true,
    })
}

/// How long `/internal/health` serves one reading of the consumer lag and
/// the DLQ depth before it asks the broker again. A reading takes a metadata
/// request, an offset fetch and two offset lists per partition of both
/// topics; asked every second by each admission replica's sampler and
/// adaptive controller, that was most of an idle stack's broker CPU. Five
/// seconds is how often the workers export `boxoffice_consumer_lag`.
pub const READING_TTL: Duration = Duration::from_secs(5);

/// One broker client per process for the consumer lag, the DLQ depth and
/// readiness (a client per call would cost a connection and threads each time).
/// Its calls block; they run on the blocking pool.
#[derive(Clone)]
pub struct BrokerProbe {
    consumer: Arc<BaseConsumer>,
    topic: String,
    timeout: Duration,
    reading: Arc<tokio::sync::Mutex<Option<Reading>>>,
    reading_ttl: Duration,
}

/// The consumer lag and the DLQ depth as read from the broker at `at`;
/// each `None` when the broker did not say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reading {
    pub at: tokio::time::Instant,
    pub lag: Option<i64>,
    pub dlq_messages: Option<i64>,
}

impl BrokerProbe {
    /// `group` is the ticket workers' consumer group whose commits the lag is read from.
    pub fn new(brokers: &str, group: &str, topic: &str) -> anyhow::Result<Self> {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", brokers)
            .set("group.id", group)
            .set("enable.auto.commit", "false")
            .with_env_options()
            .create()?;
        Ok(Self {
            consumer: Arc::new(consumer),
            topic: topic.to_owned(),
            timeout: Duration::from_secs(2),
            reading: Arc::default(),
            reading_ttl: READING_TTL,
        })
    }

    /// Serves each [`reading`](Self::reading) for `ttl` instead of [`READING_TTL`].
    pub fn with_reading_ttl(mut self, ttl: Duration) -> Self {
        self.reading_ttl = ttl;
        self
    }

    /// The total consumer lag and the DLQ depth, read from the broker at most
    /// once per [`READING_TTL`]: callers within it share one reading (a
    /// failed one too, so a broker that is down is not asked more often).
    pub async fn reading(&self) -> Reading {
        let mut cached = self.reading.lock().await;
        if let Some(reading) = cached
            .as_ref()
            .filter(|r| r.at.elapsed() < self.reading_ttl)
        {
            return reading.clone();
        }
        let (lag, dlq) = tokio::join!(self.lag(), self.dlq_depth());
        let reading = Reading {
            at: tokio::time::Instant::now(),
            lag: lag
                .inspect_err(|error| tracing::warn!(%error, "cannot read the consumer lag"))
                .ok()
                .map(|partitions| partitions.iter().map(|(_, lag)| lag).sum()),
            dlq_messages: dlq
                .inspect_err(|error| tracing::warn!(%error, "cannot read the DLQ depth"))
                .ok(),
        };
        *cached = Some(reading.clone());
        reading
    }

    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// Whether the broker answers a metadata request within a second.
    pub async fn reachable(&self) -> bool {
        let consumer = self.consumer.clone();
        tokio::task::spawn_blocking(move || {
            consumer
                .fetch_metadata(None, Duration::from_secs(1))
                .is_ok()
        })
        .await
        .unwrap_or(false)
    }

    /// Per partition of the order topic: high watermark − the group's committed offset.
    pub async fn lag(&self) -> anyhow::Result<Vec<(i32, i64)>> {
        Ok(self
            .progress()
            .await?
            .into_iter()
            .map(|p| (p.partition, p.lag))
            .collect())
    }

    /// Per partition of the order topic: where the group's commits stand and
    /// how far behind the high watermark.
    pub async fn progress(&self) -> anyhow::Result<Vec<PartitionProgress>> {
        let (consumer, topic, timeout) = (self.consumer.clone(), self.topic.clone(), self.timeout);
        tokio::task::spawn_blocking(move || partition_progress(&consumer, &topic, timeout)).await?
    }

    /// Messages held by the dead-letter topic `{topic}.dlq`, the workers'
    /// default (0 when it does not exist yet; it is not created by asking).
    pub async fn dlq_depth(&self) -> anyhow::Result<i64> {
        let (consumer, topic, timeout) = (
            self.consumer.clone(),
            format!("{}.dlq", self.topic),
            self.timeout,
        );
        tokio::task::spawn_blocking(move || {
            let metadata = consumer.fetch_metadata(Some(&topic), timeout)?;
            let mut depth = 0;
            for t in metadata.topics().iter().filter(|t| t.error().is_none()) {
                for p in t.partitions() {
                    let (low, high) = consumer.fetch_watermarks(&topic, p.id(), timeout)?;
                    depth += (high - low).max(0);
                }
            }
            Ok(depth)
        })
        .await?
    }
}

/// One partition of a group's topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartitionProgress {
    pub partition: i32,
    /// The group's committed offset (the low watermark when nothing is committed yet).
    pub done: i64,
    /// High watermark − `done`.
    pub lag: i64,
}

/// Per partition: the group's committed offset and how far the high
/// watermark is ahead of it. Blocking; run it off the runtime.
pub fn partition_progress(
    consumer: &BaseConsumer,
    topic: &str,
    timeout: Duration,
) -> anyhow::Result<Vec<PartitionProgress>> {
    let metadata = consumer.fetch_metadata(Some(topic), timeout)?;
    let partitions: Vec<i32> = metadata
        .topics()
        .iter()
        .flat_map(|t| t.partitions().iter().map(|p| p.id()))
        .collect();
    let mut list = TopicPartitionList::new();
    for p in &partitions {
        list.add_partition(topic, *p);
    }
    let committed = consumer.committed_offsets(list, timeout)?;
    let mut lags = Vec::with_capacity(partitions.len());
    for p in partitions {
        let (low, high) = consumer.fetch_watermarks(topic, p, timeout)?;
        let done = match committed.find_partition(topic, p).map(|e| e.offset()) {
            Some(Offset::Offset(o)) => o,
            _ => low,
        };
        lags.push(PartitionProgress {
            partition: p,
            done,
            lag: (high - done).max(0),
        });
    }
    Ok(lags)
}
