use admission::cli;
use admission::config::{Cli, Command};
use anyhow::Context;
use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    boxoffice_contract::telemetry::init(cli.log_json);
    let printed = match cli.command {
        Command::Serve(config) => {
            let client = redis::Client::open(config.redis_url.as_str()).context("REDIS_URL")?;
            let redis = redis::aio::ConnectionManager::new(client)
                .await
                .context("connecting to Redis")?;
            let listener = tokio::net::TcpListener::bind(&config.listen)
                .await
                .with_context(|| format!("binding {}", config.listen))?;
            tracing::info!(listen = %config.listen, "admission admin API listening");
            let state = admission::AppState::new(redis, config)?;
            return admission::serve(listener, state, boxoffice_contract::shutdown::signal()).await;
        }
        Command::Event { admin, command } => cli::event(&admin, command).await?,
        Command::Capacity { admin, args } => cli::capacity(&admin, args).await?,
    };
    println!("{}", serde_json::to_string_pretty(&printed)?);
    Ok(())
}
