//! The command line of `admission serve`; every flag has an env var.

use clap::{Args, Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "admission",
    version,
    about = "BoxOffice admission loop and admin API"
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
    /// Run the admission loop and the admin API.
    Serve(Config),
    /// Create, tune or show an event through the admin API.
    Event {
        #[command(flatten)]
        admin: crate::cli::Admin,
        #[command(subcommand)]
        command: crate::cli::EventCommand,
    },
    /// Size workers and partitions with Little's law (asks the admin API).
    Capacity {
        #[command(flatten)]
        admin: crate::cli::Admin,
        #[command(flatten)]
        args: crate::cli::CapacityArgs,
    },
}

#[derive(Debug, Clone, Args)]
pub struct Config {
    /// Address of the admin API.
    #[arg(long, env = "ADMISSION_LISTEN", default_value = "127.0.0.1:8081")]
    pub listen: String,
    /// Redis: one URL, or a Redis Cluster's node URLs comma-separated.
    #[arg(
        long,
        env = "REDIS_URL",
        hide_env_values = true,
        default_value = "redis://127.0.0.1:6379"
    )]
    pub redis_url: String,
    /// First part of every Redis key (`PREFIX:{EVENT}:…`).
    #[arg(long, env = "BOXOFFICE_REDIS_PREFIX", default_value = "bo")]
    pub redis_prefix: String,
    /// Bearer token of the admin API (≥ 32 bytes). Required: there is no default.
    #[arg(long, env = "BOXOFFICE_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: String,
    /// Wrong or missing admin tokens one client may send per lockout window;
    /// past that, its admin requests get 429 until the window ends.
    #[arg(long, env = "BOXOFFICE_ADMIN_MAX_FAILURES", default_value_t = 10)]
    pub admin_max_failures: u32,
    /// The lockout window of failed admin tokens.
    #[arg(long, env = "BOXOFFICE_ADMIN_LOCKOUT_S", default_value_t = 300)]
    pub admin_lockout_s: u64,
    #[command(flatten)]
    pub service: boxoffice_contract::auth::ServiceTokenArgs,
    /// Base URL of the order service's internal API.
    #[arg(
        long,
        env = "ORDER_SERVICE_URL",
        default_value = "http://127.0.0.1:8082"
    )]
    pub order_service_url: String,
    /// Admission tick; the contract allows at most 100 ms.
    #[arg(long, env = "BOXOFFICE_TICK_MS", default_value_t = 100)]
    pub tick_ms: u64,
    /// How long a leader's lease lasts without renewal; a standby takes over after it.
    #[arg(long, env = "BOXOFFICE_LEASE_MS", default_value_t = 1_000)]
    pub lease_ms: u64,
    /// How often the dashboard samples every event (and the order pipeline).
    #[arg(long, env = "BOXOFFICE_SAMPLE_MS", default_value_t = 1_000)]
    pub sample_ms: u64,
    /// How often to put back the settings of events Redis lost, from PostgreSQL.
    #[arg(long, env = "BOXOFFICE_RESTORE_MS", default_value_t = 2_000)]
    pub restore_ms: u64,
    /// How many samples per event the dashboard keeps (600 × 1 s = 10 minutes).
    #[arg(long, env = "BOXOFFICE_HISTORY_SAMPLES", default_value_t = 600)]
    pub history_samples: usize,
    /// This replica's name in the lease; defaults to host name and process id.
    #[arg(long, env = "BOXOFFICE_REPLICA_ID")]
    pub replica: Option<String>,
}

impl Config {
    /// Refuses secrets the service must not start with.
    pub fn check_secrets(&self) -> Result<(), boxoffice_contract::auth::SecretError> {
        self.service.check()?;
        self.service
            .check_secret("BOXOFFICE_ADMIN_TOKEN", &self.admin_token)
    }

    pub fn replica_id(&self) -> String {
        self.replica.clone().unwrap_or_else(|| {
            let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "admission".into());
            format!(
                "{host}-{}-{}",
                std::process::id(),
                uuid::Uuid::new_v4().simple()
            )
        })
    }
}

impl Config {
    /// Every flag at its default (environment variables still apply), for
    /// embedding the service as a library.
    pub fn defaults(admin_token: &str) -> Self {
        #[derive(Parser)]
        struct Only {
            #[command(flatten)]
            config: Config,
        }
        Only::parse_from([
            "admission",
            "--admin-token",
            admin_token,
            "--service-token=",
        ])
        .config
    }
}
