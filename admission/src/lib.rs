//! The BoxOffice admission service: lets fans out of the waiting room at the
//! rate the back end can take, and serves the admin API ops drive it with.
//! [`serve`] runs it all: the admission loop, the rate controller, the
//! dashboard's sampler, the settings restore and the admin API.
//!
//! Modules, each depending only on those listed after it:
//!
//! - [`sampler`]: samples every event's figures once a second for the dashboard.
//! - [`api`]: the admin API (`/admin/v1/...`, behind the admin bearer token), one module per resource, and its OpenAPI document.
//! - [`restore`]: keeps event settings in PostgreSQL and puts them back when Redis lost them.
//! - [`state`]: [`AppState`], what every admin request and background task shares.
//! - [`history`]: the dashboard's last minutes of every event, in memory.
//! - [`lockout`]: locks out clients that send wrong admin tokens.
//! - [`admitter`]: the tick loop; one atomic Lua script per event and tick, under a Redis lease so exactly one replica admits each event.
//! - [`adaptive`]: AIMD on the rate from order latency, outbox backlog and consumer lag.
//! - [`config`]: the command line of `admission serve`.
//! - [`cli`]: `admission event …` and `admission capacity …`, clients of the admin API.
#![forbid(unsafe_code)]

/// The name the admission service's exported spans carry (`service.name`).
pub const SERVICE: &str = "boxoffice-admission";

pub mod adaptive;
pub mod admitter;
pub mod api;
pub mod cli;
pub mod config;
pub mod history;
pub mod lockout;
pub mod restore;
pub mod sampler;
pub mod state;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub use config::Config;
pub use state::AppState;

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
    let sample_task = tokio::spawn(sampler::run_sampler(
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
