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
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::ClientConfig;

mod publisher;

pub use publisher::Publisher;

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
pub fn producer(brokers: &str) -> anyhow::Result<Publisher> {
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

/// How the topics a service creates are replicated: with the producer's
/// `acks=all`, a message is acknowledged (and its order confirmed to the
/// fan) only once `min_insync_replicas` brokers hold it, so with a factor of
/// 3 and 2 in sync a confirmed order's message survives the loss of any one
/// broker, and writes stop (rather than risk it) when two are gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::Args)]
pub struct Replication {
    /// Replication factor of the topics this process creates when they do
    /// not exist yet (an existing topic is left as it is). 3 for production;
    /// the single local broker of the dev stack and the tests needs 1.
    #[arg(
        long = "kafka-replication-factor",
        env = "BOXOFFICE_KAFKA_REPLICATION_FACTOR",
        default_value_t = 3,
        value_parser = clap::value_parser!(i32).range(1..)
    )]
    pub factor: i32,
    /// `min.insync.replicas` of the topics this process creates: replicas
    /// that must hold a message before an `acks=all` send succeeds. 2 for
    /// production (at most the replication factor); 1 for a single broker.
    #[arg(
        long = "kafka-min-insync-replicas",
        env = "BOXOFFICE_KAFKA_MIN_INSYNC_REPLICAS",
        default_value_t = 2,
        value_parser = clap::value_parser!(i32).range(1..)
    )]
    pub min_insync_replicas: i32,
}

impl Replication {
    /// One broker (the dev stack's tansu, tests, benches).
    pub const SINGLE_BROKER: Self = Self {
        factor: 1,
        min_insync_replicas: 1,
    };

    /// More replicas in sync than there are replicas would refuse every send.
    pub fn check(&self) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.factor >= 1 && self.min_insync_replicas >= 1,
            "BOXOFFICE_KAFKA_REPLICATION_FACTOR ({}) and BOXOFFICE_KAFKA_MIN_INSYNC_REPLICAS ({}) must be at least 1",
            self.factor,
            self.min_insync_replicas
        );
        anyhow::ensure!(
            self.min_insync_replicas <= self.factor,
            "BOXOFFICE_KAFKA_MIN_INSYNC_REPLICAS ({}) is above BOXOFFICE_KAFKA_REPLICATION_FACTOR ({}): \
             no acks=all send could ever succeed",
            self.min_insync_replicas,
            self.factor
        );
        Ok(())
    }
}

/// The topics to create: `partitions` each, replicated `factor` times, with
/// `min.insync.replicas` set to `min_insync_replicas` (a number, as text).
pub fn new_topics<'a>(
    topics: &[&'a str],
    partitions: i32,
    factor: i32,
    min_insync_replicas: &'a str,
) -> Vec<NewTopic<'a>> {
    topics
        .iter()
        .map(|topic| {
            NewTopic::new(topic, partitions, TopicReplication::Fixed(factor))
                .set("min.insync.replicas", min_insync_replicas)
        })
        .collect()
}

/// Creates the topics that do not exist yet, replicated as `replication`
/// says; existing ones are left alone.
pub async fn ensure_topics_replicated(
    brokers: &str,
    topics: &[&str],
    partitions: i32,
    replication: Replication,
) -> anyhow::Result<()> {
    replication.check()?;
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .with_env_options()
        .create()
        .context("creating the Kafka admin client")?;
    let min_insync = replication.min_insync_replicas.to_string();
    let new = new_topics(topics, partitions, replication.factor, &min_insync);
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    let results = admin
        .create_topics(new.iter(), &options)
        .await
        .context("creating topics")?;
    for result in results {
        match result {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((topic, code)) => anyhow::bail!(
                "creating topic {topic} (replication factor {}, min.insync.replicas {}): {code}",
                replication.factor,
                replication.min_insync_replicas
            ),
        }
    }
    Ok(())
}

/// [`ensure_topics_replicated`] for one broker (replication factor 1,
/// `min.insync.replicas` 1): tests and benches on the dev broker. The
/// services use the configured [`Replication`].
pub async fn ensure_topics(brokers: &str, topics: &[&str], partitions: i32) -> anyhow::Result<()> {
    ensure_topics_replicated(brokers, topics, partitions, Replication::SINGLE_BROKER).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_topics_get_the_configured_replication_and_min_insync_replicas() {
        let topics = new_topics(&["order-events", "order-events.dlq"], 6, 3, "2");
        assert_eq!(topics.len(), 2);
        for (topic, name) in topics.iter().zip(["order-events", "order-events.dlq"]) {
            assert_eq!(topic.name, name);
            assert_eq!(topic.num_partitions, 6);
            assert!(matches!(topic.replication, TopicReplication::Fixed(3)));
            assert_eq!(topic.config, [("min.insync.replicas", "2")]);
        }
        let single = new_topics(&["t"], 1, 1, "1");
        assert!(matches!(single[0].replication, TopicReplication::Fixed(1)));
        assert_eq!(single[0].config, [("min.insync.replicas", "1")]);
    }

    #[test]
    fn min_insync_replicas_may_not_exceed_the_replication_factor() {
        let production = Replication {
            factor: 3,
            min_insync_replicas: 2,
        };
        production.check().unwrap();
        Replication::SINGLE_BROKER.check().unwrap();
        let impossible = Replication {
            factor: 1,
            min_insync_replicas: 2,
        };
        let error = impossible.check().unwrap_err().to_string();
        assert!(
            error.contains("BOXOFFICE_KAFKA_MIN_INSYNC_REPLICAS (2)"),
            "{error}"
        );
        let zero = Replication {
            factor: 0,
            min_insync_replicas: 0,
        };
        assert!(zero.check().is_err());
    }

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
        let error = config.create::<Publisher>().err().unwrap().to_string();
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
        if let Err(error) = config.create::<Publisher>() {
            panic!("{error}");
        }
    }
}
