//! The `ticket-issuer` consumer: turns each `OrderConfirmed` into one ticket set.
//!
//! At-least-once in, exactly-once in effect: the `processed_events` row and
//! the tickets are written in one transaction, so a redelivered event finds
//! its row and is skipped; an offset is committed only once it and every
//! offset before it in its partition are durable.
//!
//! - [`pool`]: the worker pool: parallel across keys, sequential within a
//!   key, watermark commits, retries, dead letters, drain on shutdown.
//! - [`dlq`]: dead-letter publishing and the `redrive` command.

pub mod dlq;
pub mod pool;

use boxoffice_contract::envelope::{CloudEvent, OrderConfirmed, ORDER_CONFIRMED_V1};
use sqlx::PgPool;
use uuid::Uuid;

use crate::tickets::{render, Ticket, TicketSigner, TicketStore};

pub use pool::{run, WorkerStats};

#[derive(Debug, thiserror::Error)]
pub enum HandleError {
    /// Retrying cannot help: the message is malformed or of an unknown type.
    #[error("fatal: {0}")]
    Fatal(String),
    /// The database was unreachable or busy; retrying may help.
    #[error("transient: {0}")]
    Transient(sqlx::Error),
    /// The ticket store refused the PDF; retrying may help.
    #[error("ticket store: {0}")]
    Store(String),
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

/// `/healthz`, `/readyz` (ready while Postgres and the broker answer) and
/// `/metrics` of a worker process.
pub fn health_router(pool: PgPool, broker: crate::health::BrokerProbe) -> axum::Router {
    use axum::response::IntoResponse;
    axum::Router::new()
        .route("/healthz", axum::routing::get(|| async { "ok" }))
        .route(
            "/metrics",
            axum::routing::get(boxoffice_contract::telemetry::metrics_endpoint),
        )
        .route(
            "/readyz",
            axum::routing::get(move || async move {
                let (db, broker) = tokio::join!(
                    sqlx::query_scalar!("SELECT 1 AS ping").fetch_one(&pool),
                    broker.reachable()
                );
                let db = db.is_ok();
                if db && broker {
                    "ready".into_response()
                } else {
                    boxoffice_contract::Problem::unavailable(
                        "not-ready",
                        format!("postgres up: {db}, broker up: {broker}"),
                        1,
                    )
                    .into_response()
                }
            }),
        )
        .layer(boxoffice_contract::telemetry::Traced(None))
}

/// What issuing tickets needs besides the database.
#[derive(Clone)]
pub struct Issuer {
    pub store: TicketStore,
    pub signer: TicketSigner,
}

/// Applies one event: the dedup row and the ticket rows in one transaction,
/// and the order's PDF written to the store before that transaction commits
/// (a failed write is transient: nothing is committed, the event is retried;
/// codes are deterministic, so a retry writes the same PDF).
pub async fn handle(
    pool: &PgPool,
    issuer: &Issuer,
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
    // The order service never places more than MAX_QUANTITY seats; anything
    // else is not an order of ours (and would overflow the seat range).
    if !(1..=crate::api::MAX_QUANTITY).contains(&data.quantity)
        || data.first_seat < 1
        || data.first_seat.checked_add(data.quantity).is_none()
    {
        return Err(HandleError::Fatal(format!(
            "bad {ORDER_CONFIRMED_V1} data: quantity {} from seat {}",
            data.quantity, data.first_seat
        )));
    }
    #[cfg(not(feature = "selfcheck-wrong-dedup-key"))]
    let dedup_key = envelope.id;
    #[cfg(feature = "selfcheck-wrong-dedup-key")]
    let dedup_key = {
        use sha2::Digest;
        Uuid::from_slice(&sha2::Sha256::digest(data.event_id.as_bytes())[..16]).expect("16 bytes")
    };
    let mut tx = pool.begin().await?;
    let fresh = sqlx::query!(
        "INSERT INTO processed_events (consumer, event_id) VALUES ($1, $2) ON CONFLICT DO NOTHING",
        consumer_name,
        dedup_key,
    )
    .execute(&mut *tx)
    .await?
    .rows_affected()
        == 1;
    if !fresh {
        return Ok(Outcome::Duplicate);
    }
    // Tickets only for an order PostgreSQL holds as confirmed, as the event
    // says it: a forged or altered message on the topic mints nothing.
    let known: Option<(String, String, i32, Option<i32>)> = sqlx::query!(
        "SELECT event_id, status, quantity, first_seat FROM orders WHERE order_id = $1",
        data.order_id,
    )
    .fetch_optional(&mut *tx)
    .await?
    .map(|r| (r.event_id, r.status, r.quantity, r.first_seat));
    let expected = (
        data.event_id.clone(),
        "confirmed".to_owned(),
        data.quantity,
        Some(data.first_seat),
    );
    if known.as_ref() != Some(&expected) {
        return Err(HandleError::Fatal(format!(
            "order {} is not a confirmed order of event {} with {} seats from seat {} (the database has {known:?})",
            data.order_id, data.event_id, data.quantity, data.first_seat
        )));
    }
    let event_name: String = sqlx::query_scalar!(
        "SELECT name FROM events WHERE event_id = $1",
        &data.event_id
    )
    .fetch_optional(&mut *tx)
    .await?
    .ok_or_else(|| HandleError::Fatal(format!("unknown event {}", data.event_id)))?;
    let seats: Vec<i32> = (data.first_seat..data.first_seat + data.quantity).collect();
    let codes: Vec<String> = seats
        .iter()
        .map(|seat| issuer.signer.code(&data.event_id, data.order_id, *seat))
        .collect();
    for (seat, code) in seats.iter().zip(&codes) {
        sqlx::query!(
            "INSERT INTO tickets (ticket_id, order_id, event_id, seat_no, code) VALUES ($1, $2, $3, $4, $5)",
            Uuid::now_v7(),
            data.order_id,
            &data.event_id,
            seat,
            code,
        )
        .execute(&mut *tx)
        .await?;
    }
    let tickets: Vec<Ticket<'_>> = seats
        .iter()
        .zip(&codes)
        .map(|(seat, code)| Ticket {
            event_name: &event_name,
            seat: *seat,
            code,
        })
        .collect();
    let written = std::time::Instant::now();
    let pdf = render(data.order_id, &tickets);
    let rendered = written.elapsed();
    issuer
        .store
        .put(data.order_id, pdf)
        .await
        .map_err(|e| HandleError::Store(e.to_string()))?;
    let stored = written.elapsed();
    tx.commit().await?;
    tracing::debug!(?rendered, ?stored, committed = ?written.elapsed(), "ticket phases");
    tracing::info!(order_id = %data.order_id, seats = data.quantity, "tickets issued");
    Ok(Outcome::Issued)
}
