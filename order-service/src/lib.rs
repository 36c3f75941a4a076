//! The BoxOffice order service: turns an admitted purchase into exactly one
//! confirmed order and exactly one set of tickets.
//!
//! One binary, four commands: `serve` (the internal order API, the saga
//! runners and the outbox relay; [`serve`]), `worker` (the ticket issuer),
//! `payment-provider` (the fake provider) and `redrive` (dead letters back to
//! their topic). PostgreSQL is the truth for seats and orders; the schema is
//! [`MIGRATOR`].
//!
//! - [`api`]: the internal HTTP API the gateway and admission call.
//! - [`store`]: every SQL statement; Postgres is the truth for seats and orders.
//! - [`saga`]: the orchestrated purchase saga, persisted so it resumes after a crash.
//! - [`stock`]: keeps the edge's Redis view of remaining seats in step with Postgres.
//! - [`relay`]: publishes the transactional outbox to Kafka (`FOR UPDATE SKIP LOCKED`).
//! - [`worker`]: the `ticket-issuer` consumer that turns `OrderConfirmed` into tickets.
//! - [`tickets`]: signed ticket codes, the PDF of an order, and the object store it lives in.
//! - [`health`]: order latency, outbox backlog and consumer lag, for adaptive admission.
//! - [`payments`]: the fake payment provider and the resilient client the saga charges through.
//! - [`kafka`]: client settings and topic creation shared by relay and worker.
//! - [`config`]: the command line.
#![forbid(unsafe_code)]

pub mod api;
pub mod config;
pub mod health;
pub mod kafka;
pub mod payments;
pub mod relay;
pub mod saga;
pub mod stock;
pub mod store;
pub mod tickets;
pub mod worker;

use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// The name the order service's exported spans carry (`service.name`).
pub const SERVICE: &str = "boxoffice-order-service";
/// The name the ticket worker's exported spans carry.
pub const WORKER_SERVICE: &str = "boxoffice-ticket-worker";

pub use config::{Cli, Command, RedriveConfig, ServeConfig, WorkerConfig, Workers};

/// The schema, embedded so every binary and test migrates the same way.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!();

/// What every request handler and background task of `serve` shares.
#[derive(Clone)]
pub struct AppState {
    pub pool: sqlx::PgPool,
    pub stock: stock::StockView,
    pub config: Arc<ServeConfig>,
    pub payments: payments::client::PaymentClient,
    pub tickets: tickets::TicketStore,
    /// Consumer lag, DLQ depth and broker readiness.
    pub broker: health::BrokerProbe,
    /// Wakes the saga runners when an order is placed, so they need not poll fast.
    pub saga_wakeup: Arc<tokio::sync::Notify>,
    /// Whether the outbox relay's producer is usable (readiness).
    pub relay: relay::RelayHealth,
}

impl AppState {
    pub fn new(
        pool: sqlx::PgPool,
        redis: impl Into<boxoffice_contract::redis_link::RedisLink>,
        config: ServeConfig,
    ) -> anyhow::Result<Self> {
        Ok(Self {
            pool,
            stock: stock::StockView::new(redis, &config.redis_prefix),
            payments: payments::client::PaymentClient::new(config.payment.clone())?,
            tickets: tickets::TicketStore::from_url(&config.ticket_store)?,
            broker: health::BrokerProbe::new(
                &config.kafka_brokers,
                &config.worker_group,
                &config.topic,
            )?,
            config: Arc::new(config),
            saga_wakeup: Arc::default(),
            relay: relay::RelayHealth::default(),
        })
    }
}

/// Runs the API, the saga runners and the outbox relay until `shutdown` resolves,
/// then lets in-flight work finish.
pub async fn serve(
    listener: TcpListener,
    state: AppState,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    // Install the recorder before the first count.
    boxoffice_contract::telemetry::prometheus();
    let cancel = CancellationToken::new();
    let tracker = TaskTracker::new();
    for runner in 0..state.config.saga_runners {
        tracker.spawn(saga::run(state.clone(), runner, cancel.clone()));
    }
    tracker.spawn(stock::reconcile(
        state.stock.clone(),
        state.pool.clone(),
        Duration::from_millis(state.config.stock_reconcile_ms),
        cancel.clone(),
    ));
    if state.config.relay {
        let producer = kafka::producer(&state.config.kafka_brokers)?;
        kafka::ensure_topics_replicated(
            &state.config.kafka_brokers,
            &[&state.config.topic],
            state.config.partitions,
            state.config.replication,
        )
        .await?;
        let brokers = state.config.kafka_brokers.clone();
        tracker.spawn(relay::run(
            state.pool.clone(),
            producer,
            relay::RelayConfig::from(&*state.config),
            state.relay.clone(),
            move || kafka::producer(&brokers),
            cancel.clone(),
        ));
    }
    tracker.close();

    let app = api::router(state);
    let server_cancel = cancel.clone();
    axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            shutdown.await;
            server_cancel.cancel();
        })
        .await?;
    cancel.cancel();
    tracker.wait().await;
    Ok(())
}

/// Connects to Postgres and brings the schema up to date.
pub async fn connect_db(url: &str, max_connections: u32) -> anyhow::Result<sqlx::PgPool> {
    use anyhow::Context;
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(max_connections)
        .connect(url)
        .await
        .with_context(|| {
            format!(
                "connecting to Postgres at {}",
                boxoffice_contract::auth::redact_url(url)
            )
        })?;
    MIGRATOR.run(&pool).await.context("running migrations")?;
    Ok(pool)
}
