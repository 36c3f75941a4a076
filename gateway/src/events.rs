//! `GET /v1/events/{id}`, `GET /.well-known/jwks.json`, the fan page at `/`,
//! `/healthz`, `/readyz` and `/metrics`.

use std::collections::HashMap;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use boxoffice_contract::event::{
    now_ms, seed_commitment, EventConfig, EventState, Identity, SeatView,
};
use boxoffice_contract::extract::Path;
use boxoffice_contract::keys::{valid_event_id, EventKeys};
use boxoffice_contract::openapi;
use boxoffice_contract::Problem;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::{redis_down, AppState};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(get_event))
        .routes(routes!(jwks))
        .routes(routes!(fan_page))
        .routes(routes!(openapi::healthz))
        .routes(routes!(readyz))
        .routes(routes!(openapi::metrics))
}

pub fn unknown_event() -> Problem {
    Problem::not_found("unknown-event", "no such event")
}

#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
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
    /// How a join names its fan: `declared` (send `fan_id`), `anonymous`
    /// (send nothing; join again with the queue ticket to keep the place) or
    /// `account` (send the site login's `identity_token`).
    pub identity: Identity,
}

/// An event as fans see it: state, when it opens, seats left (a hint), line length.
#[utoipa::path(
    get,
    path = "/v1/events/{event_id}",
    tag = "events",
    params(("event_id" = String, Path, description = "The event")),
    responses(
        (status = 200, description = "The event", body = EventInfo),
        (status = 404, description = "`unknown-event`", body = Problem, content_type = "application/problem+json"),
    )
)]
async fn get_event(
    State(state): State<AppState>,
    Path(event_id): Path<String>,
) -> Result<axum::Json<EventInfo>, Problem> {
    if !valid_event_id(&event_id) {
        return Err(unknown_event());
    }
    let keys = EventKeys::new(&state.config.redis_prefix, &event_id);
    let mut redis = state.redis.clone();
    type Answer = (HashMap<String, String>, (Option<i64>, Option<i64>), u64);
    let (fields, (remaining, held), queue_length): Answer = redis::pipe()
        .hgetall(keys.config())
        .hget(keys.stock(), &["remaining", "held"])
        .zcard(keys.queue())
        .query_async(&mut redis)
        .await
        .map_err(redis_down)?;
    let config = EventConfig::from_fields(&fields).ok_or_else(unknown_event)?;
    let now = now_ms();
    Ok(axum::Json(EventInfo {
        event_id,
        state: config.state(now, SeatView::new(remaining, held)),
        shuffle_commitment: seed_commitment(&config.shuffle_seed),
        identity: config.identity,
        shuffle_seed: (now >= config.opens_at_ms).then(|| config.shuffle_seed.clone()),
        opens_at: DateTime::<Utc>::from_timestamp_millis(config.opens_at_ms).unwrap_or_default(),
        name: config.name,
        remaining_hint: remaining,
        queue_length,
    }))
}

/// The waiting-room page: join, live place, buy, follow the order. One
/// static file shipped in the binary; it only uses the public API.
#[utoipa::path(
    get,
    path = "/",
    tag = "pages",
    responses((status = 200, description = "The fan page (`?event=<id>` picks the event)", body = String, content_type = "text/html"))
)]
async fn fan_page() -> Response {
    const PAGE: &str = include_str!("../assets/index.html");
    static SECURITY: std::sync::LazyLock<axum::http::HeaderMap> = std::sync::LazyLock::new(|| {
        boxoffice_contract::page::headers(PAGE)
            .into_iter()
            .collect()
    });
    (
        [
            (axum::http::header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (axum::http::header::CACHE_CONTROL, "public, max-age=60"),
        ],
        SECURITY.clone(),
        PAGE,
    )
        .into_response()
}

/// The public keys that verify access and order tokens (JWK set, Ed25519, by `kid`).
#[utoipa::path(
    get,
    path = "/.well-known/jwks.json",
    tag = "tokens",
    responses((status = 200, description = "JWK set", body = Object, content_type = "application/json"))
)]
async fn jwks(State(state): State<AppState>) -> Response {
    (
        [(axum::http::header::CACHE_CONTROL, "public, max-age=300")],
        axum::Json(state.keys.jwks()),
    )
        .into_response()
}

/// How long a readiness answer is reused: `/readyz` is on the public port
/// and not rate limited (probes must always get through), so a flood of it
/// must not become a flood of Redis round trips.
const READINESS_REUSE: std::time::Duration = std::time::Duration::from_millis(500);

/// Ready when Redis answers (checked at most once per 500 ms; callers in
/// between get the last answer) and, with an identity JWKS configured, once
/// it has been read.
#[utoipa::path(
    get,
    path = "/readyz",
    tag = "meta",
    responses(
        (status = 200, description = "Ready", body = String, content_type = "text/plain"),
        (status = 503, description = "`not-ready`", body = Problem, content_type = "application/problem+json"),
    )
)]
async fn readyz(State(state): State<AppState>) -> Response {
    if state.config.identity_jwks.is_some() && state.identity.get().is_none() {
        return Problem::unavailable("not-ready", "the identity JWKS has not been read yet", 1)
            .into_response();
    }
    // One check at a time; whoever waited for it takes its answer.
    let mut last = state.readiness.lock().await;
    let ready = match *last {
        Some((at, ready)) if at.elapsed() < READINESS_REUSE => ready,
        _ => {
            // Bounded: a Redis being reconnected to must not hold every
            // probe behind this lock.
            let mut redis = state.redis.clone();
            let command = redis::cmd("PING");
            let ping = command.query_async::<String>(&mut redis);
            let ready = matches!(tokio::time::timeout(READINESS_REUSE, ping).await, Ok(Ok(_)));
            *last = Some((std::time::Instant::now(), ready));
            ready
        }
    };
    drop(last);
    if ready {
        "ready".into_response()
    } else {
        Problem::unavailable("not-ready", "redis is unreachable", 1).into_response()
    }
}
