//! Kafka client settings shared by the relay and the workers. Nothing here is
//! broker-specific: the same settings run on Apache Kafka and on tansu.
//!
//! Any librdkafka setting can be added from the environment, to every client
//! of the process, after ours (so it may override them): `RDKAFKA_` and the
//! property's name in capitals with `_` for `.`. For example
//! `RDKAFKA_SECURITY_PROTOCOL=SASL_SSL`, `RDKAFKA_SASL_MECHANISMS=SCRAM-SHA-512`,
//! `RDKAFKA_SASL_USERNAME=…`, `RDKAFKA_SASL_PASSWORD=…`,
//! `RDKAFKA_SSL_CA_LOCATION=/etc/kafka/ca.pem`.

use std::time::Duration;

use anyhow::Context;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::producer::FutureProducer;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::ClientConfig;

/// The `RDKAFKA_*` variables of `vars` as librdkafka properties.
pub fn env_options(vars: impl IntoIterator<Item = (String, String)>) -> Vec<(String, String)> {
    vars.into_iter()
        .filter_map(|(name, value)| {
            let property = name.strip_prefix("RDKAFKA_")?;
            (!property.is_empty()).then(|| (property.to_ascii_lowercase().replace('_', "."), value))
        })
        .collect()
}

/// Adds the process's `RDKAFKA_*` settings to a client's configuration.
pub trait EnvOptions {
    fn with_env_options(&mut self) -> &mut Self;
}

impl EnvOptions for ClientConfig {
    fn with_env_options(&mut self) -> &mut Self {
        for (property, value) in env_options(std::env::vars()) {
            self.set(property, value);
        }
        self
    }
}

/// An idempotent producer with `acks=all`: a retried send never duplicates or
/// reorders within a partition.
pub fn producer(brokers: &str) -> anyhow::Result<FutureProducer> {
    ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("linger.ms", "5")
        .set("message.timeout.ms", "30000")
        .with_env_options()
        .create()
        .context("creating the Kafka producer")
}

/// Creates the topics that do not exist yet; existing ones are left alone.
pub async fn ensure_topics(brokers: &str, topics: &[&str], partitions: i32) -> anyhow::Result<()> {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .with_env_options()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rdkafka_variables_become_librdkafka_properties() {
        let vars = [
            ("RDKAFKA_SECURITY_PROTOCOL", "SASL_SSL"),
            ("RDKAFKA_SASL_PASSWORD", "p,a=ss"),
            ("KAFKA_BROKERS", "ignored"),
            ("RDKAFKA_", "ignored"),
        ]
        .map(|(k, v)| (k.to_owned(), v.to_owned()));
        assert_eq!(
            env_options(vars),
            [
                ("security.protocol".to_owned(), "SASL_SSL".to_owned()),
                ("sasl.password".to_owned(), "p,a=ss".to_owned()),
            ]
        );
    }

    #[test]
    fn the_options_reach_librdkafka() {
        // librdkafka itself checks them: a wrong one is refused by name.
        let mut config = ClientConfig::new();
        config.set("bootstrap.servers", "127.0.0.1:1");
        for (property, value) in env_options([("RDKAFKA_NO_SUCH_THING".into(), "1".into())]) {
            config.set(property, value);
        }
        let error = config.create::<FutureProducer>().err().unwrap().to_string();
        assert!(error.contains("no.such.thing"), "{error}");
        let mut config = ClientConfig::new();
        for (property, value) in env_options([
            ("RDKAFKA_SECURITY_PROTOCOL".into(), "SASL_SSL".into()),
            ("RDKAFKA_SASL_MECHANISMS".into(), "SCRAM-SHA-512".into()),
            ("RDKAFKA_SASL_USERNAME".into(), "boxoffice".into()),
            ("RDKAFKA_SASL_PASSWORD".into(), "pw".into()),
        ]) {
            config.set(property, value);
        }
        // SASL over TLS is built in (OpenSSL), so such a client can be made.
        if let Err(error) = config.create::<FutureProducer>() {
            panic!("{error}");
        }
    }
}
