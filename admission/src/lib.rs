//! The BoxOffice admission service: lets fans out of the waiting room at the
//! rate the back end can take, and the admin API ops drive it with.
//!
//! - [`admitter`]: the tick loop; one atomic Lua script per event and tick,
//!   under a Redis lease so exactly one replica admits each event.
//! - [`adaptive`]: AIMD on the rate from order latency, outbox backlog and consumer lag.
//! - [`api`]: the admin API (`/admin/v1/...`), behind the admin bearer token.
//! - [`cli`]: `admission event …` and `admission capacity …`, clients of the admin API.
//! - [`dashboard`]: the ops dashboard at `/admin/` and the samples it charts.
//! - [`config`]: the command line.
#![forbid(unsafe_code)]

pub mod adaptive;
pub mod admitter;
pub mod api;
pub mod cli;
pub mod config;
pub mod dashboard;
pub mod lockout;
pub mod restore;

use std::sync::Arc;

use redis::aio::ConnectionManager;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub use config::Config;

/// Shared by every admin request.
#[derive(Clone)]
pub struct AppState {
    pub redis: ConnectionManager,
    pub config: Arc<Config>,
    /// Client for the order service's internal API (inventory lives there).
    pub http: reqwest::Client,
    /// This replica's name in the admission leases.
    pub replica: String,
    /// The dashboard's last minutes of every event.
    pub history: Arc<dashboard::History>,
    /// Clients that sent wrong admin tokens.
    pub lockout: Arc<lockout::Lockout>,
}

impl AppState {
    pub fn new(redis: ConnectionManager, config: Config) -> anyhow::Result<Self> {
        // Every call goes to the order service's internal API, with the service token.
        let http = reqwest::Client::builder()
            .timeout(std::time::Duration::from_secs(5))
            .default_headers(config.service.header()?)
            .build()?;
        let replica = config.replica_id();
        Ok(Self {
            redis,
            history: Arc::new(dashboard::History::new(config.history_samples)),
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

/// Serves the admin API and runs the admission loop until `shutdown` resolves.
pub async fn serve(
    listener: TcpListener,
    state: AppState,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let cancel = CancellationToken::new();
    let admitter = admitter::Admitter::new(
        state.redis.clone(),
        &state.config.redis_prefix,
        &state.replica,
        std::time::Duration::from_millis(state.config.lease_ms),
        std::time::Duration::from_millis(state.config.tick_ms),
    );
    let loop_task = tokio::spawn(admitter.run(cancel.clone()));
    let controller = adaptive::Controller {
        redis: state.redis.clone(),
        prefix: state.config.redis_prefix.clone(),
        replica: state.replica.clone(),
        http: state.http.clone(),
        order_service_url: state.config.order_service_url.clone(),
    };
    let adapt_task =
        tokio::spawn(controller.run(std::time::Duration::from_secs(1), cancel.clone()));
    let sample_task = tokio::spawn(dashboard::run_sampler(
        state.clone(),
        std::time::Duration::from_millis(state.config.sample_ms.max(50)),
        cancel.clone(),
    ));
    let restore_task = tokio::spawn(restore::run(
        state.clone(),
        std::time::Duration::from_millis(state.config.restore_ms.max(100)),
        cancel.clone(),
    ));
    let server_cancel = cancel.clone();
    axum::serve(
        listener,
        api::router(state).into_make_service_with_connect_info::<std::net::SocketAddr>(),
    )
    .with_graceful_shutdown(async move {
        shutdown.await;
        server_cancel.cancel();
    })
    .await?;
    cancel.cancel();
    loop_task.await?;
    adapt_task.await?;
    sample_task.await?;
    restore_task.await?;
    Ok(())
}
