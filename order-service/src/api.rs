//! The internal HTTP API. Only the gateway and the admission service call it,
//! with the service token (`Authorization: Bearer`, 401 without it); it
//! trusts them to have checked tokens and per-fan limits.
//!
//! | method, path | does |
//! | --- | --- |
//! | `PUT /internal/events/{id}` | create or update an event and its inventory |
//! | `GET /internal/events/{id}` | seats: capacity, reserved, sold, remaining |
//! | `PUT /internal/events/{id}/settings` | keep the admission service's settings of the event (a JSON object of strings) |
//! | `GET /internal/events/{id}/settings` | the kept settings of one event, 404 `unknown-event` without |
//! | `GET /internal/event-settings` | every event's kept settings, `[{event_id, settings}]`, so Redis can be refilled |
//! | `POST /internal/orders` | place an order (hold seats), idempotent on `order_id` |
//! | `GET /internal/orders/{id}` | an order and how many tickets it has |
//! | `GET /internal/orders/{id}/tickets.pdf` | its ticket PDF from the ticket store, 404 until issued |
//! | `GET /internal/health` | order latency p95, outbox backlog and age, consumer lag |
//! | `GET /metrics` | Prometheus: `boxoffice_orders_total{status}`, `boxoffice_outbox_backlog`, `boxoffice_outbox_oldest_age_seconds`, payment calls |

use std::collections::HashMap;

use axum::extract::{Extension, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::Router;
use boxoffice_contract::auth;
use boxoffice_contract::extract::{Json, Path};
use boxoffice_contract::keys::valid_event_id;
use boxoffice_contract::trace::TraceContext;
use boxoffice_contract::Problem;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::health;
use crate::store::{self, Order, Placed, Stock, StoreError};
use crate::AppState;

/// Largest quantity any order may have; the per-fan limit is enforced at the edge.
pub const MAX_QUANTITY: i32 = 100;

pub fn router(state: AppState) -> Router {
    // Every /internal route wants the service token; probes and metrics do not.
    let internal = Router::new()
        .route("/internal/events/{event_id}", put(put_event).get(get_event))
        .route(
            "/internal/events/{event_id}/settings",
            put(put_settings).get(get_settings),
        )
        .route("/internal/event-settings", get(all_settings))
        .route("/internal/orders", post(place_order))
        .route("/internal/orders/{order_id}", get(get_order))
        .route("/internal/orders/{order_id}/tickets.pdf", get(get_tickets))
        .route("/internal/health", get(pipeline_health))
        .route_layer(axum::middleware::from_fn_with_state(
            state.config.service.acceptor(),
            auth::require_service,
        ));
    let routes = internal
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz));
    boxoffice_contract::problem::with_fallbacks(routes)
        .with_state(state)
        // The gateway's x-request-id and trace, on every log line of the request.
        .layer(boxoffice_contract::telemetry::Traced(Some(crate::SERVICE)))
}

impl From<StoreError> for Problem {
    fn from(error: StoreError) -> Self {
        match error {
            StoreError::UnknownEvent => Problem::not_found("unknown-event", "no such event"),
            e @ StoreError::CapacityBelowCommitted { .. } => {
                Problem::new(StatusCode::CONFLICT, "capacity-below-sold", e.to_string())
            }
            StoreError::Db(error) => {
                tracing::error!(%error, "database error");
                Problem::unavailable(
                    "upstream-unavailable",
                    "the order database is unavailable",
                    1,
                )
            }
        }
    }
}

#[derive(Debug, Deserialize)]
pub struct EventSpec {
    pub name: String,
    pub capacity: i32,
    pub price_cents: i64,
}

#[derive(Debug, Serialize, Deserialize, PartialEq, Eq)]
/// Seats of an event as the API reports them.
pub struct Seats {
    pub capacity: i32,
    pub reserved: i32,
    pub sold: i32,
    pub remaining: i32,
}

impl From<Stock> for Seats {
    fn from(s: Stock) -> Self {
        Self {
            capacity: s.capacity,
            reserved: s.reserved,
            sold: s.sold,
            remaining: s.remaining(),
        }
    }
}

fn check_event_id(event_id: &str) -> Result<(), Problem> {
    if valid_event_id(event_id) {
        Ok(())
    } else {
        Err(Problem::not_found("unknown-event", "no such event"))
    }
}

async fn put_event(
    State(state): State<AppState>,
    Path(event_id): Path<String>,
    Json(spec): Json<EventSpec>,
) -> Result<axum::Json<Seats>, Problem> {
    check_event_id(&event_id)?;
    // PostgreSQL text cannot hold NUL: refused here, not a database error.
    if spec.capacity < 0
        || spec.price_cents < 0
        || spec.name.trim().is_empty()
        || spec.name.contains('\0')
    {
        return Err(Problem::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid-event",
            "name must be non-empty without NUL; capacity and price_cents must not be negative",
        ));
    }
    let stock = store::upsert_event(
        &state.pool,
        &event_id,
        &spec.name,
        spec.capacity,
        spec.price_cents,
    )
    .await?;
    state.stock.publish(&event_id, stock).await;
    Ok(axum::Json(stock.into()))
}

async fn put_settings(
    State(state): State<AppState>,
    Path(event_id): Path<String>,
    Json(settings): Json<HashMap<String, String>>,
) -> Result<StatusCode, Problem> {
    check_event_id(&event_id)?;
    let settings = serde_json::to_value(settings).expect("a map of strings");
    if store::save_settings(&state.pool, &event_id, &settings).await? {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(Problem::not_found("unknown-event", "no such event"))
    }
}

async fn get_settings(
    State(state): State<AppState>,
    Path(event_id): Path<String>,
) -> Result<axum::Json<HashMap<String, String>>, Problem> {
    check_event_id(&event_id)?;
    store::settings(&state.pool, &event_id)
        .await?
        .and_then(|settings| serde_json::from_value(settings).ok())
        .map(axum::Json)
        .ok_or_else(|| Problem::not_found("unknown-event", "no settings kept for this event"))
}

#[derive(Debug, Serialize, Deserialize)]
pub struct EventSettings {
    pub event_id: String,
    pub settings: HashMap<String, String>,
}

async fn all_settings(
    State(state): State<AppState>,
) -> Result<axum::Json<Vec<EventSettings>>, Problem> {
    let rows = store::all_settings(&state.pool).await?;
    Ok(axum::Json(
        rows.into_iter()
            .filter_map(|(event_id, settings)| {
                Some(EventSettings {
                    event_id,
                    settings: serde_json::from_value(settings).ok()?,
                })
            })
            .collect(),
    ))
}

async fn get_event(
    State(state): State<AppState>,
    Path(event_id): Path<String>,
) -> Result<axum::Json<Seats>, Problem> {
    check_event_id(&event_id)?;
    Ok(axum::Json(
        store::stock(&state.pool, &event_id).await?.into(),
    ))
}

#[derive(Debug, Serialize, Deserialize)]
pub struct PlaceOrder {
    pub order_id: Uuid,
    pub event_id: String,
    pub fan_id: String,
    pub quantity: i32,
    /// The admission that buys (the access token's `jti`): PostgreSQL keeps
    /// one order per admission. Absent for orders placed without one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admission_id: Option<String>,
    /// The purchase's Idempotency-Key (the fan's, or one per admission).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    /// The event's per-fan seat limit as the caller read it (the gateway,
    /// from Redis): the limit PostgreSQL enforces when it keeps no settings
    /// of the event, so a lost or never-written settings copy does not lift it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_fan_limit: Option<u32>,
}

/// An order as the gateway shows it to its fan.
#[derive(Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct OrderView {
    pub order_id: Uuid,
    pub event_id: String,
    pub fan_id: String,
    pub status: String,
    /// The status in words, for the fan.
    pub status_detail: String,
    pub quantity: i32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failure_reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_seat: Option<i32>,
    pub tickets_issued: i64,
}

/// What each status means to the fan, honestly.
pub fn status_detail(status: &str, quantity: i32, tickets_issued: i64) -> &'static str {
    match status {
        "pending" => "order received",
        "reserved" => "seats held — processing payment",
        "charged" => "paid — confirming your seats",
        "confirmed" if tickets_issued >= i64::from(quantity) => "confirmed — tickets ready",
        "confirmed" => "confirmed — issuing tickets",
        "failed" => "not completed — any charge is given back",
        "cancelled" => "cancelled",
        _ => "unknown",
    }
}

impl OrderView {
    fn new(order: Order, tickets_issued: i64) -> Self {
        Self {
            order_id: order.order_id,
            event_id: order.event_id,
            fan_id: order.fan_id,
            status_detail: status_detail(&order.status, order.quantity, tickets_issued).to_owned(),
            status: order.status,
            quantity: order.quantity,
            failure_reason: order.failure_reason,
            first_seat: order.first_seat,
            tickets_issued,
        }
    }
}

async fn place_order(
    State(state): State<AppState>,
    trace: Option<Extension<TraceContext>>,
    Json(req): Json<PlaceOrder>,
) -> Result<Response, Problem> {
    check_event_id(&req.event_id)?;
    if !(1..=MAX_QUANTITY).contains(&req.quantity) {
        return Err(Problem::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid-quantity",
            format!("quantity must be between 1 and {MAX_QUANTITY}"),
        ));
    }
    let placed = store::place_order(
        &state.pool,
        req.order_id,
        &req.event_id,
        &req.fan_id,
        req.quantity,
        state.config.reservation_ttl_s,
        trace.map(|t| t.to_string()).as_deref(),
        req.admission_id.as_deref().map(|id| store::Admission {
            id,
            idempotency_key: req.idempotency_key.as_deref().unwrap_or(""),
            per_fan_limit: req.per_fan_limit,
        }),
    )
    .await?;
    match placed {
        Placed::Reserved(order, stock) => {
            state.stock.publish(&req.event_id, stock).await;
            state.saga_wakeup.notify_one();
            metrics::counter!("boxoffice_orders_total", "status" => "reserved").increment(1);
            tracing::info!(order_id = %order.order_id, event_id = %order.event_id, "seats held");
            Ok((StatusCode::ACCEPTED, axum::Json(OrderView::new(order, 0))).into_response())
        }
        Placed::Existing(order, key) => {
            if order.fan_id != req.fan_id || order.event_id != req.event_id {
                return Err(Problem::new(
                    StatusCode::CONFLICT,
                    "order-id-taken",
                    "this order id belongs to another purchase",
                ));
            }
            // The admission bought before (Redis may have forgotten): the same
            // key is a retry of that purchase, any other a second purchase.
            if order.order_id != req.order_id && key.as_deref() != req.idempotency_key.as_deref() {
                return Err(Problem::new(
                    StatusCode::CONFLICT,
                    "token-used",
                    "this admission has already bought",
                ));
            }
            if order.quantity != req.quantity {
                return Err(Problem::new(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "idempotency-key-reused",
                    format!(
                        "this purchase was made for {} seats; a retry must ask for the same",
                        order.quantity
                    ),
                ));
            }
            Ok((StatusCode::OK, axum::Json(OrderView::new(order, 0))).into_response())
        }
        Placed::FanLimit { held, limit } => Err(Problem::new(
            StatusCode::CONFLICT,
            "fan-limit-reached",
            format!(
                "a fan may buy {limit} seats of this event; this fan's orders already hold {held}"
            ),
        )),
        Placed::SoldOut(stock) => {
            state.stock.publish(&req.event_id, stock).await;
            let free = stock.remaining();
            if free + stock.reserved >= req.quantity {
                // Held seats come back when a card is declined or a hold lapses.
                return Err(Problem::new(
                    StatusCode::CONFLICT,
                    "seats-held",
                    format!(
                        "{free} seats are free now and {} held by fans still paying; some may come back",
                        stock.reserved
                    ),
                ));
            }
            let detail = match free {
                0 => "every seat is sold".to_owned(),
                n => format!("only {n} seats remain"),
            };
            Err(Problem::new(StatusCode::GONE, "sold-out", detail))
        }
    }
}

async fn get_order(
    State(state): State<AppState>,
    Path(order_id): Path<Uuid>,
) -> Result<axum::Json<OrderView>, Problem> {
    let (order, tickets) = store::order(&state.pool, order_id)
        .await?
        .ok_or_else(|| Problem::not_found("unknown-order", "no such order"))?;
    Ok(axum::Json(OrderView::new(order, tickets)))
}

async fn get_tickets(
    State(state): State<AppState>,
    Path(order_id): Path<Uuid>,
) -> Result<Response, Problem> {
    match state.tickets.get(order_id).await {
        Ok(Some(pdf)) => {
            Ok(([(axum::http::header::CONTENT_TYPE, "application/pdf")], pdf).into_response())
        }
        Ok(None) => Err(Problem::not_found(
            "tickets-not-issued",
            "no tickets for this order yet",
        )),
        Err(error) => {
            tracing::error!(%error, "ticket store unavailable");
            Err(Problem::unavailable(
                "upstream-unavailable",
                "the ticket store is unavailable",
                1,
            ))
        }
    }
}

#[derive(Debug, Deserialize)]
struct HealthQuery {
    event_id: Option<String>,
}

/// Order latency, outbox backlog, consumer lag and DLQ depth (`null` when
/// the broker does not answer in time; read at most once per
/// [`health::READING_TTL`]), order outcomes (of `?event_id=`),
/// the oldest unsettled order, recent failures and whether payments flow.
async fn pipeline_health(
    State(state): State<AppState>,
    Query(query): Query<HealthQuery>,
) -> Result<axum::Json<health::Health>, Problem> {
    let mut report = health::database(&state.pool, query.event_id.as_deref())
        .await
        .map_err(StoreError::Db)?;
    let broker = state.broker.reading().await;
    report.consumer_lag = broker.lag;
    report.dlq_messages = broker.dlq_messages;
    report.payments_available = state.payments.circuit_closed();
    Ok(axum::Json(report))
}

/// `GET /metrics`; the outbox gauges are read from Postgres at scrape time,
/// so they are as fresh as the scrape.
async fn metrics(State(state): State<AppState>) -> Response {
    match health::database(&state.pool, None).await {
        Ok(report) => {
            metrics::gauge!("boxoffice_outbox_backlog").set(report.outbox_backlog as f64);
            metrics::gauge!("boxoffice_outbox_oldest_age_seconds").set(report.outbox_oldest_age_s);
        }
        Err(error) => tracing::warn!(%error, "cannot read the outbox for /metrics"),
    }
    boxoffice_contract::telemetry::metrics_endpoint()
        .await
        .into_response()
}

/// Ready when Postgres, Redis and the broker all answer, and the outbox
/// relay's producer is usable.
async fn readyz(State(state): State<AppState>) -> Response {
    let (db, redis, broker) = tokio::join!(
        sqlx::query_scalar!("SELECT 1 AS ping").fetch_one(&state.pool),
        state.stock.ping(),
        state.broker.reachable()
    );
    let db = db.is_ok();
    let relay = state.relay.fatal();
    if db && redis && broker && relay.is_none() {
        "ready".into_response()
    } else {
        let mut detail = format!("postgres up: {db}, redis up: {redis}, broker up: {broker}");
        if let Some(why) = relay {
            detail.push_str(&format!(", outbox producer failed: {why}"));
        }
        Problem::unavailable("not-ready", detail, 1).into_response()
    }
}
