//! Event settings survive the loss of Redis.
//!
//! Redis serves each event's settings (`P:{E}:config`), but it may lose them:
//! a restart without persistence, a failover that drops the last writes, a
//! flush. Every admin write therefore keeps the whole settings hash in
//! PostgreSQL too, through the order service, before it reaches Redis; and
//! every replica puts back, at start and every few seconds ([`run`]), the
//! settings of each event whose hash in Redis has no seed, filling in what is
//! missing and keeping what Redis has. What Redis alone knew is lost: the
//! line itself (fans join again), admissions not yet spent, and an adaptive
//! rate written after the last admin write and before the loss.

use boxoffice_contract::trace::{TraceContext, TRACEPARENT};
use std::collections::HashMap;
use std::time::Duration;

use boxoffice_contract::keys::{events_key, EventKeys};
use boxoffice_contract::Problem;
use redis::{AsyncCommands, Script};
use serde::Deserialize;
use tokio_util::sync::CancellationToken;

use crate::state::AppState;

#[derive(Debug, Deserialize)]
struct EventSettings {
    event_id: String,
    settings: HashMap<String, String>,
}

/// Keeps `fields`, the event's whole settings hash, in PostgreSQL, as part
/// of the admin request's `trace`.
pub async fn persist(
    state: &AppState,
    event_id: &str,
    fields: &HashMap<String, String>,
    trace: &TraceContext,
) -> Result<(), Problem> {
    let url = format!(
        "{}/internal/events/{event_id}/settings",
        state.config.order_service_url
    );
    let unavailable = || {
        Problem::unavailable(
            "upstream-unavailable",
            "the order service could not keep the event's settings",
            2,
        )
    };
    let response = state
        .http
        .put(url)
        .header(TRACEPARENT, trace.to_string())
        .json(fields)
        .send()
        .await
        .map_err(|error| {
            tracing::error!(%error, "order service unreachable");
            unavailable()
        })?;
    if response.status().is_success() {
        Ok(())
    } else {
        tracing::error!(status = %response.status(), "order service refused the settings");
        Err(unavailable())
    }
}

/// Puts back the settings of every event Redis lost; returns how many.
pub async fn restore_once(state: &AppState) -> anyhow::Result<usize> {
    let url = format!("{}/internal/event-settings", state.config.order_service_url);
    let kept: Vec<EventSettings> = state
        .http
        .get(url)
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    let mut restored = 0;
    for event in kept.into_iter().filter(|e| !e.settings.is_empty()) {
        if put_back(state, &event.event_id, &event.settings).await? {
            restored += 1;
        }
    }
    Ok(restored)
}

/// Puts back one event's settings if Redis lost them (before an admin write
/// reads what the event already is: its seed, its opening, its identity);
/// `false` when there was nothing to put back or nothing kept.
pub async fn restore_event(
    state: &AppState,
    event_id: &str,
    trace: &TraceContext,
) -> Result<bool, Problem> {
    let unavailable = |error: &dyn std::fmt::Display| {
        tracing::error!(%error, "could not read the event's kept settings");
        Problem::unavailable(
            "upstream-unavailable",
            "the order service could not say what the event's settings were",
            2,
        )
    };
    let url = format!(
        "{}/internal/events/{event_id}/settings",
        state.config.order_service_url
    );
    let response = state
        .http
        .get(url)
        .header(TRACEPARENT, trace.to_string())
        .send()
        .await
        .map_err(|e| unavailable(&e))?;
    // 405: an order service older than this call keeps nothing to ask for.
    if matches!(
        response.status(),
        reqwest::StatusCode::NOT_FOUND | reqwest::StatusCode::METHOD_NOT_ALLOWED
    ) {
        return Ok(false);
    }
    let settings: HashMap<String, String> = response
        .error_for_status()
        .map_err(|e| unavailable(&e))?
        .json()
        .await
        .map_err(|e| unavailable(&e))?;
    if settings.is_empty() {
        return Ok(false);
    }
    put_back(state, event_id, &settings)
        .await
        .map_err(|e| unavailable(&e))
}

async fn put_back(
    state: &AppState,
    event_id: &str,
    settings: &HashMap<String, String>,
) -> anyhow::Result<bool> {
    // Hashed once, not per event and call.
    static SCRIPT: std::sync::LazyLock<Script> =
        std::sync::LazyLock::new(|| Script::new(include_str!("restore.lua")));
    let mut redis = state.redis.clone();
    let keys = EventKeys::new(&state.config.redis_prefix, event_id);
    let mut call = SCRIPT.prepare_invoke();
    call.key(keys.config());
    for (field, value) in settings {
        call.arg(field).arg(value);
    }
    let put_back: i32 = call.invoke_async(&mut redis).await?;
    // Apart from the script (another hash slot), and every time: a set
    // member lost alone comes back too.
    let _: () = redis
        .sadd(events_key(&state.config.redis_prefix), event_id)
        .await?;
    if put_back == 1 {
        tracing::warn!(%event_id, "event settings were missing from Redis; restored from PostgreSQL");
    }
    Ok(put_back == 1)
}

/// Restores lost settings every `every` until cancelled, the first time at once.
pub async fn run(state: AppState, every: Duration, cancel: CancellationToken) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            _ = tick.tick() => {}
        }
        if let Err(error) = restore_once(&state).await {
            tracing::debug!(%error, "could not check the events' settings");
        }
    }
}
