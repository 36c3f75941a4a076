use anyhow::Context;
use clap::Parser;
use order_service::payments::provider::{self, Provider};
use order_service::{connect_db, AppState, Cli, Command};
use tokio_util::sync::CancellationToken;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    boxoffice_contract::telemetry::init(cli.log_json);
    let exporting_as = match cli.command {
        Command::Serve(_) => Some(order_service::SERVICE),
        Command::Worker(_) => Some(order_service::WORKER_SERVICE),
        _ => None,
    };
    if let Some(service) = exporting_as {
        boxoffice_contract::otlp::init_from_env(service)
            .context("starting the OTLP span exporter (OTEL_EXPORTER_OTLP_*)")?;
    }
    let ran = run(cli.command).await;
    boxoffice_contract::otlp::flush_on_exit().await;
    ran
}

async fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Serve(config) => {
            config.service.check()?;
            config
                .service
                .check_secret("PAYMENT_API_KEY", &config.payment.payment_api_key)?;
            let pool = connect_db(&config.database_url, config.db_connections).await?;
            let redis = boxoffice_contract::redis_link::connect(&config.redis_url)
                .await
                .context("connecting to Redis (REDIS_URL)")?;
            let listener = tokio::net::TcpListener::bind(&config.listen)
                .await
                .with_context(|| format!("binding {}", config.listen))?;
            tracing::info!(listen = %config.listen, "order service listening");
            let state = AppState::new(pool, redis, config)?;
            order_service::serve(listener, state, boxoffice_contract::shutdown::signal()).await
        }
        Command::Worker(config) => {
            boxoffice_contract::auth::check_secret(
                "BOXOFFICE_TICKET_SECRET",
                &config.ticket_secret,
                config.allow_dev_secrets,
            )?;
            let pool = connect_db(&config.database_url, 4).await?;
            let cancel = CancellationToken::new();
            let on_signal = cancel.clone();
            tokio::spawn(async move {
                boxoffice_contract::shutdown::signal().await;
                on_signal.cancel();
            });
            let listener = tokio::net::TcpListener::bind(&config.listen)
                .await
                .with_context(|| format!("binding {}", config.listen))?;
            let broker = order_service::health::BrokerProbe::new(
                &config.kafka_brokers,
                &config.group,
                &config.topic,
            )?;
            let health = order_service::worker::health_router(pool.clone(), broker);
            let stop = cancel.clone();
            tokio::spawn(async move {
                axum::serve(listener, health)
                    .with_graceful_shutdown(stop.cancelled_owned())
                    .await
            });
            tracing::info!(topic = %config.topic, group = %config.group, listen = %config.listen, "ticket worker starting");
            order_service::worker::run(config, pool, cancel).await?;
            Ok(())
        }
        Command::Redrive(config) => {
            let sent = order_service::worker::dlq::redrive(&config).await?;
            println!("redriven: {sent}");
            Ok(())
        }
        Command::PaymentProvider(config) => {
            boxoffice_contract::auth::check_secret(
                "PAYMENT_API_KEY",
                &config.api_key,
                config.allow_dev_secrets,
            )?;
            let listener = tokio::net::TcpListener::bind(&config.listen)
                .await
                .with_context(|| format!("binding {}", config.listen))?;
            tracing::info!(listen = %config.listen, knobs = ?config.knobs, "fake payment provider listening");
            provider::serve(
                listener,
                Provider::new(config.knobs).with_api_key(&config.api_key),
                boxoffice_contract::shutdown::signal(),
            )
            .await
        }
    }
}
