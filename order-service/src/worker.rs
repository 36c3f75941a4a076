//! The `ticket-issuer` consumer: turns each `OrderConfirmed` into one ticket set.
//!
//! At-least-once in, exactly-once in effect: the `processed_events` row and
//! the tickets are written in one transaction, so a redelivered event finds
//! its row and is skipped; its offset is committed only after that
//! transaction is durable. Messages are handled one at a time in this
//! version, which keeps order per key trivially.

use std::collections::HashMap;
use std::time::Duration;

use anyhow::Context;
use boxoffice_contract::envelope::{CloudEvent, OrderConfirmed, ORDER_CONFIRMED_V1};
use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::message::{BorrowedMessage, Message};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::WorkerConfig;

#[derive(Debug, thiserror::Error)]
pub enum HandleError {
    /// Retrying cannot help: the message is malformed or of an unknown type.
    #[error("fatal: {0}")]
    Fatal(String),
    /// The database was unreachable or busy; retrying may help.
    #[error("transient: {0}")]
    Transient(sqlx::Error),
}

impl From<sqlx::Error> for HandleError {
    /// A constraint violation will fail the same way every time: fatal, so
    /// the message cannot stall its partition. Anything else may pass later.
    fn from(error: sqlx::Error) -> Self {
        let constraint = error
            .as_database_error()
            .and_then(|e| e.code())
            .is_some_and(|code| code.starts_with("23"));
        if constraint {
            Self::Fatal(format!("constraint violated: {error}"))
        } else {
            Self::Transient(error)
        }
    }
}

/// What handling one event did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Issued,
    Duplicate,
}

/// `/healthz` and `/readyz` (ready while Postgres answers) of a worker process.
pub fn health_router(pool: PgPool) -> axum::Router {
    use axum::response::IntoResponse;
    axum::Router::new()
        .route("/healthz", axum::routing::get(|| async { "ok" }))
        .route(
            "/readyz",
            axum::routing::get(move || async move {
                match sqlx::query("SELECT 1").execute(&pool).await {
                    Ok(_) => "ready".into_response(),
                    Err(_) => boxoffice_contract::Problem::unavailable(
                        "not-ready",
                        "postgres is unreachable",
                        1,
                    )
                    .into_response(),
                }
            }),
        )
}

pub fn consumer(config: &WorkerConfig) -> anyhow::Result<StreamConsumer> {
    let consumer: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", &config.kafka_brokers)
        .set("group.id", &config.group)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .set("session.timeout.ms", "10000")
        .create()
        .context("creating the Kafka consumer")?;
    consumer
        .subscribe(&[&config.topic])
        .context("subscribing to the order topic")?;
    Ok(consumer)
}

/// Consumes until cancelled, then commits what is done and returns.
pub async fn run(
    config: WorkerConfig,
    pool: PgPool,
    cancel: CancellationToken,
) -> anyhow::Result<()> {
    let consumer = consumer(&config)?;
    let mut done: HashMap<(String, i32), i64> = HashMap::new();
    let mut commit_tick =
        tokio::time::interval(Duration::from_millis(config.commit_interval_ms.max(10)));
    loop {
        tokio::select! {
            () = cancel.cancelled() => break,
            _ = commit_tick.tick() => commit(&consumer, &mut done, CommitMode::Async),
            received = consumer.recv() => match received {
                Ok(message) => {
                    let Some(()) = handle_until_done(&pool, &config.group, &message, &cancel).await else {
                        break;
                    };
                    done.insert((message.topic().to_owned(), message.partition()), message.offset() + 1);
                }
                Err(error) => {
                    tracing::warn!(%error, "consumer error");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            },
        }
    }
    commit(&consumer, &mut done, CommitMode::Sync);
    tracing::info!("ticket worker stopped");
    Ok(())
}

/// Handles one message, retrying transient failures until it is done or we
/// are cancelled (`None`: leave it uncommitted for the next owner).
async fn handle_until_done(
    pool: &PgPool,
    consumer_name: &str,
    message: &BorrowedMessage<'_>,
    cancel: &CancellationToken,
) -> Option<()> {
    let mut backoff = Duration::from_millis(250);
    loop {
        let span = tracing::info_span!(
            "message",
            topic = message.topic(),
            partition = message.partition(),
            offset = message.offset()
        );
        let _guard = span.enter();
        match handle(pool, consumer_name, message.payload().unwrap_or_default()).await {
            Ok(outcome) => {
                tracing::debug!(?outcome, "handled");
                return Some(());
            }
            Err(HandleError::Fatal(reason)) => {
                // Dead-lettering comes with the worker pool; skipping keeps the partition moving.
                tracing::error!(%reason, "poison message skipped");
                return Some(());
            }
            Err(HandleError::Transient(error)) => {
                tracing::warn!(%error, ?backoff, "transient failure; retrying");
            }
        }
        tokio::select! {
            () = cancel.cancelled() => return None,
            () = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 4).min(Duration::from_secs(16));
    }
}

fn commit(consumer: &StreamConsumer, done: &mut HashMap<(String, i32), i64>, mode: CommitMode) {
    if done.is_empty() {
        return;
    }
    let mut list = TopicPartitionList::new();
    for ((topic, partition), next) in done.iter() {
        if let Err(error) = list.add_partition_offset(topic, *partition, Offset::Offset(*next)) {
            tracing::warn!(%error, "building the commit list");
        }
    }
    match consumer.commit(&list, mode) {
        Ok(()) => done.clear(),
        Err(error) => tracing::warn!(%error, "offset commit failed; will retry"),
    }
}

/// Applies one event: the dedup row and the tickets in one transaction.
pub async fn handle(
    pool: &PgPool,
    consumer_name: &str,
    payload: &[u8],
) -> Result<Outcome, HandleError> {
    let envelope: CloudEvent<serde_json::Value> = serde_json::from_slice(payload)
        .map_err(|e| HandleError::Fatal(format!("not a CloudEvent: {e}")))?;
    if envelope.kind != ORDER_CONFIRMED_V1 {
        return Err(HandleError::Fatal(format!(
            "unknown event type {}",
            envelope.kind
        )));
    }
    let data: OrderConfirmed = serde_json::from_value(envelope.data)
        .map_err(|e| HandleError::Fatal(format!("bad {ORDER_CONFIRMED_V1} data: {e}")))?;
    let mut tx = pool.begin().await?;
    let fresh = sqlx::query(
        "INSERT INTO processed_events (consumer, event_id) VALUES ($1, $2) ON CONFLICT DO NOTHING",
    )
    .bind(consumer_name)
    .bind(envelope.id)
    .execute(&mut *tx)
    .await?
    .rows_affected()
        == 1;
    if !fresh {
        return Ok(Outcome::Duplicate);
    }
    for seat in data.first_seat..data.first_seat + data.quantity {
        sqlx::query(
            "INSERT INTO tickets (ticket_id, order_id, event_id, seat_no, code) VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(Uuid::now_v7())
        .bind(data.order_id)
        .bind(&data.event_id)
        .bind(seat)
        .bind(Uuid::new_v4().simple().to_string())
        .execute(&mut *tx)
        .await?;
    }
    tx.commit().await?;
    tracing::info!(order_id = %data.order_id, seats = data.quantity, "tickets issued");
    Ok(Outcome::Issued)
}
