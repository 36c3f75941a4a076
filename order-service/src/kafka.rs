//! Kafka client settings shared by the relay and the workers. Nothing here is
//! broker-specific: the same settings run on Apache Kafka and on tansu.

use std::time::Duration;

use anyhow::Context;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::producer::FutureProducer;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::ClientConfig;

/// An idempotent producer with `acks=all`: a retried send never duplicates or
/// reorders within a partition.
pub fn producer(brokers: &str) -> anyhow::Result<FutureProducer> {
    ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("linger.ms", "5")
        .set("message.timeout.ms", "30000")
        .create()
        .context("creating the Kafka producer")
}

/// Creates the topics that do not exist yet; existing ones are left alone.
pub async fn ensure_topics(brokers: &str, topics: &[&str], partitions: i32) -> anyhow::Result<()> {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .context("creating the Kafka admin client")?;
    let new: Vec<_> = topics
        .iter()
        .map(|t| NewTopic::new(t, partitions, TopicReplication::Fixed(1)))
        .collect();
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    let results = admin
        .create_topics(new.iter(), &options)
        .await
        .context("creating topics")?;
    for result in results {
        match result {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((topic, code)) => anyhow::bail!("creating topic {topic}: {code}"),
        }
    }
    Ok(())
}
