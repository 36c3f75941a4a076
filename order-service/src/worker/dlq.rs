//! Dead letters: a message that cannot be handled (fatal) or kept failing
//! (retries exhausted) is copied to the dead-letter topic with why and where
//! it came from, so its partition moves on; `redrive` sends such messages back
//! once the cause is fixed (safe, because the consumer is idempotent).

use std::time::Duration;

use crate::kafka::{EnvOptions, Publisher};
use anyhow::Context;
use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::message::{Header, Headers, Message, OwnedHeaders, OwnedMessage};
use rdkafka::producer::FutureRecord;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

use crate::RedriveConfig;

pub const REASON: &str = "x-dlq-reason";
pub const ERROR_CLASS: &str = "x-dlq-error-class";
pub const ORIGINAL_TOPIC: &str = "x-dlq-original-topic";
pub const ORIGINAL_PARTITION: &str = "x-dlq-original-partition";
pub const ORIGINAL_OFFSET: &str = "x-dlq-original-offset";

/// Why a message was dead-lettered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// Retrying cannot help: undecodable, unknown type, schema violation.
    Fatal,
    /// A transient failure outlasted every retry.
    Exhausted,
}

impl ErrorClass {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Fatal => "fatal",
            Self::Exhausted => "exhausted",
        }
    }
}

/// Copies `message` to `dlq_topic` with its key, payload and the DLQ headers;
/// returns once the broker has it (acks=all).
pub async fn publish(
    producer: &Publisher,
    dlq_topic: &str,
    message: &OwnedMessage,
    reason: &str,
    class: ErrorClass,
) -> anyhow::Result<()> {
    let (partition, offset) = (
        message.partition().to_string(),
        message.offset().to_string(),
    );
    let headers = OwnedHeaders::new()
        .insert(Header {
            key: REASON,
            value: Some(reason),
        })
        .insert(Header {
            key: ERROR_CLASS,
            value: Some(class.as_str()),
        })
        .insert(Header {
            key: ORIGINAL_TOPIC,
            value: Some(message.topic()),
        })
        .insert(Header {
            key: ORIGINAL_PARTITION,
            value: Some(&partition),
        })
        .insert(Header {
            key: ORIGINAL_OFFSET,
            value: Some(&offset),
        });
    producer
        .send(
            copy_to(dlq_topic, message, headers),
            Duration::from_secs(30),
        )
        .await
        .map_err(|(error, _)| error)
        .context("publishing a dead letter")?;
    metrics::counter!("boxoffice_dlq_messages_total", "class" => class.as_str()).increment(1);
    Ok(())
}

/// `message`'s key and payload, bound for `topic` with `headers`.
fn copy_to<'a>(
    topic: &'a str,
    message: &'a impl Message,
    headers: OwnedHeaders,
) -> FutureRecord<'a, [u8], [u8]> {
    let mut record = FutureRecord::to(topic).headers(headers);
    if let Some(key) = message.key() {
        record = record.key(key);
    }
    if let Some(payload) = message.payload() {
        record = record.payload(payload);
    }
    record
}

/// The value of header `name` of `message`, as text.
pub fn header<'m>(message: &'m impl Message, name: &str) -> Option<&'m str> {
    let headers = message.headers()?;
    headers
        .iter()
        .find(|h| h.key == name)
        .and_then(|h| h.value)
        .and_then(|v| std::str::from_utf8(v).ok())
}

/// Sends every dead letter there is now (or `max` of them) back to its
/// original topic, then commits the group's place in the DLQ. Returns how
/// many were sent.
pub async fn redrive(config: &RedriveConfig) -> anyhow::Result<usize> {
    let consumer: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", &config.kafka_brokers)
        .set("group.id", &config.group)
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .with_env_options()
        .create()
        .context("creating the redrive consumer")?;
    let producer = crate::kafka::producer(&config.kafka_brokers)?;
    // What "now" is: the high watermark of each DLQ partition.
    let metadata = consumer
        .fetch_metadata(Some(&config.from), Duration::from_secs(10))
        .context("reading the DLQ topic's metadata")?;
    let mut all = TopicPartitionList::new();
    for partition in metadata.topics().iter().flat_map(|t| t.partitions()) {
        all.add_partition(&config.from, partition.id());
    }
    let committed = consumer
        .committed_offsets(all.clone(), Duration::from_secs(10))
        .context("reading the redrive group's offsets")?;
    let mut remaining = std::collections::HashMap::new();
    for element in all.elements() {
        let (_, high) = consumer.fetch_watermarks(
            &config.from,
            element.partition(),
            Duration::from_secs(10),
        )?;
        let done = committed
            .find_partition(&config.from, element.partition())
            .and_then(|p| match p.offset() {
                Offset::Offset(o) => Some(o),
                _ => None,
            })
            .unwrap_or(0);
        if high > done {
            remaining.insert(element.partition(), high);
        }
    }
    consumer.subscribe(&[&config.from])?;
    let max = config.max.unwrap_or(usize::MAX);
    let mut sent = 0;
    let mut next = std::collections::HashMap::new();
    while !remaining.is_empty() && sent < max {
        let message = match tokio::time::timeout(Duration::from_secs(10), consumer.recv()).await {
            Ok(message) => message?,
            Err(_) => break,
        };
        let Some(high) = remaining.get(&message.partition()).copied() else {
            continue;
        };
        let target = config
            .to
            .as_deref()
            .or_else(|| header(&message, ORIGINAL_TOPIC))
            .context("a dead letter without x-dlq-original-topic; pass --to")?
            .to_owned();
        let origin = format!(
            "{}/{}/{}",
            message.topic(),
            message.partition(),
            message.offset()
        );
        let headers = OwnedHeaders::new().insert(Header {
            key: "x-redriven-from",
            value: Some(&origin),
        });
        producer
            .send(copy_to(&target, &message, headers), Duration::from_secs(30))
            .await
            .map_err(|(error, _)| error)?;
        sent += 1;
        next.insert(message.partition(), message.offset() + 1);
        if message.offset() + 1 >= high {
            remaining.remove(&message.partition());
        }
    }
    if !next.is_empty() {
        let mut list = TopicPartitionList::new();
        for (partition, offset) in next {
            list.add_partition_offset(&config.from, partition, Offset::Offset(offset))?;
        }
        consumer.commit(&list, CommitMode::Sync)?;
    }
    tracing::info!(sent, from = %config.from, "dead letters redriven");
    Ok(sent)
}
