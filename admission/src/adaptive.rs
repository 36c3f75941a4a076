//! Adaptive admission: once a second the leader of an event with an adaptive
//! policy reads the purchase pipeline's health from the order service and
//! moves the rate (AIMD): +5 % of the band while healthy, halved when order
//! latency (confirmed orders' p95, or the age of the oldest order still
//! unsettled), the outbox backlog or the consumer lag crosses its threshold,
//! when payments are unavailable (the payment client's breaker is open), when
//! more than [`MAX_FAILED_SHARE`] of last minute's settled orders failed for
//! a reason of ours, or when the order service does not answer at all;
//! always within the ops' floor and ceiling. The new rate is written to the
//! event's settings, so the next tick, the ETAs and the dashboard all see it.

use std::time::Duration;

use boxoffice_contract::event::{Adaptive, EventConfig};
use boxoffice_contract::keys::{events_key, EventKeys};
use boxoffice_contract::redis_link::RedisLink;
use redis::AsyncCommands;
use serde::Deserialize;
use tokio_util::sync::CancellationToken;

/// What the order service's `GET /internal/health` reports.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
pub struct PipelineHealth {
    pub order_latency_p95_ms: Option<f64>,
    pub outbox_backlog: i64,
    pub outbox_oldest_age_s: f64,
    pub consumer_lag: Option<i64>,
    #[serde(default)]
    pub oldest_unsettled_age_s: f64,
    #[serde(default)]
    pub orders_failed_1m: i64,
    #[serde(default)]
    pub orders_confirmed_1m: i64,
    #[serde(default = "available")]
    pub payments_available: bool,
}

fn available() -> bool {
    true
}

impl Default for PipelineHealth {
    fn default() -> Self {
        Self {
            order_latency_p95_ms: None,
            outbox_backlog: 0,
            outbox_oldest_age_s: 0.0,
            consumer_lag: None,
            oldest_unsettled_age_s: 0.0,
            orders_failed_1m: 0,
            orders_confirmed_1m: 0,
            payments_available: true,
        }
    }
}

/// Above this share of last minute's settled orders failing for a reason of
/// ours (at least [`MIN_FAILURES`] of them), the pipeline counts as unhealthy.
pub const MAX_FAILED_SHARE: f64 = 0.2;
pub const MIN_FAILURES: i64 = 5;

/// Why the rate moved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Healthy,
    SlowOrders,
    OutboxBacklog,
    ConsumerLag,
    PaymentsUnavailable,
    FailingOrders,
    /// The order service did not answer.
    Unreachable,
}

/// What the pipeline's health says, the first crossed threshold first.
fn diagnose(policy: &Adaptive, health: &PipelineHealth) -> Verdict {
    let settled = health.orders_failed_1m + health.orders_confirmed_1m;
    if !health.payments_available {
        Verdict::PaymentsUnavailable
    } else if health
        .order_latency_p95_ms
        .is_some_and(|l| l > policy.max_order_latency_ms)
        || health.oldest_unsettled_age_s * 1000.0 > policy.max_order_latency_ms
    {
        Verdict::SlowOrders
    } else if health.orders_failed_1m >= MIN_FAILURES
        && health.orders_failed_1m as f64 > MAX_FAILED_SHARE * settled as f64
    {
        Verdict::FailingOrders
    } else if health.outbox_backlog > policy.max_outbox_backlog {
        Verdict::OutboxBacklog
    } else if health
        .consumer_lag
        .is_some_and(|l| l > policy.max_consumer_lag)
    {
        Verdict::ConsumerLag
    } else {
        Verdict::Healthy
    }
}

/// The next rate, and why: the additive-increase / multiplicative-decrease
/// step. `health` is `None` when the order service did not answer.
pub fn next_rate(
    current: f64,
    policy: &Adaptive,
    health: Option<&PipelineHealth>,
) -> (f64, Verdict) {
    let verdict = health.map_or(Verdict::Unreachable, |h| diagnose(policy, h));
    let step = ((policy.ceiling - policy.floor) * 0.05).max(0.1);
    let next = match verdict {
        Verdict::Healthy => current + step,
        _ => current / 2.0,
    };
    (next.clamp(policy.floor, policy.ceiling), verdict)
}

pub struct Controller {
    pub redis: RedisLink,
    pub prefix: String,
    pub replica: String,
    pub http: reqwest::Client,
    pub order_service_url: String,
}

impl Controller {
    async fn health(&self) -> anyhow::Result<PipelineHealth> {
        let url = format!("{}/internal/health", self.order_service_url);
        Ok(self
            .http
            .get(url)
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?)
    }

    /// One adjustment of every adaptive event this replica leads; returns the
    /// events whose rate changed, with old and new rates.
    pub async fn adjust(&self) -> anyhow::Result<Vec<(String, f64, f64, Verdict)>> {
        let mut redis = self.redis.clone();
        let events: Vec<String> = redis.smembers(events_key(&self.prefix)).await?;
        let mut health = None;
        let mut changed = Vec::new();
        for event in events {
            let keys = EventKeys::new(&self.prefix, &event);
            let (leader, fields): (Option<String>, std::collections::HashMap<String, String>) =
                redis::pipe()
                    .get(keys.lease())
                    .hgetall(keys.config())
                    .query_async(&mut redis)
                    .await?;
            if leader.as_deref() != Some(self.replica.as_str()) {
                continue;
            }
            let Some(config) = EventConfig::from_fields(&fields) else {
                continue;
            };
            let Some(policy) = config.adaptive else {
                continue;
            };
            // Read once per round; a failed read is an answer too: unhealthy.
            let health = match health {
                Some(h) => h,
                None => *health.insert(
                    self.health()
                        .await
                        .inspect_err(|error| {
                            tracing::warn!(%error, "the order service's health is unreadable")
                        })
                        .ok(),
                ),
            };
            let current = config.admission_rate_per_s;
            let (next, verdict) = next_rate(current, &policy, health.as_ref());
            if (next - current).abs() > f64::EPSILON {
                let _: () = redis.hset(keys.config(), "rate", next.to_string()).await?;
                tracing::info!(event_id = %event, from = current, to = next, ?verdict, "adaptive rate");
                changed.push((event, current, next, verdict));
            }
        }
        Ok(changed)
    }

    /// Adjusts every `interval` until cancelled.
    pub async fn run(self, interval: Duration, cancel: CancellationToken) {
        let mut ticker = tokio::time::interval(interval);
        loop {
            tokio::select! {
                () = cancel.cancelled() => break,
                _ = ticker.tick() => {}
            }
            if let Err(error) = self.adjust().await {
                tracing::warn!(%error, "adaptive admission skipped a round");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> Adaptive {
        Adaptive {
            floor: 10.0,
            ceiling: 110.0,
            max_order_latency_ms: 500.0,
            max_outbox_backlog: 100,
            max_consumer_lag: 1_000,
        }
    }

    #[test]
    fn healthy_pipelines_get_five_percent_of_the_band_more() {
        assert_eq!(
            next_rate(50.0, &policy(), Some(&PipelineHealth::default())),
            (55.0, Verdict::Healthy)
        );
        assert_eq!(
            next_rate(108.0, &policy(), Some(&PipelineHealth::default())).0,
            110.0,
            "never above the ceiling"
        );
    }

    #[test]
    fn any_crossed_threshold_halves_the_rate_down_to_the_floor() {
        let slow = PipelineHealth {
            order_latency_p95_ms: Some(900.0),
            ..Default::default()
        };
        assert_eq!(
            next_rate(80.0, &policy(), Some(&slow)),
            (40.0, Verdict::SlowOrders)
        );
        let backlog = PipelineHealth {
            outbox_backlog: 101,
            ..Default::default()
        };
        assert_eq!(
            next_rate(80.0, &policy(), Some(&backlog)),
            (40.0, Verdict::OutboxBacklog)
        );
        let lag = PipelineHealth {
            consumer_lag: Some(5_000),
            ..Default::default()
        };
        assert_eq!(
            next_rate(15.0, &policy(), Some(&lag)),
            (10.0, Verdict::ConsumerLag)
        );
    }

    #[test]
    fn a_payment_outage_an_unanswering_order_service_or_failing_orders_halve_the_rate() {
        // During a payment outage nothing confirms (no latency figure) but
        // orders age unsettled, and the breaker opens.
        let stuck = PipelineHealth {
            order_latency_p95_ms: None,
            oldest_unsettled_age_s: 20.0,
            ..Default::default()
        };
        assert_eq!(
            next_rate(80.0, &policy(), Some(&stuck)),
            (40.0, Verdict::SlowOrders)
        );
        let breaker_open = PipelineHealth {
            payments_available: false,
            ..Default::default()
        };
        assert_eq!(
            next_rate(80.0, &policy(), Some(&breaker_open)),
            (40.0, Verdict::PaymentsUnavailable)
        );
        assert_eq!(
            next_rate(80.0, &policy(), None),
            (40.0, Verdict::Unreachable)
        );
        let failing = PipelineHealth {
            orders_failed_1m: 30,
            orders_confirmed_1m: 70,
            ..Default::default()
        };
        assert_eq!(
            next_rate(80.0, &policy(), Some(&failing)),
            (40.0, Verdict::FailingOrders)
        );
        // A few failures among many confirmations are a sale going on.
        let few = PipelineHealth {
            orders_failed_1m: 4,
            orders_confirmed_1m: 0,
            ..Default::default()
        };
        assert_eq!(next_rate(80.0, &policy(), Some(&few)).1, Verdict::Healthy);
    }

    #[test]
    fn unknown_signals_do_not_count_as_trouble() {
        let quiet = PipelineHealth {
            order_latency_p95_ms: None,
            consumer_lag: None,
            ..Default::default()
        };
        assert_eq!(next_rate(10.0, &policy(), Some(&quiet)).1, Verdict::Healthy);
    }
}
