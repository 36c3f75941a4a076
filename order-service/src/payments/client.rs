//! The saga's way to the payment provider. Every call passes, outermost first:
//!
//! 1. a bulkhead: at most `max_in_flight` calls at once; past that the call
//!    fails at once (nothing is sent);
//! 2. a circuit breaker (`failsafe`): opens when the success rate over a
//!    sliding window falls below `1 - failure_rate` with at least
//!    `min_requests` calls in it (and, failsafe's rule, once a whole window
//!    of history exists); while open, calls fail at once; after the open
//!    period one call tests the provider (half-open);
//! 3. retries of transient failures only (transport errors, timeouts, 5xx),
//!    exponential backoff with full jitter, paid from a retry budget
//!    (`tower`'s `TpsBudget`: retries may add at most `retry_percent` to the
//!    calls of the last 10 s) so a struggling provider is not hammered;
//! 4. a timeout per attempt.
//!
//! Every call is safe to repeat: charges carry the order id as idempotency
//! key, and lookups, refunds and voids are idempotent at the provider.

use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use failsafe::futures::CircuitBreaker;
use failsafe::{backoff, failure_policy, Config as BreakerConfig, StateMachine};
use rand::Rng;
use reqwest::StatusCode;
use tokio::sync::Semaphore;
use tower::retry::budget::{Budget, TpsBudget};

use super::{Charge, ChargeRequest};

#[derive(Debug, Clone, Args)]
pub struct PaymentConfig {
    /// The payment provider's API key, sent as `Authorization: Bearer`.
    #[arg(long, env = "PAYMENT_API_KEY", hide_env_values = true)]
    pub payment_api_key: String,
    /// Base URL of the payment provider.
    #[arg(long, env = "PAYMENT_URL", default_value = "http://127.0.0.1:8084")]
    pub payment_url: String,
    /// Timeout of one attempt.
    #[arg(long, env = "PAYMENT_ATTEMPT_TIMEOUT_MS", default_value_t = 2_000)]
    pub payment_attempt_timeout_ms: u64,
    /// Retries of a transient failure after the first attempt.
    #[arg(long, env = "PAYMENT_RETRIES", default_value_t = 3)]
    pub payment_retries: u32,
    /// First backoff cap; doubles per retry (full jitter: a random wait up to the cap).
    #[arg(long, env = "PAYMENT_BACKOFF_MS", default_value_t = 100)]
    pub payment_backoff_ms: u64,
    /// Largest backoff cap.
    #[arg(long, env = "PAYMENT_BACKOFF_MAX_MS", default_value_t = 2_000)]
    pub payment_backoff_max_ms: u64,
    /// Retries may add at most this share of the calls of the last 10 s.
    #[arg(long, env = "PAYMENT_RETRY_PERCENT", default_value_t = 0.2)]
    pub payment_retry_percent: f32,
    /// Bulkhead: calls to the provider in flight at once.
    #[arg(long, env = "PAYMENT_MAX_IN_FLIGHT", default_value_t = 64)]
    pub payment_max_in_flight: usize,
    /// Breaker: failure share over the window that opens it.
    #[arg(long, env = "PAYMENT_BREAKER_FAILURE_RATE", default_value_t = 0.5)]
    pub payment_breaker_failure_rate: f64,
    /// Breaker: calls the window must hold before it may open.
    #[arg(long, env = "PAYMENT_BREAKER_MIN_REQUESTS", default_value_t = 20)]
    pub payment_breaker_min_requests: u32,
    /// Breaker: length of the sliding window.
    #[arg(long, env = "PAYMENT_BREAKER_WINDOW_S", default_value_t = 10)]
    pub payment_breaker_window_s: u64,
    /// Breaker: first open period (at least 1 s; grows while the provider stays down).
    #[arg(long, env = "PAYMENT_BREAKER_OPEN_MS", default_value_t = 2_000)]
    pub payment_breaker_open_ms: u64,
}

impl PaymentConfig {
    /// The defaults of the command line, pointed at `payment_url`.
    pub fn defaults(payment_url: &str) -> Self {
        use clap::Parser;
        #[derive(Parser)]
        struct Wrapper {
            #[command(flatten)]
            config: PaymentConfig,
        }
        let mut config = Wrapper::parse_from(["payments", "--payment-api-key="]).config;
        config.payment_url = payment_url.to_owned();
        config
    }

    /// The longest one call can take, all attempts and waits included.
    pub fn call_budget(&self) -> Duration {
        let attempts = u64::from(self.payment_retries) + 1;
        Duration::from_millis(
            attempts * self.payment_attempt_timeout_ms
                + u64::from(self.payment_retries) * self.payment_backoff_max_ms,
        )
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PaymentError {
    /// Refused on our side (bulkhead full, circuit open): nothing was sent.
    #[error("payment call not sent: {0}")]
    NotSent(&'static str),
    /// Sent, but the outcome is unknown (timeouts, transport errors, 5xx):
    /// the provider may have applied it. Reconcile by idempotency key.
    #[error("payment outcome unknown: {0}")]
    Unknown(String),
    /// The provider answered something this client does not expect (a bug).
    #[error("unexpected answer from the payment provider: {0}")]
    Unexpected(String),
}

type Policy = failure_policy::SuccessRateOverTimeWindow<backoff::Exponential>;

#[derive(Clone)]
pub struct PaymentClient {
    http: reqwest::Client,
    base: String,
    config: Arc<PaymentConfig>,
    bulkhead: Arc<Semaphore>,
    breaker: StateMachine<Policy, ()>,
    budget: Arc<TpsBudget>,
}

/// Full jitter: a random wait between zero and `base × 2^(retry-1)`, capped.
pub fn full_jitter(base: Duration, max: Duration, retry: u32) -> Duration {
    let cap = base
        .saturating_mul(
            1u32.checked_shl(retry.saturating_sub(1))
                .unwrap_or(u32::MAX),
        )
        .min(max);
    cap.mul_f64(rand::thread_rng().gen::<f64>())
}

impl PaymentClient {
    pub fn new(config: PaymentConfig) -> anyhow::Result<Self> {
        // failsafe's exponential backoff counts in whole seconds from one.
        let open = Duration::from_millis(config.payment_breaker_open_ms.max(1_000));
        let policy = failure_policy::success_rate_over_time_window(
            1.0 - config.payment_breaker_failure_rate.clamp(0.0, 1.0),
            config.payment_breaker_min_requests,
            Duration::from_secs(config.payment_breaker_window_s.max(1)),
            backoff::exponential(open, open * 30),
        );
        Ok(Self {
            http: reqwest::Client::builder()
                .pool_max_idle_per_host(config.payment_max_in_flight)
                .default_headers(
                    boxoffice_contract::auth::ServiceTokenArgs::new(&config.payment_api_key)
                        .header()?,
                )
                .build()?,
            base: config.payment_url.trim_end_matches('/').to_owned(),
            bulkhead: Arc::new(Semaphore::new(config.payment_max_in_flight.max(1))),
            breaker: BreakerConfig::new().failure_policy(policy).build(),
            budget: Arc::new(TpsBudget::new(
                Duration::from_secs(10),
                1,
                config.payment_retry_percent,
            )),
            config: Arc::new(config),
        })
    }

    pub fn config(&self) -> &PaymentConfig {
        &self.config
    }

    /// Whether the breaker lets calls through right now.
    pub fn circuit_closed(&self) -> bool {
        self.breaker.is_call_permitted()
    }

    /// Charges `amount_cents` under `key` (the order id). A declined card is
    /// an `Ok` charge with status `declined`; a key already voided or
    /// refunded answers with that charge.
    pub async fn charge(&self, key: &str, amount_cents: i64) -> Result<Charge, PaymentError> {
        let body = ChargeRequest {
            idempotency_key: key.to_owned(),
            amount_cents,
        };
        let url = format!("{}/v1/charges", self.base);
        let (status, bytes) = self
            .send("charge", || self.http.post(&url).json(&body))
            .await?;
        match status {
            StatusCode::OK | StatusCode::CREATED | StatusCode::CONFLICT => parse(&bytes),
            other => Err(unexpected(other, &bytes)),
        }
    }

    /// What the provider knows of `key`: `None` if no charge was ever made.
    pub async fn lookup(&self, key: &str) -> Result<Option<Charge>, PaymentError> {
        let url = format!("{}/v1/charges/{key}", self.base);
        let (status, bytes) = self.send("lookup", || self.http.get(&url)).await?;
        match status {
            StatusCode::OK => parse(&bytes).map(Some),
            StatusCode::NOT_FOUND => Ok(None),
            other => Err(unexpected(other, &bytes)),
        }
    }

    /// Gives the capture under `key` back; idempotent.
    pub async fn refund(&self, key: &str) -> Result<Charge, PaymentError> {
        let url = format!("{}/v1/charges/{key}/refund", self.base);
        let (status, bytes) = self.send("refund", || self.http.post(&url)).await?;
        match status {
            StatusCode::OK | StatusCode::CONFLICT => parse(&bytes),
            other => Err(unexpected(other, &bytes)),
        }
    }

    /// Closes `key` unless it holds a capture: answers the key's charge,
    /// `voided` (or `declined`) when nothing was or ever will be taken.
    pub async fn void(&self, key: &str) -> Result<Charge, PaymentError> {
        let url = format!("{}/v1/charges/{key}/void", self.base);
        let (status, bytes) = self.send("void", || self.http.post(&url)).await?;
        match status {
            StatusCode::OK | StatusCode::CONFLICT => parse(&bytes),
            other => Err(unexpected(other, &bytes)),
        }
    }

    /// Bulkhead ▸ breaker ▸ retries ▸ per-attempt timeout. Returns the first
    /// answer that is not a 5xx.
    async fn send(
        &self,
        op: &'static str,
        request: impl Fn() -> reqwest::RequestBuilder,
    ) -> Result<(StatusCode, bytes::Bytes), PaymentError> {
        let Ok(_permit) = self.bulkhead.try_acquire() else {
            record(op, "bulkhead-full");
            return Err(PaymentError::NotSent("too many payment calls in flight"));
        };
        match self.breaker.call(self.with_retries(op, request)).await {
            Ok(answer) => {
                record(op, "answered");
                Ok(answer)
            }
            Err(failsafe::Error::Rejected) => {
                record(op, "circuit-open");
                Err(PaymentError::NotSent("payment provider circuit open"))
            }
            Err(failsafe::Error::Inner(reason)) => {
                record(op, "unknown");
                Err(PaymentError::Unknown(reason))
            }
        }
    }

    async fn with_retries(
        &self,
        op: &'static str,
        request: impl Fn() -> reqwest::RequestBuilder,
    ) -> Result<(StatusCode, bytes::Bytes), String> {
        let timeout = Duration::from_millis(self.config.payment_attempt_timeout_ms);
        self.budget.deposit();
        let mut retry = 0;
        loop {
            let attempt = async {
                let response = request().send().await?;
                let status = response.status();
                Ok::<_, reqwest::Error>((status, response.bytes().await?))
            };
            let reason = match tokio::time::timeout(timeout, attempt).await {
                Ok(Ok((status, bytes))) if !status.is_server_error() => return Ok((status, bytes)),
                Ok(Ok((status, _))) => format!("provider answered {status}"),
                Ok(Err(error)) => format!("transport: {error}"),
                Err(_) => format!("attempt timed out after {timeout:?}"),
            };
            retry += 1;
            if retry > self.config.payment_retries {
                return Err(format!("{reason} (after {retry} attempts)"));
            }
            if !self.budget.withdraw() {
                return Err(format!("{reason} (retry budget spent)"));
            }
            tracing::debug!(op, retry, %reason, "retrying payment call");
            metrics::counter!("boxoffice_payment_retries_total", "op" => op).increment(1);
            tokio::time::sleep(full_jitter(
                Duration::from_millis(self.config.payment_backoff_ms),
                Duration::from_millis(self.config.payment_backoff_max_ms),
                retry,
            ))
            .await;
        }
    }
}

fn record(op: &'static str, outcome: &'static str) {
    metrics::counter!("boxoffice_payment_calls_total", "op" => op, "outcome" => outcome)
        .increment(1);
}

fn parse(bytes: &[u8]) -> Result<Charge, PaymentError> {
    serde_json::from_slice(bytes).map_err(|e| PaymentError::Unexpected(e.to_string()))
}

fn unexpected(status: StatusCode, bytes: &[u8]) -> PaymentError {
    PaymentError::Unexpected(format!("{status}: {}", String::from_utf8_lossy(bytes)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_jitter_stays_under_a_doubling_cap() {
        let base = Duration::from_millis(100);
        let max = Duration::from_millis(1_000);
        for retry in 1..=8 {
            let cap = (base * 2u32.pow(retry - 1)).min(max);
            let waits: Vec<Duration> = (0..200).map(|_| full_jitter(base, max, retry)).collect();
            assert!(waits.iter().all(|w| *w <= cap), "retry {retry}");
            // Full jitter spreads over the whole range, not just near the cap.
            assert!(waits.iter().any(|w| *w < cap / 4), "retry {retry}");
            assert!(waits.iter().any(|w| *w > cap * 3 / 4), "retry {retry}");
        }
    }

    #[test]
    fn the_call_budget_covers_every_attempt_and_wait() {
        let mut config = PaymentConfig::defaults("http://x");
        config.payment_attempt_timeout_ms = 100;
        config.payment_retries = 2;
        config.payment_backoff_max_ms = 50;
        assert_eq!(config.call_budget(), Duration::from_millis(400));
    }
}
