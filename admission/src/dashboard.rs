//! The ops dashboard: a sampler that keeps the last minutes of every event's
//! figures in memory, the admin API calls that read them, and the page at
//! `/admin/` that charts them (uPlot, vendored into the binary).
//!
//! Once a second (`--sample-ms`) the sampler reads each event's live stats
//! (the same as `GET /admin/v1/events/{id}`) and the purchase pipeline's
//! health from the order service (order outcomes, outbox backlog and oldest
//! age, consumer lag, DLQ depth) and appends a [`Sample`]; it also exports
//! `boxoffice_queue_oldest_wait_seconds{event}`. Each replica keeps
//! its own window (`--history-samples`, ten minutes by default); Prometheus
//! keeps the long history.
//!
//! The page itself holds no data and is served without the admin token; it
//! asks for the token and sends it on every admin API call it makes.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use axum::extract::{Query, State};
use axum::http::header;
use axum::response::{Html, IntoResponse, Response};
use boxoffice_contract::event::{now_ms, EventState};
use boxoffice_contract::extract::Path;
use boxoffice_contract::keys::events_key;
use boxoffice_contract::Problem;
use redis::AsyncCommands;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use crate::api::{check_event_id, redis_down, view};
use crate::AppState;

/// One second of one event, as the dashboard charts it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct Sample {
    /// Unix milliseconds.
    pub t_ms: i64,
    pub state: EventState,
    pub paused: bool,
    pub queue_length: u64,
    pub active: u64,
    pub max_active: u64,
    pub admitted_total: u64,
    /// The configured admission rate (fans/s).
    pub rate_set: f64,
    /// Fans actually admitted per second since the previous sample.
    pub rate_actual: f64,
    pub oldest_wait_s: f64,
    pub sold: Option<i64>,
    pub remaining: Option<i64>,
    /// This event's orders by status.
    pub orders: BTreeMap<String, i64>,
    pub outbox_backlog: Option<i64>,
    pub outbox_oldest_age_s: Option<f64>,
    pub consumer_lag: Option<i64>,
    pub dlq_messages: Option<i64>,
    pub order_latency_p95_ms: Option<f64>,
}

/// What the order service's `GET /internal/health?event_id=` reports.
#[derive(Debug, Default, Deserialize)]
struct Pipeline {
    order_latency_p95_ms: Option<f64>,
    outbox_backlog: i64,
    outbox_oldest_age_s: f64,
    consumer_lag: Option<i64>,
    #[serde(default)]
    dlq_messages: Option<i64>,
    #[serde(default)]
    orders: BTreeMap<String, i64>,
}

/// The last `capacity` samples of every event.
#[derive(Debug)]
pub struct History {
    capacity: usize,
    events: Mutex<HashMap<String, VecDeque<Sample>>>,
}

impl History {
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity: capacity.max(1),
            events: Mutex::default(),
        }
    }

    /// Appends a sample, dropping the oldest past the window.
    pub fn push(&self, event_id: &str, sample: Sample) {
        let mut events = self.events.lock().expect("history lock");
        let samples = events.entry(event_id.to_owned()).or_default();
        samples.push_back(sample);
        while samples.len() > self.capacity {
            samples.pop_front();
        }
    }

    /// Samples of the event taken after `since_ms`, oldest first.
    pub fn since(&self, event_id: &str, since_ms: i64) -> Vec<Sample> {
        let events = self.events.lock().expect("history lock");
        events.get(event_id).map_or_else(Vec::new, |samples| {
            samples
                .iter()
                .filter(|s| s.t_ms > since_ms)
                .cloned()
                .collect()
        })
    }

    fn last(&self, event_id: &str) -> Option<Sample> {
        let events = self.events.lock().expect("history lock");
        events.get(event_id).and_then(|s| s.back().cloned())
    }

    /// Forgets events that no longer exist.
    fn retain(&self, live: &[String]) {
        let mut events = self.events.lock().expect("history lock");
        events.retain(|id, _| live.contains(id));
    }
}

/// Admitted per second between two readings of the admitted total.
fn rate_between(previous: Option<&Sample>, admitted_total: u64, t_ms: i64) -> f64 {
    match previous {
        Some(p) if t_ms > p.t_ms && admitted_total >= p.admitted_total => {
            (admitted_total - p.admitted_total) as f64 * 1000.0 / (t_ms - p.t_ms) as f64
        }
        _ => 0.0,
    }
}

/// Takes one sample of every event.
pub async fn sample_all(state: &AppState) -> anyhow::Result<usize> {
    let mut redis = state.redis.clone();
    let ids: Vec<String> = redis
        .smembers(events_key(&state.config.redis_prefix))
        .await?;
    state.history.retain(&ids);
    for event_id in &ids {
        // Stamped at the Redis read (the view reads Redis first), not after
        // the order service's answers: rates are read off these stamps.
        let t_ms = now_ms();
        let Ok(view) = view(state, event_id).await else {
            continue;
        };
        let pipeline = pipeline(state, event_id).await;
        let previous = state.history.last(event_id);
        let sample = Sample {
            t_ms,
            state: view.state,
            paused: view.paused,
            queue_length: view.queue_length,
            active: view.active,
            max_active: view.max_active,
            admitted_total: view.admitted_total,
            rate_set: view.admission_rate_per_s,
            rate_actual: rate_between(previous.as_ref(), view.admitted_total, t_ms),
            oldest_wait_s: view.oldest_wait_s,
            sold: view.sold,
            remaining: view.remaining,
            order_latency_p95_ms: pipeline.as_ref().and_then(|p| p.order_latency_p95_ms),
            outbox_backlog: pipeline.as_ref().map(|p| p.outbox_backlog),
            outbox_oldest_age_s: pipeline.as_ref().map(|p| p.outbox_oldest_age_s),
            consumer_lag: pipeline.as_ref().and_then(|p| p.consumer_lag),
            dlq_messages: pipeline.as_ref().and_then(|p| p.dlq_messages),
            orders: pipeline.map(|p| p.orders).unwrap_or_default(),
        };
        // Depth alone hides a stalled line; the head's wait is what is alerted on.
        metrics::gauge!("boxoffice_queue_oldest_wait_seconds", "event" => event_id.clone())
            .set(sample.oldest_wait_s);
        state.history.push(event_id, sample);
    }
    Ok(ids.len())
}

async fn pipeline(state: &AppState, event_id: &str) -> Option<Pipeline> {
    let url = format!("{}/internal/health", state.config.order_service_url);
    let response = state
        .http
        .get(url)
        .query(&[("event_id", event_id)])
        .send()
        .await
        .ok()?;
    if !response.status().is_success() {
        return None;
    }
    response.json().await.ok()
}

/// Samples every `interval` until cancelled.
pub async fn run_sampler(state: AppState, interval: Duration, cancel: CancellationToken) {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            _ = ticker.tick() => {}
        }
        if let Err(error) = sample_all(&state).await {
            tracing::warn!(%error, "dashboard sample failed");
        }
    }
}

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
pub async fn history(
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
pub async fn list_events(
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

/// The ops dashboard: live charts, controls and the capacity planner.
#[utoipa::path(
    get,
    path = "/admin/",
    tag = "dashboard",
    responses((status = 200, description = "The dashboard page", body = String, content_type = "text/html"))
)]
pub async fn page() -> (axum::http::HeaderMap, Html<&'static str>) {
    const PAGE: &str = include_str!("../assets/dashboard.html");
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
pub async fn page_redirect() -> axum::response::Redirect {
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
pub async fn asset(Path(file): Path<String>) -> Response {
    let (body, content_type): (&'static str, &str) = match file.as_str() {
        "dashboard.js" => (
            include_str!("../assets/dashboard.js"),
            "text/javascript; charset=utf-8",
        ),
        "uPlot.iife.min.js" => (
            include_str!("../assets/vendor/uPlot.iife.min.js"),
            "text/javascript; charset=utf-8",
        ),
        "uPlot.min.css" => (
            include_str!("../assets/vendor/uPlot.min.css"),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(t_ms: i64, admitted_total: u64) -> Sample {
        Sample {
            t_ms,
            state: EventState::Open,
            paused: false,
            queue_length: 0,
            active: 0,
            max_active: 0,
            admitted_total,
            rate_set: 0.0,
            rate_actual: 0.0,
            oldest_wait_s: 0.0,
            sold: None,
            remaining: None,
            orders: BTreeMap::new(),
            outbox_backlog: None,
            outbox_oldest_age_s: None,
            consumer_lag: None,
            dlq_messages: None,
            order_latency_p95_ms: None,
        }
    }

    #[test]
    fn the_window_keeps_the_newest_samples() {
        let history = History::new(3);
        for t in 1..=5 {
            history.push("e", sample(t, 0));
        }
        let kept: Vec<i64> = history.since("e", 0).iter().map(|s| s.t_ms).collect();
        assert_eq!(kept, [3, 4, 5]);
        let after: Vec<i64> = history.since("e", 4).iter().map(|s| s.t_ms).collect();
        assert_eq!(after, [5]);
        assert!(history.since("other", 0).is_empty());
    }

    #[test]
    fn forgotten_events_drop_out() {
        let history = History::new(3);
        history.push("a", sample(1, 0));
        history.push("b", sample(1, 0));
        history.retain(&["b".to_owned()]);
        assert!(history.since("a", 0).is_empty());
        assert_eq!(history.since("b", 0).len(), 1);
    }

    #[test]
    fn actual_rate_is_admissions_over_time_between_samples() {
        let previous = sample(1_000, 100);
        assert_eq!(rate_between(Some(&previous), 150, 1_500), 100.0);
        assert_eq!(rate_between(None, 150, 1_500), 0.0);
        // A reset counter (event replaced) reads as zero, not negative.
        assert_eq!(rate_between(Some(&previous), 10, 2_000), 0.0);
    }
}
