//! `GET /v1/events/{id}`, `GET /.well-known/jwks.json`, the fan page at `/`,
//! `/healthz`, `/readyz` and `/metrics`.

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use boxoffice_contract::event::{now_ms, seed_commitment, EventState, Identity};
use boxoffice_contract::extract::Path;
use boxoffice_contract::keys::{valid_event_id, EventKeys};
use boxoffice_contract::openapi;
use boxoffice_contract::Problem;
use chrono::{DateTime, Utc};
use redis::AsyncCommands;
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
    // The settings and stock view from the edge's cache (a tick old at
    // most, as for the join and the status poll): at the opening every
    // fan's page asks at once. The line's length is read live (ZCARD).
    let event = state
        .events
        .get(&state.redis, &keys, &event_id)
        .await
        .map_err(redis_down)?
        .ok_or_else(unknown_event)?;
    let mut redis = state.redis.clone();
    let queue_length: u64 = redis.zcard(keys.queue()).await.map_err(redis_down)?;
    let config = &event.config;
    let now = now_ms();
    Ok(axum::Json(EventInfo {
        event_id,
        state: config.state(now, event.seats),
        shuffle_commitment: seed_commitment(&config.shuffle_seed),
        identity: config.identity,
        shuffle_seed: (now >= config.opens_at_ms).then(|| config.shuffle_seed.clone()),
        opens_at: DateTime::<Utc>::from_timestamp_millis(config.opens_at_ms).unwrap_or_default(),
        remaining_hint: event.seats.remaining,
        queue_length,
        name: config.name.clone(),
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

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use axum::http::{Request, StatusCode};
    use boxoffice_contract::event::EventConfig;
    use boxoffice_contract::token::{generate_ed25519_pem, KeySet};
    use tower::ServiceExt;

    use super::*;

    /// At the opening every fan's page asks for the event at once: its
    /// settings are read once for the crowd, and the line's length live.
    #[tokio::test]
    async fn the_event_is_read_once_for_a_crowd_and_its_line_live() {
        let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
        let mut redis =
            redis::aio::ConnectionManager::new(redis::Client::open(url.clone()).unwrap())
                .await
                .unwrap();
        let mut config = crate::Config::defaults();
        config.redis_url = url;
        config.redis_prefix = format!("page{}", uuid::Uuid::new_v4().simple());
        let keys = EventKeys::new(&config.redis_prefix, "ev");
        let _: () = redis
            .hset_multiple(
                keys.config(),
                &EventConfig::open("Page", 100, 5.0).to_fields(),
            )
            .await
            .unwrap();
        let signing = KeySet::from_pems(
            "boxoffice",
            &generate_ed25519_pem(),
            &[],
            b"a-queue-secret-of-at-least-32-bytes!",
        )
        .unwrap();
        let state = AppState::new(redis.clone(), signing, config).unwrap();
        let app = crate::router(state.clone());
        let ask = || async {
            let request = Request::get("/v1/events/ev").body(Body::empty()).unwrap();
            let response = app.clone().oneshot(request).await.unwrap();
            assert_eq!(response.status(), StatusCode::OK);
            let body = axum::body::to_bytes(response.into_body(), usize::MAX)
                .await
                .unwrap();
            serde_json::from_slice::<EventInfo>(&body).unwrap()
        };

        // The first page reads it (in a sale, a join or a poll has already).
        assert_eq!(ask().await.name, "Page");
        let crowd = futures_util::future::join_all((0..20).map(|_| ask())).await;
        assert!(crowd
            .iter()
            .all(|e| e.name == "Page" && e.queue_length == 0));
        assert_eq!(
            state.events.reads(),
            1,
            "one read of the settings for 21 pages"
        );

        let _: () = redis.zadd(keys.queue(), "fan-1", 1).await.unwrap();
        assert_eq!(ask().await.queue_length, 1, "the line's length is live");
        assert_eq!(state.events.reads(), 1);
        let _: () = redis.del(&[keys.config(), keys.queue()]).await.unwrap();
    }
}
