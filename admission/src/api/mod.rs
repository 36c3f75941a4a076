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
//!
//! One module per resource, each with its routes and their bodies:
//!
//! - `events`: `PUT`, `PATCH`, `GET` of one event and the list of them all.
//! - `admissions`: revoking a fan's admission.
//! - `planner`: the capacity planner.
//! - `dashboard`: the dashboard's history of an event, its page and assets.
//! - `view`: [`EventView`], an event as the admin calls show it.
//! - `problem`: the validation and error mapping they all share.
//!
//! This module puts them together: the router, the admin token check and the
//! OpenAPI document. Nothing below it imports it.

mod admissions;
mod dashboard;
mod events;
mod planner;
pub(crate) mod problem;
pub(crate) mod view;

use std::net::{IpAddr, SocketAddr};

use axum::extract::{ConnectInfo, Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::Router;
use boxoffice_contract::auth;
use boxoffice_contract::openapi::{self, AdminSecurity};
use boxoffice_contract::Problem;
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::state::AppState;

pub use dashboard::{HistoryView, SinceQuery};
pub use events::{EventPatch, EventSpec, EventSummary, MAX_POW_BITS, MAX_RATE};
pub use view::{rate_over, EventView, Seats};

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
            .routes(routes!(
                events::get_event,
                events::put_event,
                events::patch_event
            ))
            .routes(routes!(admissions::revoke))
            .routes(routes!(planner::capacity))
            .routes(routes!(events::list_events))
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
        .layer(boxoffice_contract::telemetry::Traced(Some(crate::SERVICE)))
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
