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
}

#[derive(Debug, Clone, Args)]
pub struct ServeConfig {
    /// Address of the internal HTTP API.
    #[arg(long, env = "ORDER_SERVICE_LISTEN", default_value = "127.0.0.1:8082")]
    pub listen: String,
    #[arg(
        long,
        env = "DATABASE_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/boxoffice"
    )]
    pub database_url: String,
    /// Postgres connections; each saga runner and the relay hold one while working.
    #[arg(long, env = "ORDER_SERVICE_DB_CONNECTIONS", default_value_t = 16)]
    pub db_connections: u32,
    #[arg(long, env = "REDIS_URL", default_value = "redis://127.0.0.1:6379")]
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
    /// How long seats stay held for an order that is not yet paid.
    #[arg(long, env = "BOXOFFICE_RESERVATION_TTL_S", default_value_t = 600)]
    pub reservation_ttl_s: i64,
    /// Concurrent saga runners in this process.
    #[arg(long, env = "BOXOFFICE_SAGA_RUNNERS", default_value_t = 4)]
    pub saga_runners: usize,
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
        Wrapper::parse_from(["serve"]).config
    }
}

#[derive(Debug, Clone, Args)]
pub struct WorkerConfig {
    /// Address of the health endpoint.
    #[arg(long, env = "WORKER_LISTEN", default_value = "127.0.0.1:8083")]
    pub listen: String,
    #[arg(
        long,
        env = "DATABASE_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/boxoffice"
    )]
    pub database_url: String,
    #[arg(long, env = "KAFKA_BROKERS", default_value = "127.0.0.1:9092")]
    pub kafka_brokers: String,
    #[arg(long, env = "BOXOFFICE_ORDER_TOPIC", default_value = "order-events")]
    pub topic: String,
    /// Consumer group; also the `consumer` column of `processed_events`.
    #[arg(long, env = "BOXOFFICE_WORKER_GROUP", default_value = "ticket-issuer")]
    pub group: String,
    /// Stored offsets are committed this often, and once more at shutdown.
    #[arg(long, env = "BOXOFFICE_COMMIT_INTERVAL_MS", default_value_t = 500)]
    pub commit_interval_ms: u64,
}
