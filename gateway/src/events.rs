//! `GET /v1/events/{id}`, `GET /.well-known/jwks.json`, the fan page at `/`,
//! `/healthz`, `/readyz` and `/metrics`.

use std::collections::HashMap;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use boxoffice_contract::event::{now_ms, seed_commitment, EventConfig, EventState};
use boxoffice_contract::extract::Path;
use boxoffice_contract::keys::{valid_event_id, EventKeys};
use boxoffice_contract::Problem;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::{redis_down, AppState};

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/events/{event_id}", get(get_event))
        .route("/.well-known/jwks.json", get(jwks))
        .route("/", get(fan_page))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route(
            "/metrics",
            get(boxoffice_contract::telemetry::metrics_endpoint),
        )
}

pub fn unknown_event() -> Problem {
    Problem::not_found("unknown-event", "no such event")
}

#[derive(Debug, Serialize, Deserialize)]
pub struct EventInfo {
    pub event_id: String,
    pub name: String,
    pub state: EventState,
    pub opens_at: DateTime<Utc>,
    /// The edge view of seats left; Postgres has the exact figure.
    pub remaining_hint: Option<i64>,
    pub queue_length: u64,
    /// Hex SHA-256 of the seed that orders the prequeue, published from the start.
    pub shuffle_commitment: String,
    /// The seed itself, published once the event opens, so anyone can
    /// recompute the prequeue order and check it against the commitment.
    pub shuffle_seed: Option<String>,
}

async fn get_event(
    State(state): State<AppState>,
    Path(event_id): Path<String>,
) -> Result<axum::Json<EventInfo>, Problem> {
    if !valid_event_id(&event_id) {
        return Err(unknown_event());
    }
    let keys = EventKeys::new(&state.config.redis_prefix, &event_id);
    let mut redis = state.redis.clone();
    let (fields, remaining, queue_length): (HashMap<String, String>, Option<i64>, u64) =
        redis::pipe()
            .hgetall(keys.config())
            .hget(keys.stock(), "remaining")
            .zcard(keys.queue())
            .query_async(&mut redis)
            .await
            .map_err(redis_down)?;
    let config = EventConfig::from_fields(&fields).ok_or_else(unknown_event)?;
    let now = now_ms();
    Ok(axum::Json(EventInfo {
        event_id,
        state: config.state(now, remaining),
        shuffle_commitment: seed_commitment(&config.shuffle_seed),
        shuffle_seed: (now >= config.opens_at_ms).then(|| config.shuffle_seed.clone()),
        opens_at: DateTime::<Utc>::from_timestamp_millis(config.opens_at_ms).unwrap_or_default(),
        name: config.name,
        remaining_hint: remaining,
        queue_length,
    }))
}

/// The waiting-room page: join, live place, buy, follow the order. One
/// static file shipped in the binary; it only uses the public API.
async fn fan_page() -> Response {
    (
        [
            (axum::http::header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (axum::http::header::CACHE_CONTROL, "public, max-age=60"),
        ],
        include_str!("../assets/index.html"),
    )
        .into_response()
}

async fn jwks(State(state): State<AppState>) -> Response {
    (
        [(axum::http::header::CACHE_CONTROL, "public, max-age=300")],
        axum::Json(state.keys.jwks()),
    )
        .into_response()
}

async fn readyz(State(state): State<AppState>) -> Response {
    let mut redis = state.redis.clone();
    match redis::cmd("PING").query_async::<String>(&mut redis).await {
        Ok(_) => "ready".into_response(),
        Err(_) => Problem::unavailable("not-ready", "redis is unreachable", 1).into_response(),
    }
}
