//! The dashboard's sampler. Once a second (`--sample-ms`) it reads each
//! event's live stats (the same as `GET /admin/v1/events/{id}`) and the
//! purchase pipeline's health from the order service (order outcomes, outbox
//! backlog and oldest age, consumer lag, DLQ depth) and appends a
//! [`Sample`] to the [`History`](crate::history::History); it also exports
//! `boxoffice_queue_oldest_wait_seconds{event}`.

use std::collections::BTreeMap;
use std::time::Duration;

use boxoffice_contract::event::now_ms;
use boxoffice_contract::keys::events_key;
use redis::AsyncCommands;
use serde::Deserialize;
use tokio_util::sync::CancellationToken;

use crate::api::view::view;
use crate::history::Sample;
use crate::state::AppState;

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::tests::sample;

    #[test]
    fn actual_rate_is_admissions_over_time_between_samples() {
        let previous = sample(1_000, 100);
        assert_eq!(rate_between(Some(&previous), 150, 1_500), 100.0);
        assert_eq!(rate_between(None, 150, 1_500), 0.0);
        // A reset counter (event replaced) reads as zero, not negative.
        assert_eq!(rate_between(Some(&previous), 10, 2_000), 0.0);
    }
}
