//! The waiting room: `POST /v1/events/{id}/queue` and `GET …/queue/status`.
//!
//! Each is one Redis round trip (the join a Lua script, the status two native
//! reads; an admitted fan's status a second, for its token's id) plus token
//! work in memory, with the event's settings from the [`crate::cache`]; they
//! never touch Postgres, so the line holds however long it grows.

use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use boxoffice_contract::auth::Authorization;
use boxoffice_contract::event::{now_ms, prequeue_score, Identity};
use boxoffice_contract::extract::{Json, Path};
use boxoffice_contract::header_number::header_number;
use boxoffice_contract::keys::{valid_event_id, EventKeys};
use boxoffice_contract::token::{admission_jti_of, now_s, Claims, TokenUse};
use boxoffice_contract::Problem;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::cache::EdgeEvent;
use crate::events::unknown_event;
use crate::joins::{Join, Outcome};
use crate::{pow, redis_down, AppState};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(join))
        .routes(routes!(status))
        .routes(routes!(challenge))
}

/// Whether a fan id is acceptable: 1-64 of `[A-Za-z0-9._@+-]`.
pub fn valid_fan_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 64
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._@+-".contains(&b))
}

/// Seconds until a waiting fan should poll again: about a quarter of the ETA,
/// between 1 s near the front and 30 s far back (or while paused), then ±20 %
/// jitter so fans who joined together do not poll together (24-36 s far
/// back). `jitter` is in [0, 1). The jitter comes after the bounds: clamped
/// after it, half the far-back fans got exactly 30 s, and an opening's burst
/// of joins came back as a burst of polls every 30 s.
pub fn poll_after(eta_seconds: Option<u64>, jitter: f64) -> u64 {
    let base = eta_seconds.map_or(30.0, |eta| (eta as f64 / 4.0).clamp(1.0, 30.0));
    (base * (0.8 + 0.4 * jitter)).round().max(1.0) as u64
}

fn eta_seconds(position: i64, rate: f64) -> Option<u64> {
    (rate > 0.0).then(|| (position as f64 / rate).ceil() as u64)
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
pub struct JoinRequest {
    /// `declared` events only (and required there): 1-64 of `[A-Za-z0-9._@+-]`.
    #[serde(default)]
    #[schema(pattern = "^[A-Za-z0-9._@+-]{1,64}$")]
    pub fan_id: Option<String>,
    /// `account` events only (and required there): the identity token the
    /// ticketing site's login issued (a JWT; its `sub` is the fan).
    #[serde(default)]
    pub identity_token: Option<String>,
    /// Required when the event asks for proof of work.
    #[serde(default)]
    pub pow: Option<pow::Solution>,
}

fn invalid_fan_id() -> Problem {
    Problem::new(
        StatusCode::UNPROCESSABLE_ENTITY,
        "invalid-fan-id",
        "fan_id must be 1-64 characters of A-Z, a-z, 0-9 and . _ @ + -",
    )
}

fn not_accepted(what: &str) -> Problem {
    Problem::new(
        StatusCode::UNPROCESSABLE_ENTITY,
        "fan-id-not-accepted",
        format!("this event names its fans itself: send no fan_id ({what})"),
    )
}

/// Who joins: per the event's identity mode (see [`Identity`]).
fn fan_of(
    state: &AppState,
    event_id: &str,
    identity: Identity,
    request: &JoinRequest,
    authorization: &Authorization,
) -> Result<String, Problem> {
    match identity {
        Identity::Declared => match &request.fan_id {
            Some(id) if valid_fan_id(id) => Ok(id.clone()),
            _ => Err(invalid_fan_id()),
        },
        Identity::Anonymous => {
            if request.fan_id.is_some() {
                return Err(not_accepted(
                    "to keep your place, join again with your queue ticket as Authorization: Bearer",
                ));
            }
            match authorization.bearer() {
                // A repeat join: the place belongs to whoever holds its ticket.
                Some(ticket) => state
                    .keys
                    .queue_ticket_fan(ticket, event_id)
                    .map_err(|error| {
                        tracing::debug!(%error, "queue ticket refused on a join");
                        Problem::unauthorized("invalid-ticket", "invalid queue ticket")
                    }),
                None => Ok(format!("anon-{}", uuid::Uuid::new_v4().simple())),
            }
        }
        Identity::Account => {
            if request.fan_id.is_some() {
                return Err(not_accepted("it comes from your identity_token"));
            }
            let Some(token) = &request.identity_token else {
                return Err(Problem::unauthorized(
                    "identity-required",
                    "this event wants the identity token of your ticketing-site login as identity_token",
                ));
            };
            let Some(provider) = state.identity.get() else {
                tracing::error!(
                    event_id,
                    "an account event, but no identity JWKS in hand (BOXOFFICE_IDENTITY_JWKS unset, or not read yet)"
                );
                return Err(Problem::unavailable(
                    "identity-unavailable",
                    "sign-in cannot be checked right now",
                    30,
                ));
            };
            provider
                .verify(token)
                .map_err(|_| Problem::unauthorized("invalid-identity", "invalid identity token"))
        }
    }
}

#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Challenge {
    pub challenge: String,
    /// 0 when the event asks no proof of work.
    pub difficulty_bits: u8,
    pub expires_at: DateTime<Utc>,
    pub algorithm: String,
}

/// `GET /v1/events/{id}/challenge`: a proof-of-work challenge for joining.
#[utoipa::path(
    get,
    path = "/v1/events/{event_id}/challenge",
    tag = "queue",
    params(("event_id" = String, Path, description = "The event")),
    responses(
        (status = 200, description = "A challenge; `difficulty_bits` 0 when the event asks no work", body = Challenge),
        (status = 404, description = "`unknown-event`", body = Problem, content_type = "application/problem+json"),
    )
)]
async fn challenge(
    State(state): State<AppState>,
    Path(event_id): Path<String>,
) -> Result<axum::Json<Challenge>, Problem> {
    let keys = event_keys(&state, &event_id)?;
    let event = edge_event(&state, &keys, &event_id).await?;
    let now = now_s();
    Ok(axum::Json(Challenge {
        challenge: pow::challenge(&state.keys, &event_id, now),
        difficulty_bits: event.config.pow_bits,
        expires_at: DateTime::<Utc>::from_timestamp((now + pow::CHALLENGE_TTL_S) as i64, 0).unwrap_or_default(),
        algorithm: "find nonce: SHA-256(challenge + \":\" + fan_id + \":\" + nonce) starts with difficulty_bits zero bits".into(),
    }))
}

#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Joined {
    pub fan_id: String,
    pub state: String,
    pub position: i64,
    pub eta_seconds: Option<u64>,
    pub queue_ticket: String,
}

fn event_keys(state: &AppState, event_id: &str) -> Result<EventKeys, Problem> {
    if valid_event_id(event_id) {
        Ok(EventKeys::new(&state.config.redis_prefix, event_id))
    } else {
        Err(unknown_event())
    }
}

/// The event as the edge sees it (settings cached for one tick); 404 if none.
async fn edge_event(
    state: &AppState,
    keys: &EventKeys,
    event_id: &str,
) -> Result<Arc<EdgeEvent>, Problem> {
    state
        .events
        .get(&state.redis, keys, event_id)
        .await
        .map_err(redis_down)?
        .ok_or_else(unknown_event)
}

fn sold_out() -> Problem {
    Problem::new(StatusCode::GONE, "sold-out", "every seat is sold")
}

/// A fan id was sent that no event could accept (checked before the event
/// is read; whether the event takes a fan id at all is checked after).
fn malformed_fan_id(request: &JoinRequest) -> bool {
    request
        .fan_id
        .as_deref()
        .is_some_and(|id| !valid_fan_id(id))
}

/// Joins the line (idempotent per fan: a repeat join keeps the place). Who
/// the fan is follows the event's `identity`: the `fan_id` sent
/// (`declared`), the queue ticket sent as `Authorization: Bearer` on a
/// repeat join, or a new fan on a first one (`anonymous`), or the
/// `identity_token`'s `sub` (`account`).
#[utoipa::path(
    post,
    path = "/v1/events/{event_id}/queue",
    tag = "queue",
    params(("event_id" = String, Path, description = "The event")),
    request_body = JoinRequest,
    responses(
        (status = 201, description = "In line; poll the status after `Retry-After` seconds", body = Joined),
        (status = 200, description = "Already in line: the same place", body = Joined),
        (status = 400, description = "`bad-request`", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "`unknown-event`", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "`not-open` (with `Retry-After`)", body = Problem, content_type = "application/problem+json"),
        (status = 410, description = "`sold-out`, `closed`", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "`unsupported-media-type`", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "`invalid-ticket` (anonymous: a repeat join's ticket), `identity-required`, `invalid-identity` (account)", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "`invalid-body`, `invalid-fan-id`, `fan-id-not-accepted` (anonymous and account events name their fans), `invalid-proof-of-work`", body = Problem, content_type = "application/problem+json"),
        (status = 428, description = "`proof-of-work-required`: solve `GET …/challenge` first", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "`room-full`, `rate-limited` (with `Retry-After`)", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "`overloaded`, `upstream-unavailable`, `identity-unavailable` (with `Retry-After`)", body = Problem, content_type = "application/problem+json"),
    )
)]
async fn join(
    State(state): State<AppState>,
    Path(event_id): Path<String>,
    authorization: Authorization,
    Json(request): Json<JoinRequest>,
) -> Result<Response, Problem> {
    let keys = event_keys(&state, &event_id)?;
    // A malformed fan id is refused before any Redis work.
    if malformed_fan_id(&request) {
        return Err(invalid_fan_id());
    }
    let event = edge_event(&state, &keys, &event_id).await?;
    let config = &event.config;
    let fan_id = fan_of(&state, &event_id, config.identity, &request, &authorization)?;
    state.per_fan.check(&event_id, &fan_id)?;
    let now = now_ms();
    if config.closed {
        return Err(Problem::new(
            StatusCode::GONE,
            "closed",
            "the sale is closed",
        ));
    }
    if event.sold_out() {
        return Err(sold_out());
    }
    // Before the line opens nothing is checked or spent (a challenge included).
    if now < config.prequeue_at_ms {
        let wait_s = ((config.prequeue_at_ms - now) as u64).div_ceil(1000);
        return Err(Problem::new(
            StatusCode::CONFLICT,
            "not-open",
            "the waiting room is not open yet",
        )
        .retry_after(wait_s));
    }
    // A repeat anonymous join (with its ticket) already paid for its place.
    let repeat_anonymous =
        config.identity == Identity::Anonymous && authorization.bearer().is_some();
    if config.pow_bits > 0 && !repeat_anonymous {
        let Some(solution) = &request.pow else {
            return Err(Problem::new(
                StatusCode::PRECONDITION_REQUIRED,
                "proof-of-work-required",
                "this event asks for proof of work: GET /v1/events/{id}/challenge, solve it, send it as \"pow\"",
            ));
        };
        let invalid = |detail: String| {
            Problem::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid-proof-of-work",
                detail,
            )
        };
        // A declared fan's work is bound to its id. Where the gateway names
        // the fan, the client cannot know the id beforehand: the work is
        // bound to the empty id, and each challenge is good for one join.
        let declared = config.identity == Identity::Declared;
        let bound_to = if declared { fan_id.as_str() } else { "" };
        pow::check(
            &state.keys,
            &event_id,
            bound_to,
            solution,
            config.pow_bits,
            now_s(),
        )
        .map_err(|e| invalid(e.to_string()))?;
        if !declared {
            let mut redis = state.redis.clone();
            let fresh = redis::cmd("SET")
                .arg(keys.pow_used(&solution.challenge))
                .arg(1)
                .arg("NX")
                .arg("EX")
                .arg(pow::CHALLENGE_TTL_S + 10)
                .query_async::<Option<String>>(&mut redis)
                .await
                .map_err(redis_down)?
                .is_some();
            if !fresh {
                return Err(invalid(
                    "this challenge was already used: get a new one".into(),
                ));
            }
        }
    }
    let prequeue_score = if now < config.opens_at_ms {
        prequeue_score(&config.shuffle_seed, &fan_id).to_string()
    } else {
        String::new()
    };
    let sample = prequeue_score.is_empty() && state.events.take_sample(&event_id, now);
    let outcome = state
        .joins
        .join(Join {
            keys,
            fan_id: fan_id.clone(),
            now_ms: now,
            max_queue: config.max_queue,
            prequeue_score,
            sample,
        })
        .await
        .map_err(redis_down)?;
    let (status, position) = match outcome {
        Outcome::Waiting {
            position,
            repeat: false,
        } => (StatusCode::CREATED, position),
        Outcome::Waiting {
            position,
            repeat: true,
        } => (StatusCode::OK, position),
        Outcome::Admitted { .. } => (StatusCode::OK, 0),
        Outcome::RoomFull => {
            return Err(Problem::new(
                StatusCode::TOO_MANY_REQUESTS,
                "room-full",
                "the waiting room is full",
            )
            .retry_after(30))
        }
    };
    let ticket = Claims::new(
        state.keys.issuer(),
        &event_id,
        &fan_id,
        TokenUse::Queue,
        now_s(),
        state.config.queue_ticket_ttl_s,
    );
    let eta = if position == 0 {
        Some(0)
    } else {
        eta_seconds(position, event.rate())
    };
    let body = Joined {
        fan_id,
        state: if position == 0 { "admitted" } else { "waiting" }.to_owned(),
        position,
        eta_seconds: eta,
        queue_ticket: state.keys.sign(&ticket),
    };
    let retry = if position == 0 {
        1
    } else {
        poll_after(eta, rand::random())
    };
    Ok(json_response(status, body.to_json(), retry))
}

/// A JSON answer with its `Retry-After`, built in place: a body's own
/// `IntoResponse` would set a content type for this one to replace (the
/// join's answer and a waiting fan's, on every request of the crowd). Its
/// length is set here from [`header_number`]'s table, so that axum, which
/// sets it for an answer without one, does not allocate a value for it.
fn json_response(status: StatusCode, json: Vec<u8>, retry_after_s: u64) -> Response {
    let length = header_number(json.len() as u64);
    let mut response = Response::new(axum::body::Body::from(json));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    headers.insert(header::CONTENT_LENGTH, length);
    headers.insert(header::RETRY_AFTER, header_number(retry_after_s));
    response
}

impl Joined {
    /// The answer's JSON, byte for byte as `serde_json` writes it, with the
    /// queue ticket copied rather than escaped: `serde_json` looks at a
    /// string's bytes one at a time to escape them (about 4,500 instructions
    /// for a ticket), and a ticket, base64url parts joined by dots, holds
    /// nothing JSON escapes. Checked here all the same (a pass that
    /// vectorises), else written by `serde_json`.
    fn to_json(&self) -> Vec<u8> {
        if !boxoffice_contract::token::is_plain_json_string(&self.queue_ticket) {
            return serde_json::to_vec(self).expect("a Joined serialises");
        }
        let mut json = Vec::with_capacity(96 + self.fan_id.len() + self.queue_ticket.len());
        json.extend_from_slice(b"{\"fan_id\":");
        member(&mut json, &self.fan_id);
        json.extend_from_slice(b",\"state\":");
        member(&mut json, &self.state);
        json.extend_from_slice(b",\"position\":");
        member(&mut json, &self.position);
        json.extend_from_slice(b",\"eta_seconds\":");
        member(&mut json, &self.eta_seconds);
        json.extend_from_slice(b",\"queue_ticket\":\"");
        json.extend_from_slice(self.queue_ticket.as_bytes());
        json.extend_from_slice(b"\"}");
        json
    }
}

/// Appends `value` as `serde_json` writes it.
fn member(json: &mut Vec<u8>, value: &impl Serialize) {
    serde_json::to_writer(json, value).expect("strings and numbers serialise");
}

#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum QueueStatus {
    Waiting {
        position: i64,
        /// `null` while nobody is admitted (paused, or every seat held).
        eta_seconds: Option<u64>,
        /// Present (`true`) while no seat is free but some are held by fans
        /// still paying: a declined card or a lapsed hold gives them back,
        /// so keep your place.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        all_seats_held: bool,
    },
    Admitted {
        access_token: String,
        expires_at: DateTime<Utc>,
    },
}

impl QueueStatus {
    /// A waiting fan's answer, byte for byte as `serde_json` writes
    /// [`QueueStatus::Waiting`]: the crowd's every poll, written without
    /// `serde`'s walk through the enum (with the response built in place,
    /// about 800 instructions of a poll's 63,000).
    fn waiting_json(position: i64, eta_seconds: Option<u64>, all_seats_held: bool) -> Vec<u8> {
        let mut json = Vec::with_capacity(96);
        json.extend_from_slice(br#"{"state":"waiting","position":"#);
        json.extend_from_slice(itoa::Buffer::new().format(position).as_bytes());
        json.extend_from_slice(br#","eta_seconds":"#);
        match eta_seconds {
            Some(eta) => json.extend_from_slice(itoa::Buffer::new().format(eta).as_bytes()),
            None => json.extend_from_slice(b"null"),
        }
        if all_seats_held {
            json.extend_from_slice(br#","all_seats_held":true"#);
        }
        json.push(b'}');
        json
    }
}

/// The fan's place, or the access token once admitted. `Retry-After` says
/// when to ask again (sooner near the front).
#[utoipa::path(
    get,
    path = "/v1/events/{event_id}/queue/status",
    tag = "queue",
    params(("event_id" = String, Path, description = "The event")),
    security(("queue_ticket" = [])),
    responses(
        (status = 200, description = "`waiting` with position and ETA, or `admitted` with the access token", body = QueueStatus),
        (status = 401, description = "`invalid-ticket`", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "`unknown-event`", body = Problem, content_type = "application/problem+json"),
        (status = 410, description = "`sold-out`, `expired`", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "`rate-limited`", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "`overloaded`, `upstream-unavailable`", body = Problem, content_type = "application/problem+json"),
    )
)]
async fn status(
    State(state): State<AppState>,
    Path(event_id): Path<String>,
    authorization: Authorization,
) -> Result<Response, Problem> {
    let keys = event_keys(&state, &event_id)?;
    let ticket = authorization.bearer().ok_or_else(|| {
        Problem::unauthorized(
            "invalid-ticket",
            "send Authorization: Bearer <queue_ticket>",
        )
    })?;
    let fan = state
        .keys
        .queue_ticket_fan(ticket, &event_id)
        .map_err(|error| {
            tracing::debug!(%error, "queue ticket refused");
            Problem::unauthorized("invalid-ticket", "invalid queue ticket")
        })?;
    state.per_fan.check(&event_id, &fan)?;
    let event = edge_event(&state, &keys, &event_id).await?;
    if event.sold_out() {
        return Err(sold_out());
    }
    // A waiting fan (the crowd) costs one native read, no script since
    // nothing is written: its rank.
    let mut redis = state.redis.clone();
    // Sized once, so the key written in place does not grow it piece by piece.
    let rank: Option<i64> = redis::Cmd::with_capacity(3, 128 + fan.len())
        .arg("ZRANK")
        .arg(keys.queue_arg())
        .arg(&fan)
        .query_async(&mut redis)
        .await
        .map_err(redis_down)?;
    let now = now_ms();
    // Out of line: admitted, or lapsed. The admission's expiry and, once a
    // `seats-held` answer renewed it, its held-over key name the access
    // token: both read in one MULTI, so a renewal between them cannot pair
    // an expiry with the wrong jti. Admission moves a fan from the line to
    // the admitted set in one script, so a fan out of line here is in that
    // set until its admission lapses or is spent.
    let (expiry, held_over): (Option<f64>, Option<String>) = match rank {
        Some(_) => (None, None),
        None => redis::pipe()
            .atomic()
            .zscore(keys.active(), &fan)
            .get(keys.held_over(&fan))
            .query_async(&mut redis)
            .await
            .map_err(redis_down)?,
    };
    match (rank, expiry) {
        (Some(rank), _) => {
            let eta = eta_seconds(rank + 1, event.rate());
            let retry = poll_after(eta, rand::random());
            let body = QueueStatus::waiting_json(rank + 1, eta, event.seats.all_held());
            Ok(json_response(StatusCode::OK, body, retry))
        }
        (None, Some(expiry)) if expiry as i64 > now => {
            let expiry = expiry as i64;
            let mut access = Claims::new(
                state.keys.issuer(),
                &event_id,
                &fan,
                TokenUse::Access,
                now_s(),
                0,
            );
            access.exp = (expiry / 1000) as u64;
            // A renewed admission keeps its first jti: it buys once.
            access.jti = admission_jti_of(&event_id, &fan, expiry, held_over.as_deref());
            let body = QueueStatus::Admitted {
                access_token: state.keys.sign(&access),
                expires_at: DateTime::<Utc>::from_timestamp_millis(expiry).unwrap_or_default(),
            };
            Ok(axum::Json(body).into_response())
        }
        _ => Err(Problem::new(
            StatusCode::GONE,
            "expired",
            "your admission lapsed or was used; join again",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The join's answer written by hand is what `serde_json` writes, for
    /// a real ticket and for a "ticket" JSON would escape.
    #[test]
    fn the_joins_answer_is_the_json_serde_writes() {
        use boxoffice_contract::token::{generate_ed25519_pem, KeySet};
        let secret = b"0123456789abcdef0123456789abcdef";
        let keys = KeySet::from_pems("bo", &generate_ed25519_pem(), &[], secret).unwrap();
        let claims = Claims::new("bo", "ev", "fan-1", TokenUse::Queue, now_s(), 60);
        let ticket = keys.sign(&claims);
        for (fan_id, eta_seconds, queue_ticket) in [
            ("fan-1", Some(12), ticket.clone()),
            ("fan-1", None, ticket.clone()),
            ("quote\" back\\ é 🎟 \u{7}", Some(0), ticket),
            ("fan-2", Some(u64::MAX), "a\"b\\c\nd".to_owned()),
        ] {
            let joined = Joined {
                fan_id: fan_id.to_owned(),
                state: "waiting".into(),
                position: -1,
                eta_seconds,
                queue_ticket,
            };
            assert_eq!(
                String::from_utf8(joined.to_json()).unwrap(),
                serde_json::to_string(&joined).unwrap()
            );
        }
    }

    /// The crowd's answers carry their length and `Retry-After`, set where
    /// they are built (from the table of small numbers) rather than left
    /// for axum to allocate.
    #[test]
    fn a_json_answer_carries_its_length_and_retry_after() {
        for (json, retry) in [(&b"{}"[..], 1), (&[b' '; 2000][..], 30), (&b""[..], 0)] {
            let response = json_response(StatusCode::CREATED, json.to_vec(), retry);
            assert_eq!(response.status(), StatusCode::CREATED);
            let headers = response.headers();
            assert_eq!(headers[header::CONTENT_LENGTH], json.len().to_string());
            assert_eq!(headers[header::RETRY_AFTER], retry.to_string());
            assert_eq!(headers[header::CONTENT_TYPE], "application/json");
        }
    }

    /// A waiting fan's answer written by hand is what `serde_json` writes.
    #[test]
    fn the_waiting_answer_is_the_json_serde_writes() {
        for position in [1, 42, i64::MAX, -1] {
            for eta_seconds in [None, Some(0), Some(90), Some(u64::MAX)] {
                for all_seats_held in [false, true] {
                    let waiting = QueueStatus::Waiting {
                        position,
                        eta_seconds,
                        all_seats_held,
                    };
                    assert_eq!(
                        String::from_utf8(QueueStatus::waiting_json(
                            position,
                            eta_seconds,
                            all_seats_held
                        ))
                        .unwrap(),
                        serde_json::to_string(&waiting).unwrap()
                    );
                }
            }
        }
    }

    #[test]
    fn poll_interval_grows_with_the_eta_within_bounds() {
        assert_eq!(poll_after(Some(0), 0.5), 1);
        assert_eq!(poll_after(Some(40), 0.5), 10);
        assert_eq!(poll_after(Some(1_000_000), 0.0), 24);
        assert_eq!(poll_after(Some(1_000_000), 0.99), 36);
        assert_eq!(poll_after(None, 0.5), 30);
        for jitter in [0.0, 0.3, 0.999] {
            let s = poll_after(Some(60), jitter);
            assert!((12..=18).contains(&s), "{s}");
        }
    }

    /// Fans who joined together, far back in line, spread their next polls
    /// over 24-36 s: no interval takes much more than its share (a
    /// thirteenth), so a burst of joins does not come back as a burst of
    /// polls.
    #[test]
    fn far_back_polls_spread_over_the_jitter() {
        let mut counts = [0u32; 37];
        let draws = 10_000;
        for i in 0..draws {
            counts[poll_after(Some(3_600), (f64::from(i) + 0.5) / f64::from(draws)) as usize] += 1;
        }
        let most = *counts.iter().max().unwrap();
        assert!(
            f64::from(most) < 0.1 * f64::from(draws),
            "one interval takes {most} of {draws}: {counts:?}"
        );
        assert_eq!(counts[..24].iter().sum::<u32>(), 0, "{counts:?}");
    }

    /// Polls per second from a line of `fans` at `rate`, each polling when
    /// its Retry-After says (jitter at its mean).
    fn poll_load(fans: i64, rate: f64) -> f64 {
        (1..=fans)
            .map(|p| 1.0 / poll_after(eta_seconds(p, rate), 0.5) as f64)
            .sum()
    }

    #[test]
    fn poll_load_stays_bounded_however_long_the_line() {
        // Bound: N/30 for the far back, plus about 18 × rate for the front.
        for (fans, rate) in [
            (1_000_000, 100.0),
            (1_000_000, 1_000.0),
            (2_000_000, 50.0),
            (1_000, 10.0),
        ] {
            let load = poll_load(fans, rate);
            let bound = fans as f64 / 30.0 + 18.0 * rate;
            println!("{fans} fans at {rate}/s: {load:.0} polls/s (bound {bound:.0})");
            assert!(load <= bound, "{load} > {bound}");
        }
        // A fixed 20 s poll, for comparison, is N/20: 50,000/s for a million fans.
        assert!(poll_load(1_000_000, 100.0) < 1_000_000.0 / 20.0 * 0.75);
    }

    #[test]
    fn eta_is_position_over_rate() {
        assert_eq!(eta_seconds(100, 20.0), Some(5));
        assert_eq!(eta_seconds(1, 20.0), Some(1));
        assert_eq!(eta_seconds(5, 0.0), None);
    }

    #[test]
    fn fan_ids_are_checked() {
        assert!(valid_fan_id("fan-1@example.com"));
        for bad in ["", "a b", "<script>", &"x".repeat(65)] {
            assert!(!valid_fan_id(bad), "{bad}");
        }
    }
}
