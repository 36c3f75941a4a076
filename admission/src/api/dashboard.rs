//! The ops dashboard's side of the admin API: the samples the sampler kept
//! (`GET /admin/v1/events/{id}/history`), and the page at `/admin/` that
//! charts them (uPlot, vendored into the binary) with its assets.
//!
//! The page itself holds no data and is served without the admin token; it
//! asks for the token and sends it on every admin API call it makes.

use axum::extract::{Query, State};
use axum::http::header;
use axum::response::{Html, IntoResponse, Response};
use boxoffice_contract::extract::Path;
use boxoffice_contract::keys::events_key;
use boxoffice_contract::Problem;
use redis::AsyncCommands;
use serde::{Deserialize, Serialize};

use super::problem::{check_event_id, redis_down};
use crate::history::Sample;
use crate::state::AppState;

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct SinceQuery {
    /// Only samples taken after this Unix millisecond (0: the whole window).
    #[serde(default)]
    since_ms: i64,
}

#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct HistoryView {
    pub event_id: String,
    /// How far apart samples are taken.
    pub sample_ms: u64,
    pub samples: Vec<Sample>,
}

/// The dashboard's samples of the event (one a second, the last ten minutes by default).
#[utoipa::path(
    get,
    path = "/admin/v1/events/{event_id}/history",
    security(("admin_token" = [])),
    tag = "events",
    params(("event_id" = String, Path, description = "The event"), SinceQuery),
    responses(
        (status = 200, description = "Samples after `since_ms`, oldest first", body = HistoryView),
        (status = 400, description = "`bad-request`", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "`unauthorized`: no or wrong admin token", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "`unknown-event`", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "`invalid-field`", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "`upstream-unavailable`", body = Problem, content_type = "application/problem+json"),
    )
)]
pub(super) async fn history(
    State(state): State<AppState>,
    Path(event_id): Path<String>,
    query: Result<Query<SinceQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<axum::Json<HistoryView>, Problem> {
    check_event_id(&event_id)?;
    let Query(query) = query.map_err(|e| Problem::bad_request(e.body_text()))?;
    let mut redis = state.redis.clone();
    let known: bool = redis
        .sismember(events_key(&state.config.redis_prefix), &event_id)
        .await
        .map_err(redis_down)?;
    if !known {
        return Err(Problem::not_found("unknown-event", "no such event"));
    }
    Ok(axum::Json(HistoryView {
        samples: state.history.since(&event_id, query.since_ms),
        event_id,
        sample_ms: state.config.sample_ms,
    }))
}

/// The ops dashboard: live charts, controls and the capacity planner.
#[utoipa::path(
    get,
    path = "/admin/",
    tag = "dashboard",
    responses((status = 200, description = "The dashboard page", body = String, content_type = "text/html"))
)]
pub(super) async fn page() -> (axum::http::HeaderMap, Html<&'static str>) {
    const PAGE: &str = include_str!("../../assets/dashboard.html");
    static SECURITY: std::sync::LazyLock<axum::http::HeaderMap> = std::sync::LazyLock::new(|| {
        boxoffice_contract::page::headers(PAGE)
            .into_iter()
            .collect()
    });
    (SECURITY.clone(), Html(PAGE))
}

/// `/admin` → `/admin/`.
#[utoipa::path(
    get,
    path = "/admin",
    tag = "dashboard",
    responses((status = 308, description = "To `/admin/`"))
)]
pub(super) async fn page_redirect() -> axum::response::Redirect {
    axum::response::Redirect::permanent("/admin/")
}

/// The page's script, styles and uPlot.
#[utoipa::path(
    get,
    path = "/admin/assets/{file}",
    tag = "dashboard",
    params(("file" = String, Path, description = "`dashboard.js`, `uPlot.iife.min.js` or `uPlot.min.css`")),
    responses(
        (status = 200, description = "The asset", body = String, content_type = "text/javascript"),
        (status = 404, description = "`unknown-asset`", body = Problem, content_type = "application/problem+json"),
    )
)]
pub(super) async fn asset(Path(file): Path<String>) -> Response {
    let (body, content_type): (&'static str, &str) = match file.as_str() {
        "dashboard.js" => (
            include_str!("../../assets/dashboard.js"),
            "text/javascript; charset=utf-8",
        ),
        "uPlot.iife.min.js" => (
            include_str!("../../assets/vendor/uPlot.iife.min.js"),
            "text/javascript; charset=utf-8",
        ),
        "uPlot.min.css" => (
            include_str!("../../assets/vendor/uPlot.min.css"),
            "text/css; charset=utf-8",
        ),
        _ => return Problem::not_found("unknown-asset", "no such asset").into_response(),
    };
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "public, max-age=300"),
        ],
        body,
    )
        .into_response()
}
