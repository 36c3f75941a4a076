//! How the purchase pipeline is doing, for adaptive admission and for ops:
//! order latency, the outbox backlog and the ticket workers' consumer lag.

use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;

#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Health {
    /// 95th percentile of placed → confirmed over the last minute; `None` without orders.
    pub order_latency_p95_ms: Option<f64>,
    /// Outbox rows not yet published.
    pub outbox_backlog: i64,
    /// Age of the oldest unpublished outbox row.
    pub outbox_oldest_age_s: f64,
    /// Messages on the order topic the ticket workers have not committed; `None` if the broker did not say.
    pub consumer_lag: Option<i64>,
}

pub async fn database(pool: &PgPool) -> sqlx::Result<Health> {
    let (backlog, oldest): (i64, Option<f64>) = sqlx::query_as(
        "SELECT count(*), extract(epoch FROM now() - min(created_at))::float8
         FROM outbox WHERE published_at IS NULL",
    )
    .fetch_one(pool)
    .await?;
    let p95: Option<f64> = sqlx::query_scalar(
        "SELECT (percentile_cont(0.95) WITHIN GROUP (ORDER BY extract(epoch FROM updated_at - created_at)) * 1000)::float8
         FROM orders WHERE status = 'confirmed' AND updated_at > now() - interval '60 seconds'",
    )
    .fetch_one(pool)
    .await?;
    Ok(Health {
        order_latency_p95_ms: p95,
        outbox_backlog: backlog,
        outbox_oldest_age_s: oldest.unwrap_or(0.0),
        consumer_lag: None,
    })
}

/// Per partition: high watermark − the group's committed offset (the whole
/// partition when nothing is committed yet). Blocking; run it off the runtime.
pub fn partition_lag(
    brokers: &str,
    group: &str,
    topic: &str,
    timeout: Duration,
) -> anyhow::Result<Vec<(i32, i64)>> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create()?;
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
        lags.push((p, (high - done).max(0)));
    }
    Ok(lags)
}
