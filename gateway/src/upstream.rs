//! Calls to the order service, outermost first: a bulkhead (at most
//! `upstream_max_in_flight` at once; past that, 503 at once), a circuit
//! breaker (`failsafe`: opens when fewer than half the calls of the last
//! window succeed, with a minimum volume; stays open for an exponentially
//! growing pause, then lets one call test the water), and the per-call
//! timeout of the HTTP client. Purchases are safe to retry because the
//! order id is fixed before the call, so no retry happens here: the fan's
//! retry with the same Idempotency-Key is the retry.

use std::sync::Arc;
use std::time::Duration;

use boxoffice_contract::Problem;
use failsafe::futures::CircuitBreaker;
use failsafe::{backoff, failure_policy, Config as BreakerConfig, StateMachine};
use tokio::sync::Semaphore;

use crate::Config;

type Policy = failure_policy::SuccessRateOverTimeWindow<backoff::Exponential>;

#[derive(Clone)]
pub struct Upstream {
    http: reqwest::Client,
    base: String,
    bulkhead: Arc<Semaphore>,
    breaker: StateMachine<Policy, ()>,
    /// Shortest open period, for the Retry-After of a rejected call.
    open_s: u64,
}

/// Why a call failed, for the breaker: transport errors and 5xx count.
enum Failure {
    Transport(reqwest::Error),
    Status(reqwest::Response),
}

impl Upstream {
    pub fn new(config: &Config) -> anyhow::Result<Self> {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_millis(config.upstream_timeout_ms))
            .default_headers(config.service.header()?)
            .build()?;
        // failsafe's exponential backoff counts in whole seconds from one.
        let open = Duration::from_millis(config.breaker_open_ms.max(1_000));
        let policy = failure_policy::success_rate_over_time_window(
            0.5,
            config.breaker_min_requests,
            Duration::from_secs(config.breaker_window_s.max(1)),
            backoff::exponential(open, open * 30),
        );
        Ok(Self {
            http,
            base: config.order_service_url.trim_end_matches('/').to_owned(),
            bulkhead: Arc::new(Semaphore::new(config.upstream_max_in_flight.max(1))),
            breaker: BreakerConfig::new().failure_policy(policy).build(),
            open_s: open.as_secs().max(1),
        })
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub fn client(&self) -> &reqwest::Client {
        &self.http
    }

    /// Sends `request` through the bulkhead and the breaker. A 4xx answer is
    /// returned for the caller to relay; everything else failing is a 503.
    pub async fn send(
        &self,
        request: reqwest::RequestBuilder,
    ) -> Result<reqwest::Response, Problem> {
        let Ok(_permit) = self.bulkhead.try_acquire() else {
            return Err(Problem::unavailable(
                "upstream-unavailable",
                "too many calls to the order service in flight",
                1,
            ));
        };
        let call = async {
            match request.send().await {
                Ok(response) if response.status().is_server_error() => {
                    Err(Failure::Status(response))
                }
                Ok(response) => Ok(response),
                Err(error) => Err(Failure::Transport(error)),
            }
        };
        match self.breaker.call(call).await {
            Ok(response) => Ok(response),
            Err(failsafe::Error::Rejected) => Err(Problem::unavailable(
                "upstream-unavailable",
                "the order service is failing; calls are paused (circuit open)",
                self.open_s,
            )),
            Err(failsafe::Error::Inner(Failure::Status(response))) => {
                tracing::warn!(status = %response.status(), "order service failed");
                Err(Problem::unavailable(
                    "upstream-unavailable",
                    "the order service failed",
                    2,
                ))
            }
            Err(failsafe::Error::Inner(Failure::Transport(error))) => {
                tracing::warn!(%error, "order service call failed");
                Err(Problem::unavailable(
                    "upstream-unavailable",
                    "the order service is unavailable",
                    2,
                ))
            }
        }
    }
}
