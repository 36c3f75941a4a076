//! An event as every admin call shows it ([`EventView`]): its settings and
//! live stats from Redis, its seats from the order service. The events
//! resource answers with it, the history lists it, the sampler charts it.

use std::collections::HashMap;

use boxoffice_contract::event::{
    now_ms, Adaptive, EventConfig, EventState, Identity, SeatView, FIFO_BASE,
};
use boxoffice_contract::keys::EventKeys;
use boxoffice_contract::Problem;
use chrono::{DateTime, Utc};
use redis::AsyncCommands;
use serde::{Deserialize, Serialize};

use super::problem::redis_down;
use crate::state::AppState;

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

#[cfg(test)]
mod tests {
    use super::*;

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
