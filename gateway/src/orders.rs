//! Buying and following an order.
//!
//! `POST /v1/events/{id}/orders` spends the access token (once, in Redis,
//! together with the per-fan limit and the edge sold-out check) and hands
//! the purchase to the order service, which holds the seats in Postgres.
//! `GET /v1/orders/{id}` lets the fan follow it with the order token.

use axum::extract::{Extension, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use boxoffice_contract::event::now_ms;
use boxoffice_contract::extract::{Json, Path};
use boxoffice_contract::keys::EventKeys;
use boxoffice_contract::problem::RenewedAdmission;
use boxoffice_contract::token::{now_s, Claims, KeySet, TokenError, TokenUse, LEEWAY_S};
use boxoffice_contract::trace::{TraceContext, TRACEPARENT};
use boxoffice_contract::Problem;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use uuid::Uuid;

use crate::access::{reject, AccessTokenLayer};
use crate::{bearer, redis_down, AppState};

pub fn router(keys: KeySet) -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(buy))
        .route_layer(AccessTokenLayer::new(keys))
        .routes(routes!(get_order))
        .routes(routes!(get_tickets))
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
pub struct BuyRequest {
    /// Seats, 1 to the event's `per_fan_limit` (`GET /v1/events/{id}`
    /// shows it; never more than 100), counting what the fan already bought.
    #[schema(minimum = 1, maximum = 100)]
    pub quantity: i64,
}

#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Bought {
    pub order_id: Uuid,
    pub status: String,
    pub order_token: String,
}

/// The order as the order service reports it.
#[derive(Debug, Serialize, Deserialize)]
struct UpstreamOrder {
    order_id: Uuid,
    event_id: String,
    fan_id: String,
    status: String,
    status_detail: String,
    quantity: i32,
    failure_reason: Option<String>,
    tickets_issued: i64,
}

/// The order as its fan sees it.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct OrderView {
    pub order_id: Uuid,
    pub event_id: String,
    pub status: String,
    /// The status in words, e.g. "seats held — processing payment".
    pub status_detail: String,
    pub quantity: i32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failure_reason: Option<String>,
    /// Tickets written so far; equals `quantity` once the set is issued.
    pub tickets_issued: i64,
    /// The PDF, once every ticket is issued.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tickets_url: Option<String>,
}

fn upstream_down(error: reqwest::Error) -> Problem {
    tracing::warn!(%error, "order service call failed");
    Problem::unavailable(
        "upstream-unavailable",
        "the order service is unavailable; retry with the same Idempotency-Key",
        2,
    )
}

/// An `Idempotency-Key` is up to 128 visible ASCII characters.
fn idempotency_key(headers: &HeaderMap) -> Result<String, Problem> {
    let Some(value) = headers.get("idempotency-key") else {
        return Ok(String::new());
    };
    match value.to_str() {
        Ok(key)
            if !key.is_empty() && key.len() <= 128 && key.bytes().all(|b| b.is_ascii_graphic()) =>
        {
            Ok(key.to_owned())
        }
        _ => Err(Problem::bad_request(
            "Idempotency-Key must be 1-128 visible ASCII characters",
        )),
    }
}

/// Buys seats with the access token (one purchase per admission). The order
/// is placed (seats held) at once and confirmed by the saga; follow it at
/// `Location`.
#[utoipa::path(
    post,
    path = "/v1/events/{event_id}/orders",
    tag = "orders",
    params(
        ("event_id" = String, Path, description = "The event"),
        ("Idempotency-Key" = Option<String>, Header, description = "1-128 visible ASCII characters; a retry with the same key answers the same order. Without one, the admission is the key: a retry with the same access token answers the same order"),
    ),
    request_body = BuyRequest,
    security(("access_token" = [])),
    responses(
        (status = 202, description = "Placed; `Location: /v1/orders/{order_id}`", body = Bought),
        (status = 400, description = "`bad-request`", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "`invalid-token`", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "`wrong-event`", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "`token-used`; `fan-limit-reached` (the fan's orders of this event already hold `per_fan_limit` seats, counted across admissions; failed orders aside); `seats-held` (no seat free now, some held by fans paying may come back: retry after `Retry-After`; the answer carries `admission` {`access_token`, `expires_at`}, the admission renewed for `access_ttl_s` from now with the same `jti`: retry with that token)", body = Problem, content_type = "application/problem+json"),
        (status = 410, description = "`sold-out`, `closed` (ops closed the sale)", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "`payload-too-large`", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "`unsupported-media-type`", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "`invalid-quantity`, `invalid-body`, `idempotency-key-reused` (a retry of this admission's purchase asking for another quantity)", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "`rate-limited` (with `Retry-After`)", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "`overloaded`, `upstream-unavailable` (with `Retry-After`; the admission is kept for a retry)", body = Problem, content_type = "application/problem+json"),
    )
)]
async fn buy(
    State(state): State<AppState>,
    Path(event_id): Path<String>,
    Extension(claims): Extension<Claims>,
    trace: Option<Extension<TraceContext>>,
    headers: HeaderMap,
    Json(request): Json<BuyRequest>,
) -> Result<Response, Problem> {
    state.per_fan.check(&event_id, &claims.sub)?;
    // Without a key of the fan's, the admission is the key: a retry of the
    // same admission (after a 503, say) reaches the same order.
    let idempotency_key = match idempotency_key(&headers)? {
        key if key.is_empty() => format!("admission:{}", claims.jti),
        key => key,
    };
    if request.quantity < 1 {
        return Err(invalid_quantity("quantity must be at least 1"));
    }
    let keys = EventKeys::new(&state.config.redis_prefix, &event_id);
    let ttl = claims.exp.saturating_sub(now_s()) + LEEWAY_S + 1;
    let mut redis = state.redis.clone();
    let (outcome, order): (String, String) = state
        .scripts
        .spend
        .key(keys.jti(&claims.jti))
        .key(keys.active())
        .key(keys.stock())
        .key(keys.config())
        .key(keys.held_over(&claims.sub))
        .arg(&claims.sub)
        .arg(&idempotency_key)
        .arg(Uuid::now_v7().to_string())
        .arg(ttl)
        .arg(request.quantity)
        .arg(&claims.jti)
        .arg(claims.exp)
        .arg(now_ms())
        .invoke_async(&mut redis)
        .await
        .map_err(redis_down)?;
    match outcome.as_str() {
        "fresh" | "replay" => {}
        "used" => {
            return Err(Problem::new(
                StatusCode::CONFLICT,
                "token-used",
                "this access token has already bought",
            ))
        }
        "revoked" => {
            return Err(Problem::unauthorized(
                "invalid-token",
                "this admission was revoked",
            ))
        }
        "sold-out" => {
            return Err(Problem::new(
                StatusCode::GONE,
                "sold-out",
                "every seat is sold",
            ))
        }
        "all-held" => {
            // `order` is the expiry (ms) the admission was renewed to, if
            // the token is the fan's current admission.
            let renewed = order
                .parse::<i64>()
                .ok()
                .map(|expiry| renewed_access(&state, &claims, expiry));
            return Err(seats_held(renewed));
        }
        "closed" => {
            return Err(Problem::new(
                StatusCode::GONE,
                "closed",
                "the sale is closed",
            ))
        }
        "too-many" => {
            return Err(invalid_quantity(&format!(
                "quantity must be between 1 and {order}"
            )))
        }
        other => {
            tracing::error!(
                outcome = other,
                "spend script answered something unexpected"
            );
            return Err(Problem::internal());
        }
    }
    let order_id: Uuid = order.parse().map_err(|_| Problem::internal())?;
    // The limit the spend was checked against, for PostgreSQL to hold to
    // even if it keeps no settings of the event (the cache: no extra trip).
    let per_fan_limit = state
        .events
        .get(&state.redis, &keys, &event_id)
        .await
        .ok()
        .flatten()
        .map(|event| event.config.per_fan_limit);
    // The edge's (the caller's, or one it made), else the caller's header
    // (the routes served without the edge).
    let request_id = boxoffice_contract::request_log::request_id()
        .or_else(|| {
            let id = headers.get("x-request-id")?.to_str().ok()?;
            Some(id.to_owned())
        })
        .unwrap_or_default();
    let call = state
        .upstream
        .client()
        .post(state.upstream.url("/internal/orders"))
        .header("x-request-id", request_id)
        .header(
            TRACEPARENT,
            trace.map_or_else(TraceContext::root, |t| t.0).to_string(),
        )
        .json(&serde_json::json!({
            "order_id": order_id, "event_id": event_id, "fan_id": claims.sub, "quantity": request.quantity,
            "admission_id": claims.jti, "idempotency_key": idempotency_key,
            "per_fan_limit": per_fan_limit,
        }));
    let response = state.upstream.send(call).await.map_err(|mut problem| {
        // The token is spent in Redis, but the order may not exist: the
        // admission is kept for a retry with the same key.
        problem.detail = format!(
            "{}; your admission is kept: buy again with the same access token \
             (and the same Idempotency-Key, if you sent one) after Retry-After",
            problem.detail
        );
        problem
    })?;
    if !response.status().is_success() {
        let problem = pass_on(response).await;
        if problem.slug() == "seats-held" {
            // PostgreSQL holds every seat though the edge's view said one
            // was free: the token is spent (so only this purchase can be
            // retried with it), and its admission is renewed all the same.
            return Err(hold_over_spent(&state, &keys, &claims).await);
        }
        return Err(problem);
    }
    let placed: UpstreamOrder = response.json().await.map_err(upstream_down)?;
    // PostgreSQL may answer an order of this admission placed earlier (Redis
    // forgot the spend): that order is the fan's.
    let order_id = placed.order_id;
    let mut token = Claims::new(
        state.keys.issuer(),
        &event_id,
        &claims.sub,
        TokenUse::Order,
        now_s(),
        state.config.order_token_ttl_s,
    );
    token.order_id = Some(order_id);
    let body = Bought {
        order_id,
        status: placed.status,
        order_token: state.keys.sign(&token),
    };
    let location = format!("/v1/orders/{order_id}");
    tracing::info!(%order_id, %event_id, fan_id = %claims.sub, "order placed");
    Ok((
        StatusCode::ACCEPTED,
        [(header::LOCATION, location)],
        axum::Json(body),
    )
        .into_response())
}

fn invalid_quantity(detail: &str) -> Problem {
    Problem::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid-quantity", detail)
}

/// While no seat is free but some are held, how soon a fan may try again.
const SEATS_HELD_RETRY_S: u64 = 5;

/// The 409 `seats-held`, with the admission's renewed access token when
/// there is one (`None`: the fan keeps the token it has).
fn seats_held(renewed: Option<RenewedAdmission>) -> Problem {
    let mut problem = Problem::new(
        StatusCode::CONFLICT,
        "seats-held",
        match renewed {
            Some(_) => {
                "no seat is free now, but some are held by fans still paying and may come back; \
                 your admission is kept and renewed: buy again after Retry-After with admission.access_token"
            }
            None => {
                "no seat is free now, but some are held by fans still paying and may come back; \
                 buy again after Retry-After"
            }
        },
    )
    .retry_after(SEATS_HELD_RETRY_S);
    problem.admission = renewed.map(Box::new);
    problem
}

/// An access token for the same admission as `claims` (the same `jti`, so
/// it still buys once), expiring at `expires_ms`.
fn renewed_access(state: &AppState, claims: &Claims, expires_ms: i64) -> RenewedAdmission {
    let mut access = claims.clone();
    access.iat = now_s();
    access.nbf = access.iat;
    access.exp = (expires_ms / 1000) as u64;
    RenewedAdmission {
        access_token: state.keys.sign(&access),
        expires_at: DateTime::<Utc>::from_timestamp_millis(expires_ms).unwrap_or_default(),
    }
}

/// `seats-held` from PostgreSQL after the token was spent: the admission
/// (its spent mark) is renewed for `access_ttl_s` and the fan given a token
/// for it, so retrying the same purchase outlasts the first token.
async fn hold_over_spent(state: &AppState, keys: &EventKeys, claims: &Claims) -> Problem {
    let event = state.events.get(&state.redis, keys, &claims.aud).await;
    let Some(ttl_s) = event.ok().flatten().map(|e| e.config.access_ttl_s) else {
        return seats_held(None);
    };
    let mut redis = state.redis.clone();
    let kept: Result<i32, _> = state
        .scripts
        .hold_over
        .key(keys.jti(&claims.jti))
        .arg(ttl_s + LEEWAY_S + 60)
        .invoke_async(&mut redis)
        .await;
    match kept {
        Ok(1) => {
            let expires_ms = (now_s() + ttl_s) as i64 * 1000;
            seats_held(Some(renewed_access(state, claims, expires_ms)))
        }
        Ok(_) => seats_held(None),
        Err(error) => {
            tracing::warn!(%error, "could not renew a spent admission");
            seats_held(None)
        }
    }
}

/// Relays a 4xx problem of the order service (with `Retry-After` on
/// `seats-held`); hides anything else.
async fn pass_on(response: reqwest::Response) -> Problem {
    let status = response.status();
    match response.json::<Problem>().await {
        Ok(problem) if problem.slug() == "seats-held" => problem.retry_after(SEATS_HELD_RETRY_S),
        // The order service refusing the gateway is our misconfiguration (a
        // service token that does not match), never the fan's fault: a 503,
        // so the fan retries with the same admission.
        _ if status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN => {
            tracing::error!(%status, "the order service refused the gateway's service token");
            Problem::unavailable(
                "upstream-unavailable",
                "the order service is unavailable; retry with the same Idempotency-Key",
                2,
            )
        }
        Ok(problem) if status.is_client_error() => problem,
        _ => {
            tracing::warn!(%status, "order service failed");
            Problem::unavailable(
                "upstream-unavailable",
                "the order service failed; retry with the same Idempotency-Key",
                2,
            )
        }
    }
}

fn unknown_order() -> Problem {
    Problem::not_found("unknown-order", "no such order for this token")
}

/// The order named in the path, if the bearer token may read it: its own
/// order token, or the access token that bought it.
async fn authorized_order(
    state: &AppState,
    order_id: Uuid,
    headers: &HeaderMap,
) -> Result<UpstreamOrder, Problem> {
    let token = bearer(headers).ok_or_else(|| {
        Problem::unauthorized("invalid-token", "send Authorization: Bearer <order_token>")
    })?;
    // An order token names its order; the access token that bought it names the fan and event.
    let claims = match state.keys.verify(token, TokenUse::Order, None) {
        Err(TokenError::WrongUse {
            found: TokenUse::Access,
            ..
        }) => state
            .keys
            .verify(token, TokenUse::Access, None)
            .map_err(|e| reject(&e))?,
        other => other.map_err(|e| reject(&e))?,
    };
    if claims.token_use == TokenUse::Order && claims.order_id != Some(order_id) {
        return Err(unknown_order());
    }
    let call = state
        .upstream
        .client()
        .get(state.upstream.url(&format!("/internal/orders/{order_id}")));
    let response = state.upstream.send(call).await?;
    if response.status() == StatusCode::NOT_FOUND {
        return Err(unknown_order());
    }
    if !response.status().is_success() {
        return Err(pass_on(response).await);
    }
    let order: UpstreamOrder = response.json().await.map_err(upstream_down)?;
    if order.fan_id != claims.sub || order.event_id != claims.aud {
        return Err(unknown_order());
    }
    Ok(order)
}

/// The order, its status in words and, once issued, where its tickets are.
#[utoipa::path(
    get,
    path = "/v1/orders/{order_id}",
    tag = "orders",
    params(("order_id" = uuid::Uuid, Path, description = "The order")),
    security(("order_token" = []), ("access_token" = [])),
    responses(
        (status = 200, description = "The order", body = OrderView),
        (status = 400, description = "`bad-request`", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "`invalid-token`", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "`unknown-order`", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "`upstream-unavailable`", body = Problem, content_type = "application/problem+json"),
    )
)]
async fn get_order(
    State(state): State<AppState>,
    Path(order_id): Path<Uuid>,
    headers: HeaderMap,
) -> Result<axum::Json<OrderView>, Problem> {
    let order = authorized_order(&state, order_id, &headers).await?;
    let issued = order.tickets_issued >= i64::from(order.quantity);
    Ok(axum::Json(OrderView {
        order_id: order.order_id,
        event_id: order.event_id,
        status: order.status,
        status_detail: order.status_detail,
        quantity: order.quantity,
        failure_reason: order.failure_reason,
        tickets_issued: order.tickets_issued,
        tickets_url: issued.then(|| format!("/v1/orders/{order_id}/tickets.pdf")),
    }))
}

/// `GET /v1/orders/{id}/tickets.pdf`: the order's tickets, one page a seat.
/// The order's tickets: a PDF, one page a seat with its QR code.
#[utoipa::path(
    get,
    path = "/v1/orders/{order_id}/tickets.pdf",
    tag = "orders",
    params(("order_id" = uuid::Uuid, Path, description = "The order")),
    security(("order_token" = []), ("access_token" = [])),
    responses(
        (status = 200, description = "The ticket PDF", body = Vec<u8>, content_type = "application/pdf"),
        (status = 400, description = "`bad-request`", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "`invalid-token`", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "`unknown-order`, `tickets-not-issued`", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "`upstream-unavailable`", body = Problem, content_type = "application/problem+json"),
    )
)]
async fn get_tickets(
    State(state): State<AppState>,
    Path(order_id): Path<Uuid>,
    headers: HeaderMap,
) -> Result<Response, Problem> {
    authorized_order(&state, order_id, &headers).await?;
    let call = state.upstream.client().get(
        state
            .upstream
            .url(&format!("/internal/orders/{order_id}/tickets.pdf")),
    );
    let response = state.upstream.send(call).await?;
    if response.status() == StatusCode::NOT_FOUND {
        return Err(Problem::not_found(
            "tickets-not-issued",
            "the tickets of this order are not issued yet; try again shortly",
        ));
    }
    if !response.status().is_success() {
        return Err(pass_on(response).await);
    }
    let pdf = response.bytes().await.map_err(upstream_down)?;
    Ok((
        [
            (header::CONTENT_TYPE, "application/pdf".to_owned()),
            (
                header::CONTENT_DISPOSITION,
                format!("attachment; filename=\"tickets-{order_id}.pdf\""),
            ),
        ],
        pdf,
    )
        .into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(status: u16, slug: &str) -> reqwest::Response {
        let body = serde_json::to_vec(&Problem::new(
            StatusCode::from_u16(status).unwrap(),
            slug,
            "detail",
        ))
        .unwrap();
        axum::http::Response::builder()
            .status(status)
            .body(body)
            .unwrap()
            .into()
    }

    #[tokio::test]
    async fn a_refused_service_token_is_a_503_never_the_fans_problem() {
        for status in [401, 403] {
            let problem = pass_on(answer(status, "unauthorized")).await;
            assert_eq!(
                problem.status_code(),
                StatusCode::SERVICE_UNAVAILABLE,
                "{status}"
            );
        }
        let problem = pass_on(answer(410, "sold-out")).await;
        assert_eq!(problem.status_code(), StatusCode::GONE);
    }
}
