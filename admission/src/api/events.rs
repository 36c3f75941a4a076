//! The events resource: create or replace (`PUT`), tune (`PATCH`), show
//! (`GET`) one event, and list them all; with the bodies these take and the
//! rules of their fields.

use boxoffice_contract::trace::{TraceContext, TRACEPARENT};
use std::collections::HashMap;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use boxoffice_contract::event::{now_ms, Adaptive, EventConfig, EventState, Identity};
use boxoffice_contract::extract::{Json, Path};
use boxoffice_contract::keys::{events_key, EventKeys};
use boxoffice_contract::redis_link::RedisLink;
use boxoffice_contract::Problem;
use chrono::{DateTime, Utc};
use redis::AsyncCommands;
use serde::{Deserialize, Serialize};

use super::problem::{check_event_id, invalid, redis_down};
use super::view::{view, EventView};
use crate::restore;
use crate::state::AppState;

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
    /// Optional: who a fan is. `anonymous` (the default: the gateway names
    /// each fan in its signed queue ticket), `account` (an identity token
    /// from the site's login) or `declared` (the id the client sends: load
    /// tests, trusted kiosks).
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

/// One admin write (PUT or PATCH) of an event at a time, across admission
/// replicas. Each reads what the event is, keeps the whole of its settings
/// in PostgreSQL (what a Redis loss restores), then writes Redis; two
/// interleaved left PostgreSQL's copy without one of them. The lock lapses
/// after [`WriteLock::HELD_MS`] if its holder dies, and only its holder
/// releases it.
struct WriteLock {
    redis: RedisLink,
    key: String,
    token: String,
}

impl WriteLock {
    /// Longer than a write takes: two calls to the order service (5 s
    /// timeout each) and a few Redis commands.
    const HELD_MS: u64 = 15_000;
    /// How long a write waits for the one before it.
    const WAIT: std::time::Duration = std::time::Duration::from_secs(10);

    async fn take(state: &AppState, event_id: &str) -> Result<Self, Problem> {
        let mut redis = state.redis.clone();
        let key = EventKeys::new(&state.config.redis_prefix, event_id).write_lock();
        let token = uuid::Uuid::new_v4().simple().to_string();
        let deadline = std::time::Instant::now() + Self::WAIT;
        loop {
            let taken: Option<String> = redis::cmd("SET")
                .arg(&key)
                .arg(&token)
                .arg("NX")
                .arg("PX")
                .arg(Self::HELD_MS)
                .query_async(&mut redis)
                .await
                .map_err(redis_down)?;
            if taken.is_some() {
                return Ok(Self { redis, key, token });
            }
            if std::time::Instant::now() >= deadline {
                return Err(Problem::unavailable(
                    "event-busy",
                    "another admin write of this event is in progress; try again",
                    1,
                ));
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    }

    async fn release(mut self) {
        static RELEASE: std::sync::LazyLock<redis::Script> = std::sync::LazyLock::new(|| {
            redis::Script::new(
                "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0",
            )
        });
        if let Err(error) = RELEASE
            .key(&self.key)
            .arg(&self.token)
            .invoke_async::<i32>(&mut self.redis)
            .await
        {
            // It lapses by itself.
            tracing::warn!(%error, "could not release an event's write lock");
        }
    }
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
        (status = 503, description = "`upstream-unavailable`; `event-busy` (another admin write of this event is in progress: try again)", body = Problem, content_type = "application/problem+json"),
    )
)]
pub(super) async fn put_event(
    State(state): State<AppState>,
    trace: Option<axum::Extension<TraceContext>>,
    Path(event_id): Path<String>,
    Json(spec): Json<EventSpec>,
) -> Result<Response, Problem> {
    check_event_id(&event_id)?;
    let lock = WriteLock::take(&state, &event_id).await?;
    let put = replace_event(state, trace, event_id, spec).await;
    lock.release().await;
    put
}

async fn replace_event(
    state: AppState,
    trace: Option<axum::Extension<TraceContext>>,
    event_id: String,
    spec: EventSpec,
) -> Result<Response, Problem> {
    // The request's trace, handed to each call to the order service.
    let trace = trace.map_or_else(TraceContext::root, |t| t.0);
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
        restore::restore_event(&state, &event_id, &trace).await?;
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
    // turn an account or declared sale into an anonymous one by default.
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
        .header(TRACEPARENT, trace.to_string())
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
    restore::persist(&state, &event_id, &fields, &trace).await?;
    // The settings replace the old ones in one transaction; the set of
    // events is another hash slot (a Redis Cluster refuses one transaction
    // over both), so it is added to after. Both are idempotent: a PUT that
    // fails between them is answered 503 and repeated.
    let mut pipe = redis::pipe();
    pipe.atomic()
        .del(keys.config())
        .hset_multiple(keys.config(), &config.to_fields());
    pipe.query_async::<()>(&mut redis)
        .await
        .map_err(redis_down)?;
    redis
        .sadd::<_, _, ()>(events_key(&state.config.redis_prefix), &event_id)
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
        (status = 503, description = "`upstream-unavailable`; `event-busy` (another admin write of this event is in progress: try again)", body = Problem, content_type = "application/problem+json"),
    )
)]
pub(super) async fn patch_event(
    State(state): State<AppState>,
    trace: Option<axum::Extension<TraceContext>>,
    Path(event_id): Path<String>,
    Json(patch): Json<EventPatch>,
) -> Result<axum::Json<EventView>, Problem> {
    check_event_id(&event_id)?;
    let lock = WriteLock::take(&state, &event_id).await?;
    let patched = tune_event(state, trace, event_id, patch).await;
    lock.release().await;
    patched
}

async fn tune_event(
    state: AppState,
    trace: Option<axum::Extension<TraceContext>>,
    event_id: String,
    patch: EventPatch,
) -> Result<axum::Json<EventView>, Problem> {
    let trace = trace.map_or_else(TraceContext::root, |t| t.0);
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
    restore::persist(&state, &event_id, &whole, &trace).await?;
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
pub(super) async fn get_event(
    State(state): State<AppState>,
    Path(event_id): Path<String>,
) -> Result<axum::Json<EventView>, Problem> {
    check_event_id(&event_id)?;
    Ok(axum::Json(view(&state, &event_id).await?))
}

#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct EventSummary {
    pub event_id: String,
    pub name: String,
    pub state: EventState,
}

/// Every event, by id.
#[utoipa::path(
    get,
    path = "/admin/v1/events",
    security(("admin_token" = [])),
    tag = "events",
    responses(
        (status = 200, description = "The events", body = Vec<EventSummary>),
        (status = 401, description = "`unauthorized`: no or wrong admin token", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "`upstream-unavailable`", body = Problem, content_type = "application/problem+json"),
    )
)]
pub(super) async fn list_events(
    State(state): State<AppState>,
) -> Result<axum::Json<Vec<EventSummary>>, Problem> {
    let mut redis = state.redis.clone();
    let mut ids: Vec<String> = redis
        .smembers(events_key(&state.config.redis_prefix))
        .await
        .map_err(redis_down)?;
    ids.sort();
    let mut events = Vec::with_capacity(ids.len());
    for event_id in ids {
        if let Ok(view) = view(&state, &event_id).await {
            events.push(EventSummary {
                event_id,
                name: view.name,
                state: view.state,
            });
        }
    }
    Ok(axum::Json(events))
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
}
