//! The admin API, behind `Authorization: Bearer $BOXOFFICE_ADMIN_TOKEN`.
//!
//! | method, path | does |
//! | --- | --- |
//! | `PUT /admin/v1/events/{id}` | create or replace an event (Postgres inventory via the order service, then Redis) |
//! | `PATCH /admin/v1/events/{id}` | tune rate, cap, pause or close; the next tick applies it |
//! | `GET /admin/v1/events/{id}` | settings and live stats |
//! | `DELETE /admin/v1/events/{id}/admissions/{fan}` | revoke a fan's admission: its access token stops working |
//! | `GET /admin/v1/capacity?…` | Little's law: workers, partitions, spike backlog and drain time |
//! | `GET /admin/v1/events` | every event: id, name, state |
//! | `GET /admin/v1/events/{id}/history?since_ms=` | the dashboard's samples of the last minutes |
//!
//! Without the token: `GET /admin/` (the dashboard page, which asks for the
//! token), its assets, `/healthz`, `/readyz`, `/metrics`.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};

use axum::extract::rejection::QueryRejection;
use axum::extract::{ConnectInfo, Query, Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::Router;
use boxoffice_contract::auth;
use boxoffice_contract::capacity::{self, Demand, Plan};
use boxoffice_contract::event::{
    now_ms, Adaptive, EventConfig, EventState, Identity, SeatView, FIFO_BASE,
};
use boxoffice_contract::extract::{Json, Path};
use boxoffice_contract::keys::{events_key, valid_event_id, EventKeys};
use boxoffice_contract::openapi::{self, AdminSecurity};
use boxoffice_contract::Problem;
use chrono::{DateTime, Utc};
use redis::AsyncCommands;
use serde::{Deserialize, Serialize};
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::restore;
use crate::{dashboard, AppState};

/// The admin API's OpenAPI document, before the routes add their paths.
#[derive(utoipa::OpenApi)]
#[openapi(
    info(
        title = "BoxOffice admin API",
        description = "Create, open, tune and watch sales; size the pipeline. Every `/admin/v1` call needs `Authorization: Bearer <admin token>`. Errors are RFC 9457 problem documents (`application/problem+json`).",
        license(name = "Apache-2.0")
    ),
    modifiers(&AdminSecurity),
    tags(
        (name = "events", description = "Sales: create, tune, watch"),
        (name = "capacity", description = "Little's law planner"),
        (name = "dashboard", description = "The ops dashboard page and its assets (no token: the page asks for it)"),
        (name = "meta", description = "Health, metrics, this document"),
    )
)]
pub struct ApiDoc;

/// Every route and the OpenAPI document built from the same list.
pub fn routes(state: &AppState) -> (Router<AppState>, utoipa::openapi::OpenApi) {
    openapi::finish(
        OpenApiRouter::with_openapi(ApiDoc::openapi())
            .routes(routes!(get_event, put_event, patch_event))
            .routes(routes!(revoke))
            .routes(routes!(capacity))
            .routes(routes!(dashboard::list_events))
            .routes(routes!(dashboard::history))
            .route_layer(middleware::from_fn_with_state(state.clone(), require_admin))
            .routes(routes!(dashboard::page))
            .routes(routes!(dashboard::page_redirect))
            .routes(routes!(dashboard::asset))
            .routes(routes!(openapi::healthz))
            .routes(routes!(openapi::metrics))
            .routes(routes!(readyz)),
    )
}

pub fn router(state: AppState) -> Router {
    let (routes, _) = routes(&state);
    boxoffice_contract::problem::with_fallbacks(routes)
        .with_state(state)
        .layer(axum::middleware::from_fn(
            boxoffice_contract::telemetry::observe,
        ))
}

async fn require_admin(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let client = request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map_or(IpAddr::from([0, 0, 0, 0]), |c| c.0.ip());
    let now = std::time::Instant::now();
    if let Some(left) = state.lockout.locked(client, now) {
        return Problem::too_many_requests(
            "too-many-failures",
            "too many wrong admin tokens from this client; wait",
            left.as_secs().max(1),
        )
        .into_response();
    }
    match auth::bearer(request.headers()) {
        Some(token) if auth::same_secret(token.as_bytes(), state.config.admin_token.as_bytes()) => {
            state.lockout.succeeded(client);
            next.run(request).await
        }
        _ => {
            state.lockout.failed(client, now);
            tracing::warn!(%client, "admin request with a wrong or missing token");
            Problem::unauthorized("unauthorized", "send Authorization: Bearer <admin token>")
                .into_response()
        }
    }
}

fn invalid(field: &str, rule: &str) -> Problem {
    Problem::new(
        StatusCode::UNPROCESSABLE_ENTITY,
        "invalid-field",
        format!("{field}: {rule}"),
    )
}

pub(crate) fn redis_down(error: redis::RedisError) -> Problem {
    tracing::error!(%error, "redis error");
    Problem::unavailable(
        "upstream-unavailable",
        "the waiting-room store is unavailable",
        1,
    )
}

/// 422 unless the path's event id can live in a key and a URL.
pub(crate) fn check_event_id(event_id: &str) -> Result<(), Problem> {
    if valid_event_id(event_id) {
        Ok(())
    } else {
        Err(invalid(
            "event_id",
            "1-64 characters of A-Z, a-z, 0-9, '-' and '_'",
        ))
    }
}

/// The body of `PUT /admin/v1/events/{id}`.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EventSpec {
    /// 1-200 characters, not only spaces (leading and trailing spaces are
    /// dropped), no control characters.
    #[schema(min_length = 1, max_length = 200)]
    pub name: String,
    /// Seats, 0 to 10000000; never below what is already sold or held.
    #[schema(minimum = 0, maximum = 10_000_000)]
    pub capacity: i64,
    /// When joining opens, not after opens_at; defaults to `opens_at` (no prequeue).
    #[serde(default)]
    pub prequeue_at: Option<DateTime<Utc>>,
    pub opens_at: DateTime<Utc>,
    /// Fans admitted per second: greater than 0 and at most 100000.
    #[schema(exclusive_minimum = 0, maximum = 100_000)]
    pub admission_rate_per_s: f64,
    /// Admitted fans at once, 1 to 1000000.
    #[serde(default = "defaults::max_active")]
    #[schema(minimum = 1, maximum = 1_000_000)]
    pub max_active: u64,
    /// Lifetime of an admission, 10 to 86400 seconds.
    #[serde(default = "defaults::access_ttl_s")]
    #[schema(minimum = 10, maximum = 86_400)]
    pub access_ttl_s: u64,
    /// Seats one fan may buy at this event, 1 to 100.
    #[serde(default = "defaults::per_fan_limit")]
    #[schema(minimum = 1, maximum = 100)]
    pub per_fan_limit: u32,
    /// Fans in line at most, 1 to 100000000.
    #[serde(default = "defaults::max_queue")]
    #[schema(minimum = 1, maximum = 100_000_000)]
    pub max_queue: u64,
    /// Price of a seat in cents, not negative.
    #[serde(default)]
    #[schema(minimum = 0)]
    pub price_cents: i64,
    /// Optional: let the leader tune the rate within `[floor, ceiling]` from the pipeline's health.
    #[serde(default)]
    pub adaptive: Option<Adaptive>,
    /// Optional: proof of work asked of each join, in leading zero bits, 0 to 24.
    #[serde(default)]
    #[schema(minimum = 0, maximum = 24)]
    pub pow_bits: u8,
    /// Optional: who a fan is. `declared` (default: the id the client
    /// sends), `anonymous` (the gateway names each fan in its signed queue
    /// ticket) or `account` (an identity token from the site's login).
    #[serde(default)]
    pub identity: Identity,
}

/// Highest proof-of-work difficulty: about 16 million hashes on average.
pub const MAX_POW_BITS: u8 = 24;

fn check_pow(bits: u8) -> Result<(), Problem> {
    if bits <= MAX_POW_BITS {
        Ok(())
    } else {
        Err(invalid("pow_bits", "0 to 24"))
    }
}

fn check_adaptive(a: &Adaptive) -> Result<(), Problem> {
    check_rate(a.floor)
        .map_err(|_| invalid("adaptive.floor", "greater than 0 and at most 100000"))?;
    check_rate(a.ceiling)
        .map_err(|_| invalid("adaptive.ceiling", "greater than 0 and at most 100000"))?;
    if a.floor > a.ceiling {
        return Err(invalid("adaptive.floor", "not above adaptive.ceiling"));
    }
    if a.max_order_latency_ms.is_nan()
        || a.max_order_latency_ms <= 0.0
        || a.max_outbox_backlog < 0
        || a.max_consumer_lag < 0
    {
        return Err(invalid("adaptive", "thresholds must be positive"));
    }
    Ok(())
}

mod defaults {
    use boxoffice_contract::event::defaults;

    pub fn max_active() -> u64 {
        defaults::MAX_ACTIVE
    }
    pub fn access_ttl_s() -> u64 {
        defaults::ACCESS_TTL_S
    }
    pub fn per_fan_limit() -> u32 {
        defaults::PER_FAN_LIMIT
    }
    pub fn max_queue() -> u64 {
        defaults::MAX_QUEUE
    }
}

/// Highest admission rate accepted, fans per second.
pub const MAX_RATE: f64 = 100_000.0;

impl EventSpec {
    /// The settings as stored, or the first field that is out of range.
    pub fn validate(&self) -> Result<EventConfig, Problem> {
        let name = self.name.trim();
        // Characters, as the document's maxLength counts them (not bytes).
        if name.is_empty() || name.chars().count() > 200 {
            return Err(invalid("name", "1-200 characters"));
        }
        // A name is shown to fans on a page and in tickets: no line breaks,
        // NULs (PostgreSQL refuses them) or other control characters.
        if name.chars().any(char::is_control) {
            return Err(invalid("name", "no control characters"));
        }
        if !(0..=10_000_000).contains(&self.capacity) {
            return Err(invalid("capacity", "0 to 10000000"));
        }
        check_rate(self.admission_rate_per_s)?;
        if !(1..=1_000_000).contains(&self.max_active) {
            return Err(invalid("max_active", "1 to 1000000"));
        }
        if !(10..=86_400).contains(&self.access_ttl_s) {
            return Err(invalid("access_ttl_s", "10 to 86400 seconds"));
        }
        if !(1..=100).contains(&self.per_fan_limit) {
            return Err(invalid("per_fan_limit", "1 to 100"));
        }
        if !(1..=100_000_000).contains(&self.max_queue) {
            return Err(invalid("max_queue", "1 to 100000000"));
        }
        if self.price_cents < 0 {
            return Err(invalid("price_cents", "not negative"));
        }
        let opens_at_ms = self.opens_at.timestamp_millis();
        let prequeue_at_ms = self
            .prequeue_at
            .map_or(opens_at_ms, |t| t.timestamp_millis());
        if prequeue_at_ms > opens_at_ms {
            return Err(invalid("prequeue_at", "not after opens_at"));
        }
        Ok(EventConfig {
            name: name.to_owned(),
            capacity: self.capacity,
            prequeue_at_ms,
            opens_at_ms,
            admission_rate_per_s: self.admission_rate_per_s,
            max_active: self.max_active,
            access_ttl_s: self.access_ttl_s,
            per_fan_limit: self.per_fan_limit,
            max_queue: self.max_queue,
            price_cents: self.price_cents,
            paused: false,
            closed: false,
            shuffle_seed: boxoffice_contract::event::new_seed(),
            adaptive: self
                .adaptive
                .map(|a| check_adaptive(&a).map(|()| a))
                .transpose()?,
            pow_bits: check_pow(self.pow_bits).map(|()| self.pow_bits)?,
            identity: self.identity,
        })
    }
}

fn check_rate(rate: f64) -> Result<(), Problem> {
    if rate.is_finite() && rate > 0.0 && rate <= MAX_RATE {
        Ok(())
    } else {
        Err(invalid(
            "admission_rate_per_s",
            "greater than 0 and at most 100000",
        ))
    }
}

/// Seats as the order service reports them.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct Seats {
    pub capacity: i64,
    pub reserved: i64,
    pub sold: i64,
    pub remaining: i64,
}

/// Settings and live stats, the answer of every admin event call.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct EventView {
    pub event_id: String,
    pub name: String,
    pub state: EventState,
    pub capacity: i64,
    pub prequeue_at: DateTime<Utc>,
    pub opens_at: DateTime<Utc>,
    pub admission_rate_per_s: f64,
    pub max_active: u64,
    pub access_ttl_s: u64,
    pub per_fan_limit: u32,
    pub max_queue: u64,
    pub price_cents: i64,
    pub paused: bool,
    pub adaptive: Option<Adaptive>,
    pub pow_bits: u8,
    pub identity: Identity,
    pub queue_length: u64,
    pub active: u64,
    pub admitted_total: u64,
    /// Fans admitted per second over the last minute (or since the first sample).
    pub admit_rate_1m: f64,
    /// How long the fan at the head of the line has waited, to about a second.
    pub oldest_wait_s: f64,
    /// `null` when the order service cannot be reached.
    pub sold: Option<i64>,
    pub remaining: Option<i64>,
}

/// Creates (201) or replaces (200) an event: inventory in Postgres through
/// the order service, settings in Redis.
#[utoipa::path(
    put,
    path = "/admin/v1/events/{event_id}",
    security(("admin_token" = [])),
    tag = "events",
    params(("event_id" = String, Path, description = "The event: 1-64 of A-Z a-z 0-9 - _")),
    request_body = EventSpec,
    responses(
        (status = 201, description = "Created", body = EventView),
        (status = 200, description = "Replaced", body = EventView),
        (status = 400, description = "`bad-request`", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "`unauthorized`: no or wrong admin token", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "`capacity-below-sold`; `seed-published` (the event has opened, so its shuffle seed is public: `opens_at` cannot move into the future again); `identity-fixed` (fans are in line or the event has opened: its `identity` cannot change)", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "`unsupported-media-type`", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "`invalid-field`, `invalid-body`", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "`upstream-unavailable`", body = Problem, content_type = "application/problem+json"),
    )
)]
async fn put_event(
    State(state): State<AppState>,
    Path(event_id): Path<String>,
    Json(spec): Json<EventSpec>,
) -> Result<Response, Problem> {
    check_event_id(&event_id)?;
    let mut config = spec.validate()?;
    // A replaced event keeps its shuffle seed: its commitment may already be public.
    let keys = EventKeys::new(&state.config.redis_prefix, &event_id);
    let mut redis = state.redis.clone();
    let current = ["seed", "opens_at_ms", "identity"];
    let (mut seed, mut opened_ms, mut identity): (Option<String>, Option<i64>, Option<String>) =
        redis
            .hget(keys.config(), &current)
            .await
            .map_err(redis_down)?;
    // Redis may have lost an event PostgreSQL still knows: what it already
    // is (its published seed, its opening, its identity) comes from there,
    // or a PUT after the loss would draw a new seed and lift every check below.
    // Read again whoever put it back (this call or the periodic restore).
    if seed.is_none() {
        restore::restore_event(&state, &event_id).await?;
        (seed, opened_ms, identity) = redis
            .hget(keys.config(), &current)
            .await
            .map_err(redis_down)?;
    }
    let existed = seed.is_some();
    let now = now_ms();
    // Fans in line hold places under the event's way of naming them; under
    // another one the same person would be another fan (a second place, a
    // second per-fan limit), and a PUT that leaves `identity` out must not
    // turn an account sale into a declared one by default.
    let identity = identity.as_deref().and_then(Identity::parse);
    if identity.is_some_and(|current| current != config.identity) {
        let in_line: u64 = redis.zcard(keys.queue()).await.map_err(redis_down)?;
        if opened_ms.is_some_and(|at| at <= now) || in_line > 0 {
            let current = identity.unwrap_or_default().as_str();
            return Err(Problem::new(
                StatusCode::CONFLICT,
                "identity-fixed",
                format!(
                    "this event names its fans by `{current}` and has fans in line or has opened; \
                     send \"identity\": \"{current}\" (a PUT replaces every setting), or create a new event"
                ),
            ));
        }
    }
    // Once the event has opened its seed is public: a new opening in the
    // future would let fans who join its prequeue pick ids that land first.
    if opened_ms.is_some_and(|at| at <= now) && config.opens_at_ms > now {
        return Err(Problem::new(
            StatusCode::CONFLICT,
            "seed-published",
            "this event has opened and its shuffle seed is public; a new opens_at in the \
             future would let new prequeue fans choose their place: create a new event instead",
        ));
    }
    // Inventory first: Postgres is the truth, and it refuses a capacity below what is sold.
    let url = format!(
        "{}/internal/events/{event_id}",
        state.config.order_service_url
    );
    let body = serde_json::json!({ "name": config.name, "capacity": config.capacity, "price_cents": config.price_cents });
    let response = state
        .http
        .put(url)
        .json(&body)
        .send()
        .await
        .map_err(|error| {
            tracing::error!(%error, "order service unreachable");
            Problem::unavailable(
                "upstream-unavailable",
                "the order service is unavailable",
                2,
            )
        })?;
    if !response.status().is_success() {
        let status = response.status();
        let problem: Problem = response
            .json()
            .await
            .unwrap_or_else(|_| Problem::internal());
        tracing::warn!(%status, %problem, "order service refused the event");
        return Err(problem);
    }
    if let Some(seed) = seed.filter(|s| !s.is_empty()) {
        config.shuffle_seed = seed;
    }
    // PostgreSQL keeps the settings too, so they survive the loss of Redis.
    let fields: HashMap<String, String> = config
        .to_fields()
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
    restore::persist(&state, &event_id, &fields).await?;
    let mut pipe = redis::pipe();
    pipe.atomic()
        .del(keys.config())
        .hset_multiple(keys.config(), &config.to_fields())
        .sadd(events_key(&state.config.redis_prefix), &event_id);
    pipe.query_async::<()>(&mut redis)
        .await
        .map_err(redis_down)?;
    let view = view(&state, &event_id).await?;
    let status = if existed {
        StatusCode::OK
    } else {
        StatusCode::CREATED
    };
    Ok((status, axum::Json(view)).into_response())
}

/// The body of `PATCH /admin/v1/events/{id}`: any of these, but name at
/// least one of admission_rate_per_s, max_active, paused, state, adaptive,
/// pow_bits (a field sent as `null` is left as it is, except `adaptive`).
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EventPatch {
    /// Greater than 0 and at most 100000.
    #[schema(exclusive_minimum = 0, maximum = 100_000)]
    pub admission_rate_per_s: Option<f64>,
    /// 1 to 1000000.
    #[schema(minimum = 1, maximum = 1_000_000)]
    pub max_active: Option<u64>,
    pub paused: Option<bool>,
    /// `open` (resume / reopen), `paused` or `closed`.
    #[schema(value_type = Option<StateChange>)]
    pub state: Option<String>,
    /// An adaptive policy to switch it on, `null` to switch it off.
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<Adaptive>)]
    pub adaptive: Option<Option<Adaptive>>,
    /// 0 to 24.
    #[schema(minimum = 0, maximum = 24)]
    pub pow_bits: Option<u8>,
}

/// The states a PATCH may put an event in (the document's view of `state`).
#[derive(utoipa::ToSchema)]
#[schema(rename_all = "snake_case")]
#[allow(dead_code)]
enum StateChange {
    Open,
    Paused,
    Closed,
}

/// Tells a field sent as `null` (Some(None)) from one left out (None).
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Option<Adaptive>>, D::Error> {
    Option::<Adaptive>::deserialize(d).map(Some)
}

/// Tunes a live event; the next admission tick applies it.
#[utoipa::path(
    patch,
    path = "/admin/v1/events/{event_id}",
    security(("admin_token" = [])),
    tag = "events",
    params(("event_id" = String, Path, description = "The event: 1-64 of A-Z a-z 0-9 - _")),
    request_body = EventPatch,
    responses(
        (status = 200, description = "The event after the change", body = EventView),
        (status = 400, description = "`bad-request`", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "`unauthorized`: no or wrong admin token", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "`unknown-event`", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "`unsupported-media-type`", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "`invalid-field`, `invalid-body`", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "`upstream-unavailable`", body = Problem, content_type = "application/problem+json"),
    )
)]
async fn patch_event(
    State(state): State<AppState>,
    Path(event_id): Path<String>,
    Json(patch): Json<EventPatch>,
) -> Result<axum::Json<EventView>, Problem> {
    check_event_id(&event_id)?;
    let keys = EventKeys::new(&state.config.redis_prefix, &event_id);
    let mut redis = state.redis.clone();
    if !redis
        .exists::<_, bool>(keys.config())
        .await
        .map_err(redis_down)?
    {
        return Err(Problem::not_found("unknown-event", "no such event"));
    }
    let mut fields: Vec<(&str, String)> = Vec::new();
    if let Some(rate) = patch.admission_rate_per_s {
        check_rate(rate)?;
        fields.push(("rate", rate.to_string()));
    }
    if let Some(max_active) = patch.max_active {
        if !(1..=1_000_000).contains(&max_active) {
            return Err(invalid("max_active", "1 to 1000000"));
        }
        fields.push(("max_active", max_active.to_string()));
    }
    if let Some(paused) = patch.paused {
        fields.push(("paused", u8::from(paused).to_string()));
    }
    match patch.state.as_deref() {
        None => {}
        Some("open") => fields.extend([("paused", "0".to_owned()), ("state", String::new())]),
        Some("paused") => fields.push(("paused", "1".to_owned())),
        Some("closed") => fields.push(("state", "closed".to_owned())),
        Some(_) => return Err(invalid("state", "one of open, paused, closed")),
    }
    if let Some(bits) = patch.pow_bits {
        check_pow(bits)?;
        fields.push(("pow_bits", bits.to_string()));
    }
    match patch.adaptive {
        None => {}
        Some(None) => fields.push(("adaptive", String::new())),
        Some(Some(policy)) => {
            check_adaptive(&policy)?;
            fields.push((
                "adaptive",
                serde_json::to_string(&policy).expect("plain struct"),
            ));
        }
    }
    if fields.is_empty() {
        return Err(invalid(
            "body",
            "name at least one of admission_rate_per_s, max_active, paused, state, adaptive, pow_bits",
        ));
    }
    // The whole hash as it will be, kept in PostgreSQL first.
    let mut whole: HashMap<String, String> =
        redis.hgetall(keys.config()).await.map_err(redis_down)?;
    whole.extend(fields.iter().map(|(k, v)| ((*k).to_owned(), v.clone())));
    restore::persist(&state, &event_id, &whole).await?;
    redis
        .hset_multiple::<_, _, _, ()>(keys.config(), &fields)
        .await
        .map_err(redis_down)?;
    tracing::info!(%event_id, ?fields, "event tuned");
    Ok(axum::Json(view(&state, &event_id).await?))
}

/// Settings and live stats.
#[utoipa::path(
    get,
    path = "/admin/v1/events/{event_id}",
    security(("admin_token" = [])),
    tag = "events",
    params(("event_id" = String, Path, description = "The event: 1-64 of A-Z a-z 0-9 - _")),
    responses(
        (status = 200, description = "The event", body = EventView),
        (status = 401, description = "`unauthorized`: no or wrong admin token", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "`unknown-event`", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "`invalid-field`: a malformed event id", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "`upstream-unavailable`", body = Problem, content_type = "application/problem+json"),
    )
)]
async fn get_event(
    State(state): State<AppState>,
    Path(event_id): Path<String>,
) -> Result<axum::Json<EventView>, Problem> {
    check_event_id(&event_id)?;
    Ok(axum::Json(view(&state, &event_id).await?))
}

/// Reads settings and stats from Redis and seats from the order service.
pub(crate) async fn view(state: &AppState, event_id: &str) -> Result<EventView, Problem> {
    let keys = EventKeys::new(&state.config.redis_prefix, event_id);
    let mut redis = state.redis.clone();
    let now = now_ms();
    #[allow(clippy::type_complexity)]
    let (fields, queue_length, active, admitted_total, samples, head): (
        HashMap<String, String>,
        u64,
        u64,
        Option<u64>,
        Vec<String>,
        Vec<(String, f64)>,
    ) = redis::pipe()
        .hgetall(keys.config())
        .zcard(keys.queue())
        .zcount(keys.active(), now, "+inf")
        .hget(keys.admit(), "admitted_total")
        .lrange(keys.admits(), 0, -1)
        .zrange_withscores(keys.queue(), 0, 0)
        .query_async(&mut redis)
        .await
        .map_err(redis_down)?;
    let config = EventConfig::from_fields(&fields)
        .ok_or_else(|| Problem::not_found("unknown-event", "no such event"))?;
    let oldest_wait_s = match head.first() {
        None => 0.0,
        Some((_, score)) if *score < FIFO_BASE as f64 => {
            (now - config.prequeue_at_ms).max(0) as f64 / 1000.0
        }
        Some((_, score)) => {
            let seq = *score as u64 - FIFO_BASE;
            // The newest sample at or before the head's sequence: when the line reached it.
            let joined: Vec<String> = redis
                .zrevrangebyscore_limit(keys.joins(), seq, "-inf", 0, 1)
                .await
                .map_err(redis_down)?;
            joined
                .first()
                .and_then(|s| s.split_once(':'))
                .and_then(|(_, t)| t.parse::<i64>().ok())
                .map_or(0.0, |t| (now - t).max(0) as f64 / 1000.0)
        }
    };
    let seats = seats(state, event_id).await;
    let remaining = seats.map(|s| s.remaining);
    let ms = |t: i64| DateTime::<Utc>::from_timestamp_millis(t).unwrap_or_default();
    Ok(EventView {
        event_id: event_id.to_owned(),
        state: config.state(
            now,
            SeatView {
                remaining,
                held: seats.map_or(0, |s| s.reserved),
            },
        ),
        name: config.name,
        capacity: config.capacity,
        prequeue_at: ms(config.prequeue_at_ms),
        opens_at: ms(config.opens_at_ms),
        admission_rate_per_s: config.admission_rate_per_s,
        max_active: config.max_active,
        access_ttl_s: config.access_ttl_s,
        per_fan_limit: config.per_fan_limit,
        max_queue: config.max_queue,
        price_cents: config.price_cents,
        paused: config.paused,
        adaptive: config.adaptive,
        pow_bits: config.pow_bits,
        identity: config.identity,
        queue_length,
        active,
        admitted_total: admitted_total.unwrap_or(0),
        admit_rate_1m: rate_over(&samples),
        oldest_wait_s,
        sold: seats.map(|s| s.sold),
        remaining,
    })
}

/// Admissions per second between the newest and the oldest `time:total` sample.
pub fn rate_over(samples: &[String]) -> f64 {
    let parse = |s: &String| -> Option<(f64, f64)> {
        let (t, n) = s.split_once(':')?;
        Some((t.parse().ok()?, n.parse().ok()?))
    };
    match (
        samples.first().and_then(parse),
        samples.last().and_then(parse),
    ) {
        (Some((t1, n1)), Some((t0, n0))) if t1 > t0 => (n1 - n0) / ((t1 - t0) / 1000.0),
        _ => 0.0,
    }
}

async fn seats(state: &AppState, event_id: &str) -> Option<Seats> {
    let url = format!(
        "{}/internal/events/{event_id}",
        state.config.order_service_url
    );
    let response = state.http.get(url).send().await.ok()?;
    if !response.status().is_success() {
        return None;
    }
    response.json().await.ok()
}

/// Revokes the fan's current admission: 204, or 404 when the fan holds none.
#[utoipa::path(
    delete,
    path = "/admin/v1/events/{event_id}/admissions/{fan_id}",
    security(("admin_token" = [])),
    tag = "events",
    params(
        ("event_id" = String, Path, description = "The event"),
        ("fan_id" = String, Path, description = "The admitted fan"),
    ),
    responses(
        (status = 204, description = "Revoked: the fan's access token stops working"),
        (status = 401, description = "`unauthorized`: no or wrong admin token", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "`not-admitted`", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "`invalid-field`", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "`upstream-unavailable`", body = Problem, content_type = "application/problem+json"),
    )
)]
async fn revoke(
    State(state): State<AppState>,
    Path((event_id, fan_id)): Path<(String, String)>,
) -> Result<StatusCode, Problem> {
    check_event_id(&event_id)?;
    let keys = EventKeys::new(&state.config.redis_prefix, &event_id);
    let mut redis = state.redis.clone();
    let expiry: Option<f64> = redis
        .zscore(keys.active(), &fan_id)
        .await
        .map_err(redis_down)?;
    let Some(expiry) = expiry.map(|e| e as i64) else {
        return Err(Problem::not_found(
            "not-admitted",
            "this fan holds no admission",
        ));
    };
    let jti = boxoffice_contract::token::admission_jti(&event_id, &fan_id, expiry);
    // Long enough to outlive the token it revokes.
    let ttl = ((expiry - now_ms()) / 1000).max(1) + 60;
    let revoked: i32 = redis::Script::new(include_str!("revoke.lua"))
        .key(keys.active())
        .key(keys.jti(&jti))
        .arg(&fan_id)
        .arg(expiry)
        .arg(ttl)
        .invoke_async(&mut redis)
        .await
        .map_err(redis_down)?;
    if revoked == 0 {
        return Err(Problem::not_found(
            "not-admitted",
            "this fan holds no admission",
        ));
    }
    tracing::info!(%event_id, %fan_id, "admission revoked");
    Ok(StatusCode::NO_CONTENT)
}

/// `GET /admin/v1/capacity?arrival_rate=…&service_time_ms=…[&utilization=0.7]
/// [&per_partition_rate=1000][&per_consumer_rate=…][&spike_rate=…&spike_s=…]`
/// Little's law: workers and partitions for a load, the backlog of a spike
/// and how long it takes to drain.
#[utoipa::path(
    get,
    path = "/admin/v1/capacity",
    security(("admin_token" = [])),
    tag = "capacity",
    params(boxoffice_contract::capacity::Demand),
    responses(
        (status = 200, description = "The plan", body = Plan),
        (status = 400, description = "`bad-request`: a missing or non-numeric parameter", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "`unauthorized`: no or wrong admin token", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "`invalid-field`", body = Problem, content_type = "application/problem+json"),
    )
)]
async fn capacity(
    query: Result<Query<Demand>, QueryRejection>,
) -> Result<axum::Json<Plan>, Problem> {
    let Query(demand) = query.map_err(|e| Problem::bad_request(e.body_text()))?;
    capacity::plan(&demand)
        .map(axum::Json)
        .map_err(|e| invalid(e.field, e.rule))
}

/// Ready when Redis answers.
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
    let mut redis = state.redis.clone();
    match redis::cmd("PING").query_async::<String>(&mut redis).await {
        Ok(_) => "ready".into_response(),
        Err(_) => Problem::unavailable("not-ready", "redis is unreachable", 1).into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> EventSpec {
        serde_json::from_value(serde_json::json!({
            "name": "Rock", "capacity": 100, "opens_at": "2026-01-01T10:00:00Z", "admission_rate_per_s": 10.0
        }))
        .unwrap()
    }

    #[test]
    fn defaults_fill_the_optional_fields() {
        let config = spec().validate().unwrap();
        assert_eq!(config.prequeue_at_ms, config.opens_at_ms);
        assert_eq!(config.per_fan_limit, 4);
    }

    #[test]
    fn out_of_range_values_name_their_field() {
        let mut bad = spec();
        bad.admission_rate_per_s = -1.0;
        assert!(bad
            .validate()
            .unwrap_err()
            .detail
            .starts_with("admission_rate_per_s"));
        let mut bad = spec();
        bad.prequeue_at = Some("2026-01-02T00:00:00Z".parse().unwrap());
        assert!(bad
            .validate()
            .unwrap_err()
            .detail
            .starts_with("prequeue_at"));
        let mut bad = spec();
        bad.per_fan_limit = 0;
        assert_eq!(bad.validate().unwrap_err().status, 422);
    }

    #[test]
    fn the_admission_rate_comes_from_the_oldest_and_newest_samples() {
        let samples: Vec<String> = ["61000:130", "31000:70", "1000:10"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert!((rate_over(&samples) - 2.0).abs() < 1e-9);
        assert_eq!(rate_over(&samples[..1]), 0.0);
        assert_eq!(rate_over(&[]), 0.0);
    }
}
