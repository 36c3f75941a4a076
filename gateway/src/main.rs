use anyhow::Context;
use boxoffice_contract::token::KeySet;
use clap::Parser;
use gateway::{AppState, Config};

/// glibc's malloc serialises the hot paths' many small allocations on its
/// arena locks (a fifth of the status poll's CPU); mimalloc does not.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let config = Config::parse();
    boxoffice_contract::telemetry::init(config.log_json);
    boxoffice_contract::otlp::init_from_env(gateway::SERVICE)
        .context("starting the OTLP span exporter (OTEL_EXPORTER_OTLP_*)")?;
    config.service.check()?;
    config
        .service
        .check_secret("BOXOFFICE_QUEUE_SECRET", &config.queue_secret)?;
    let keys = KeySet::from_files(
        &config.issuer,
        &config.signing_key,
        &config.verify_keys,
        config.queue_secret.as_bytes(),
    )
    .context("loading token keys")?;
    let redis = boxoffice_contract::redis_link::connect(&config.redis_url)
        .await
        .context("connecting to Redis (REDIS_URL)")?;
    let listener = tokio::net::TcpListener::bind(&config.listen)
        .await
        .with_context(|| format!("binding {}", config.listen))?;
    tracing::info!(listen = %config.listen, kid = keys.signing_kid(), "gateway listening");
    let state = AppState::new(redis, keys, config)?;
    let served = gateway::serve(listener, state, boxoffice_contract::shutdown::signal()).await;
    boxoffice_contract::otlp::flush_on_exit().await;
    served
}
