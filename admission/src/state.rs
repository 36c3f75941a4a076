//! What every admin request and background task shares: [`AppState`].

use std::sync::Arc;

use boxoffice_contract::redis_link::RedisLink;

use crate::config::Config;
use crate::{history, lockout};

/// Shared by every admin request.
#[derive(Clone)]
pub struct AppState {
    pub redis: RedisLink,
    pub config: Arc<Config>,
    /// Client for the order service's internal API (inventory lives there).
    pub http: reqwest::Client,
    /// This replica's name in the admission leases.
    pub replica: String,
    /// The dashboard's last minutes of every event.
    pub history: Arc<history::History>,
    /// Clients that sent wrong admin tokens.
    pub lockout: Arc<lockout::Lockout>,
}

impl AppState {
    pub fn new(redis: impl Into<RedisLink>, config: Config) -> anyhow::Result<Self> {
        let redis = redis.into();
        // Every call goes to the order service's internal API, with the service token.
        let http = reqwest::Client::builder()
            .timeout(std::time::Duration::from_secs(5))
            .default_headers(config.service.header()?)
            .build()?;
        let replica = config.replica_id();
        Ok(Self {
            redis,
            history: Arc::new(history::History::new(config.history_samples)),
            lockout: Arc::new(lockout::Lockout::new(
                config.admin_max_failures,
                std::time::Duration::from_secs(config.admin_lockout_s),
            )),
            config: Arc::new(config),
            http,
            replica,
        })
    }
}
