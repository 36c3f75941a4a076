//! The command line: `order-service serve`, `worker` and `payment-provider`.
//! Every flag has an env var; defaults are the local stack's.

use clap::{Args, Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "order-service",
    version,
    about = "BoxOffice order saga, outbox relay and ticket workers"
)]
pub struct Cli {
    /// Write logs as JSON lines, with the fields of every enclosing span.
    #[arg(long, global = true, env = "BOXOFFICE_LOG_JSON")]
    pub log_json: bool,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// The internal order API, the saga runners and the outbox relay.
    Serve(ServeConfig),
    /// The `ticket-issuer` consumer group member that issues tickets.
    Worker(WorkerConfig),
    /// The fake payment provider, with fault knobs (for tests and demos).
    PaymentProvider(crate::payments::provider::ProviderConfig),
    /// Sends dead-lettered messages back to their topic (safe: consumers are idempotent).
    Redrive(RedriveConfig),
}

#[derive(Debug, Clone, Args)]
pub struct ServeConfig {
    /// Address of the internal HTTP API.
    #[arg(long, env = "ORDER_SERVICE_LISTEN", default_value = "127.0.0.1:8082")]
    pub listen: String,
    #[arg(
        long,
        env = "DATABASE_URL",
        hide_env_values = true,
        default_value = "postgres://postgres@127.0.0.1:5432/boxoffice"
    )]
    pub database_url: String,
    /// Postgres connections; each saga runner and the relay hold one while working.
    #[arg(long, env = "ORDER_SERVICE_DB_CONNECTIONS", default_value_t = 16)]
    pub db_connections: u32,
    /// Redis: one URL, or a Redis Cluster's node URLs comma-separated.
    #[arg(
        long,
        env = "REDIS_URL",
        hide_env_values = true,
        default_value = "redis://127.0.0.1:6379"
    )]
    pub redis_url: String,
    /// First part of every Redis key (`PREFIX:{EVENT}:…`); tests use their own.
    #[arg(long, env = "BOXOFFICE_REDIS_PREFIX", default_value = "bo")]
    pub redis_prefix: String,
    #[arg(long, env = "KAFKA_BROKERS", default_value = "127.0.0.1:9092")]
    pub kafka_brokers: String,
    /// Topic the outbox is published to.
    #[arg(long, env = "BOXOFFICE_ORDER_TOPIC", default_value = "order-events")]
    pub topic: String,
    /// Consumer group of the ticket workers, whose lag `/internal/health` reports.
    #[arg(long, env = "BOXOFFICE_WORKER_GROUP", default_value = "ticket-issuer")]
    pub worker_group: String,
    /// Partitions of the topic when the relay has to create it.
    #[arg(long, env = "BOXOFFICE_PARTITIONS", default_value_t = 6)]
    pub partitions: i32,
    /// Replication of the topic when the relay has to create it.
    #[command(flatten)]
    pub replication: crate::kafka::Replication,
    /// How long seats stay held for an order that is not yet paid.
    #[arg(long, env = "BOXOFFICE_RESERVATION_TTL_S", default_value_t = 600)]
    pub reservation_ttl_s: i64,
    /// Concurrent saga runners in this process.
    #[arg(long, env = "BOXOFFICE_SAGA_RUNNERS", default_value_t = 4)]
    pub saga_runners: usize,
    /// Every this often, the edge's stock view of every event is republished
    /// from PostgreSQL (versioned, so a newer view is never rolled back): a
    /// publish lost to a Redis hiccup or restart heals within one period,
    /// and a seat released at "sold out" is offered again.
    #[arg(long, env = "BOXOFFICE_STOCK_RECONCILE_MS", default_value_t = 1_000)]
    pub stock_reconcile_ms: u64,
    /// Run the outbox relay in this process (several relays may run at once).
    #[arg(long, env = "BOXOFFICE_RELAY", default_value_t = true, action = clap::ArgAction::Set)]
    pub relay: bool,
    /// Outbox rows claimed per relay batch.
    #[arg(long, env = "BOXOFFICE_RELAY_BATCH", default_value_t = 200)]
    pub relay_batch: i64,
    /// Published outbox rows are deleted after this many seconds.
    #[arg(long, env = "BOXOFFICE_OUTBOX_RETENTION_S", default_value_t = 86_400)]
    pub outbox_retention_s: i64,
    #[command(flatten)]
    pub payment: crate::payments::client::PaymentConfig,
    #[command(flatten)]
    pub service: boxoffice_contract::auth::ServiceTokenArgs,
    /// Where the ticket PDFs the workers write are read from, as a URL: a
    /// directory (a plain path, created if missing, or `file:///abs/dir`),
    /// `s3://bucket/prefix` (endpoint, region and credentials from the
    /// standard `AWS_*` variables: `AWS_ENDPOINT_URL`, `AWS_REGION`,
    /// `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_ALLOW_HTTP`), or
    /// `memory://` (tests only). Must name the workers' store; replicas on
    /// different machines need `s3://`.
    #[arg(long, env = "BOXOFFICE_TICKET_STORE", default_value = ".run/tickets", value_parser = crate::tickets::check_url)]
    pub ticket_store: String,
    /// Fault injection for the crash tests: the relay aborts the process
    /// after its first publish, before marking the rows published.
    #[arg(long, env = "BOXOFFICE_CRASH_AFTER_PUBLISH", hide = true)]
    pub crash_after_publish: bool,
}

impl ServeConfig {
    /// The command line's defaults (tests and embedders change what they need).
    pub fn defaults() -> Self {
        #[derive(Parser)]
        struct Wrapper {
            #[command(flatten)]
            config: ServeConfig,
        }
        Wrapper::parse_from(["serve", "--service-token=", "--payment-api-key="]).config
    }
}

/// How many messages a worker process handles at once.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Workers {
    Fixed(usize),
    /// ceil(λ × S / utilization), S measured as it goes.
    Auto,
}

impl std::str::FromStr for Workers {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(Self::Auto),
            n => match n.parse::<usize>() {
                Ok(n) if n >= 1 => Ok(Self::Fixed(n)),
                _ => Err(format!(
                    "expected a number of workers ≥ 1 or `auto`, got {n:?}"
                )),
            },
        }
    }
}

#[derive(Debug, Clone, Args)]
pub struct WorkerConfig {
    /// Address of the health and metrics endpoint.
    #[arg(long, env = "WORKER_LISTEN", default_value = "127.0.0.1:8083")]
    pub listen: String,
    #[arg(
        long,
        env = "DATABASE_URL",
        hide_env_values = true,
        default_value = "postgres://postgres@127.0.0.1:5432/boxoffice"
    )]
    pub database_url: String,
    #[arg(long, env = "KAFKA_BROKERS", default_value = "127.0.0.1:9092")]
    pub kafka_brokers: String,
    #[arg(long, env = "BOXOFFICE_ORDER_TOPIC", default_value = "order-events")]
    pub topic: String,
    /// Dead letters go here (default: the topic with `.dlq` appended).
    #[arg(long, env = "BOXOFFICE_DLQ_TOPIC")]
    pub dlq_topic: Option<String>,
    /// Replication of the dead-letter topic when the worker has to create it.
    #[command(flatten)]
    pub replication: crate::kafka::Replication,
    /// Consumer group; also the `consumer` column of `processed_events`.
    #[arg(long, env = "BOXOFFICE_WORKER_GROUP", default_value = "ticket-issuer")]
    pub group: String,
    /// Offsets that are done are committed this often, and at shutdown and rebalance.
    #[arg(long, env = "BOXOFFICE_COMMIT_INTERVAL_MS", default_value_t = 500)]
    pub commit_interval_ms: u64,
    /// Messages handled at once: a number, or `auto` = ceil(λ × S / utilization).
    #[arg(long, env = "BOXOFFICE_WORKERS", default_value = "8")]
    pub workers: Workers,
    /// λ for `--workers auto`: expected messages per second.
    #[arg(long, env = "BOXOFFICE_ARRIVAL_RATE", default_value_t = 50.0)]
    pub arrival_rate: f64,
    /// Target utilization for `--workers auto`.
    #[arg(long, env = "BOXOFFICE_UTILIZATION", default_value_t = 0.7)]
    pub utilization: f64,
    /// S before anything is measured, for `--workers auto`.
    #[arg(long, env = "BOXOFFICE_SERVICE_TIME_MS", default_value_t = 20.0)]
    pub service_time_ms: f64,
    /// Largest pool `--workers auto` may pick.
    #[arg(long, env = "BOXOFFICE_MAX_WORKERS", default_value_t = 64)]
    pub max_workers: usize,
    /// Simulated extra service time per message (demos of Little's law, tests).
    #[arg(long, env = "BOXOFFICE_EXTRA_SERVICE_MS", default_value_t = 0)]
    pub extra_service_ms: u64,
    /// First retry wait of a transient failure; each next one is 4× (1 s, 4 s, 16 s …).
    #[arg(long, env = "BOXOFFICE_RETRY_BACKOFF_MS", default_value_t = 1_000)]
    pub retry_backoff_ms: u64,
    /// Longest wait between retries of a transient failure. A message whose
    /// dependency (the database, the ticket store) is down is retried until
    /// it returns, however long: an outage is not poison, so it is never
    /// dead-lettered for it; its partition waits, its offset is kept.
    #[arg(long, env = "BOXOFFICE_RETRY_MAX_BACKOFF_MS", default_value_t = 30_000)]
    pub retry_max_backoff_ms: u64,
    /// On SIGTERM, how long in-flight messages may take to finish (keep it
    /// below the orchestrator's grace period, 30 s in k8s/).
    #[arg(long, env = "BOXOFFICE_DRAIN_TIMEOUT_MS", default_value_t = 20_000)]
    pub drain_timeout_ms: u64,
    /// Where the ticket PDFs go (`orders/{id}.pdf` under the URL's prefix),
    /// as a URL: a directory (a plain path, created if missing, or
    /// `file:///abs/dir`), `s3://bucket/prefix` (endpoint, region and
    /// credentials from the standard `AWS_*` variables: `AWS_ENDPOINT_URL`,
    /// `AWS_REGION`, `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
    /// `AWS_ALLOW_HTTP`), or `memory://` (tests only). The order service
    /// must be given the same store.
    #[arg(long, env = "BOXOFFICE_TICKET_STORE", default_value = ".run/tickets", value_parser = crate::tickets::check_url)]
    pub ticket_store: String,
    /// Secret (≥ 32 bytes) that signs ticket codes (the QR codes); the gates
    /// verify with it. Required: whoever knows it can mint valid tickets.
    #[arg(long, env = "BOXOFFICE_TICKET_SECRET", hide_env_values = true)]
    pub ticket_secret: String,
    /// Accept a well-known development value for the ticket secret
    /// (`dev-…`, `change-me`). Never in production.
    #[arg(long, env = "BOXOFFICE_ALLOW_DEV_SECRETS")]
    pub allow_dev_secrets: bool,
    /// Static group membership (`group.instance.id`, e.g. the pod name): a
    /// restarted worker takes its old place at once instead of waiting for
    /// the group to notice the old one is gone.
    #[arg(long, env = "BOXOFFICE_WORKER_INSTANCE")]
    pub instance_id: Option<String>,
    /// The consumer's `max.poll.interval.ms`, also the longest a rebalance
    /// waits for members that do not rejoin (a crashed worker's slot).
    #[arg(long, env = "BOXOFFICE_MAX_POLL_INTERVAL_MS", default_value_t = 60_000)]
    pub max_poll_interval_ms: u64,
    /// A partition behind whose commits have not moved for this long, and
    /// which is not this worker's (while it has partitions, none of them
    /// stuck, and its database answers), is taken as held by a member that
    /// is gone: the worker leaves the group and joins again, which forces a
    /// new assignment (tansu 0.6.0 never takes a dead member's partitions
    /// away by itself). 0: never.
    #[arg(long, env = "BOXOFFICE_ORPHAN_TIMEOUT_MS", default_value_t = 30_000)]
    pub orphan_timeout_ms: u64,
    /// Messages fetched ahead and waiting behind a busy key, at most.
    #[arg(long, env = "BOXOFFICE_MAX_BUFFERED", default_value_t = 1_000)]
    pub max_buffered: usize,
}

impl WorkerConfig {
    /// The command line's defaults (tests change what they need).
    pub fn defaults() -> Self {
        #[derive(Parser)]
        struct Wrapper {
            #[command(flatten)]
            config: WorkerConfig,
        }
        Wrapper::parse_from(["worker", "--ticket-secret="]).config
    }

    pub fn dlq_topic(&self) -> String {
        self.dlq_topic
            .clone()
            .unwrap_or_else(|| format!("{}.dlq", self.topic))
    }
}

/// `order-service redrive`: sends dead letters back to the topic they came from.
#[derive(Debug, Clone, Args)]
pub struct RedriveConfig {
    #[arg(long, env = "KAFKA_BROKERS", default_value = "127.0.0.1:9092")]
    pub kafka_brokers: String,
    /// The dead-letter topic to read.
    #[arg(long, default_value = "order-events.dlq")]
    pub from: String,
    /// Where to send them (default: each message's `x-dlq-original-topic`).
    #[arg(long)]
    pub to: Option<String>,
    /// Consumer group that remembers what was redriven.
    #[arg(long, default_value = "dlq-redrive")]
    pub group: String,
    /// Stop after this many messages (default: all there are now).
    #[arg(long)]
    pub max: Option<usize>,
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(["order-service"].iter().chain(args))
    }

    const SERVE: [&str; 3] = ["serve", "--service-token=", "--payment-api-key="];
    const WORKER: [&str; 2] = ["worker", "--ticket-secret="];

    #[test]
    fn topic_replication_defaults_to_three_replicas_two_in_sync() {
        let cli = Cli::command();
        for command in ["serve", "worker"] {
            let sub = cli.find_subcommand(command).unwrap();
            let default = |long: &str| {
                let arg = sub
                    .get_arguments()
                    .find(|arg| arg.get_long() == Some(long))
                    .unwrap_or_else(|| panic!("{command} has no --{long}"));
                arg.get_default_values()[0].to_string_lossy().into_owned()
            };
            assert_eq!(default("kafka-replication-factor"), "3");
            assert_eq!(default("kafka-min-insync-replicas"), "2");
        }
    }

    #[test]
    fn topic_replication_is_configured_and_zero_is_refused() {
        let flags = [
            "--kafka-replication-factor=1",
            "--kafka-min-insync-replicas=1",
        ];
        let serve = parse(&[&SERVE[..], &flags[..]].concat()).unwrap();
        let Command::Serve(serve) = serve.command else {
            panic!("not serve")
        };
        assert_eq!(serve.replication, crate::kafka::Replication::SINGLE_BROKER);
        let worker = parse(&[&WORKER[..], &flags[..]].concat()).unwrap();
        let Command::Worker(worker) = worker.command else {
            panic!("not worker")
        };
        assert_eq!(worker.replication, crate::kafka::Replication::SINGLE_BROKER);

        for command in [&SERVE[..], &WORKER[..]] {
            for flag in [
                "--kafka-replication-factor=0",
                "--kafka-min-insync-replicas=0",
                "--kafka-replication-factor=-1",
            ] {
                let error = parse(&[command, &[flag]].concat()).err().unwrap();
                assert_eq!(error.kind(), clap::error::ErrorKind::ValueValidation);
                let name = flag.split('=').next().unwrap();
                assert!(error.to_string().contains(name), "{error}");
            }
        }
    }
}
