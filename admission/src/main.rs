use admission::cli;
use admission::config::{Cli, Command, Config};
use anyhow::Context;
use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    boxoffice_contract::telemetry::init(cli.log_json);
    let printed = match cli.command {
        Command::Serve(config) => {
            boxoffice_contract::otlp::init_from_env(admission::SERVICE)
                .context("starting the OTLP span exporter (OTEL_EXPORTER_OTLP_*)")?;
            let served = serve(config).await;
            boxoffice_contract::otlp::flush_on_exit().await;
            return served;
        }
        Command::Event { admin, command } => cli::event(&admin, command).await?,
        Command::Capacity { admin, args } => cli::capacity(&admin, args).await?,
    };
    println!("{}", serde_json::to_string_pretty(&printed)?);
    Ok(())
}

async fn serve(config: Config) -> anyhow::Result<()> {
    config.check_secrets()?;
    let redis = boxoffice_contract::redis_link::connect(&config.redis_url)
        .await
        .context("connecting to Redis (REDIS_URL)")?;
    let listener = tokio::net::TcpListener::bind(&config.listen)
        .await
        .with_context(|| format!("binding {}", config.listen))?;
    tracing::info!(listen = %config.listen, "admission admin API listening");
    let state = admission::AppState::new(redis, config)?;
    admission::serve(listener, state, boxoffice_contract::shutdown::signal()).await
}
