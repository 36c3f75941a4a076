//! The fake payment provider: `order-service payment-provider`, real HTTP,
//! so the saga's resilience can be tested against the failures real
//! providers have.
//!
//! | method, path | does |
//! | --- | --- |
//! | `POST /v1/charges` `{idempotency_key, amount_cents}` | captures (201), or answers the key's earlier outcome (200); 409 if the key was voided or refunded |
//! | `GET /v1/charges/{key}` | the charge under a key, 404 if none |
//! | `POST /v1/charges/{key}/refund` | gives a capture back (idempotent) |
//! | `POST /v1/charges/{key}/void` | closes a key that has no capture, so a late charge under it is refused; 409 with the capture if there is one |
//! | `GET /v1/charges` | every key with how many times money was taken under it (tests count double charges here) |
//! | `GET`/`PUT /v1/knobs` | the fault knobs, live |
//! | `GET /v1/stats` | requests that reached the provider, and the faults chance chose |
//!
//! Knobs: `latency_ms` before every answer; then per request, by chance,
//! `error_rate` → 503 with nothing applied, `timeout_rate` → hangs for
//! `hang_ms` with nothing applied, `lost_rate` → applied, then hangs for
//! `hang_ms` (the answer is lost to a caller that gave up);
//! `decline_rate` → a new charge is declined. The knob, stats and
//! charge-list endpoints never fail.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use boxoffice_contract::auth::{ServiceAuth, ServiceTokenArgs};
use boxoffice_contract::extract::{Json, Path};
use boxoffice_contract::Problem;
use clap::Args;
use rand::Rng;
use serde::{Deserialize, Serialize};

use super::{Charge, ChargeRequest, ChargeStatus};

/// The fault knobs; every field can be changed live with `PUT /v1/knobs`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Args)]
#[serde(deny_unknown_fields, default)]
pub struct Knobs {
    /// Delay before every answer.
    #[arg(long, env = "PROVIDER_LATENCY_MS", default_value_t = 0)]
    pub latency_ms: u64,
    /// Share of requests answered 503 with nothing applied.
    #[arg(long, env = "PROVIDER_ERROR_RATE", default_value_t = 0.0)]
    pub error_rate: f64,
    /// Share of requests that hang for `hang_ms` with nothing applied.
    #[arg(long, env = "PROVIDER_TIMEOUT_RATE", default_value_t = 0.0)]
    pub timeout_rate: f64,
    /// Share of requests applied whose answer is then lost (hangs for `hang_ms`).
    #[arg(long, env = "PROVIDER_LOST_RATE", default_value_t = 0.0)]
    pub lost_rate: f64,
    /// Share of new charges the card declines.
    #[arg(long, env = "PROVIDER_DECLINE_RATE", default_value_t = 0.0)]
    pub decline_rate: f64,
    /// How long a timed-out or lost request hangs before it gives a 504.
    #[arg(long, env = "PROVIDER_HANG_MS", default_value_t = 30_000)]
    pub hang_ms: u64,
}

impl Default for Knobs {
    fn default() -> Self {
        Self {
            latency_ms: 0,
            error_rate: 0.0,
            timeout_rate: 0.0,
            lost_rate: 0.0,
            decline_rate: 0.0,
            hang_ms: 30_000,
        }
    }
}

impl Knobs {
    fn check(&self) -> Result<(), Problem> {
        let rates = [
            ("error_rate", self.error_rate),
            ("timeout_rate", self.timeout_rate),
            ("lost_rate", self.lost_rate),
            ("decline_rate", self.decline_rate),
        ];
        for (name, rate) in rates {
            if !(0.0..=1.0).contains(&rate) {
                return Err(invalid(name, "a share between 0 and 1"));
            }
        }
        if self.error_rate + self.timeout_rate + self.lost_rate > 1.0 {
            return Err(invalid(
                "error_rate",
                "error_rate + timeout_rate + lost_rate at most 1",
            ));
        }
        Ok(())
    }
}

fn invalid(field: &str, expected: &str) -> Problem {
    Problem::new(
        StatusCode::UNPROCESSABLE_ENTITY,
        "invalid-field",
        format!("{field} must be {expected}"),
    )
}

#[derive(Debug, Clone, Args)]
pub struct ProviderConfig {
    #[arg(long, env = "PROVIDER_LISTEN", default_value = "127.0.0.1:8084")]
    pub listen: String,
    /// API key (≥ 32 bytes) every `/v1/*` call must carry as
    /// `Authorization: Bearer`, the charges and the knobs alike.
    #[arg(long, env = "PAYMENT_API_KEY", hide_env_values = true)]
    pub api_key: String,
    /// Accept a well-known development value for the API key. Never in production.
    #[arg(long, env = "BOXOFFICE_ALLOW_DEV_SECRETS")]
    pub allow_dev_secrets: bool,
    #[command(flatten)]
    pub knobs: Knobs,
}

/// One key's record, with how many times money was actually taken under it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Record {
    #[serde(flatten)]
    pub charge: Charge,
    pub captures: u32,
}

#[derive(Clone, Default)]
pub struct Provider {
    /// Who may call `/v1/*`; `None` (tests that want no key) lets anyone.
    api_key: Option<ServiceAuth>,
    knobs: Arc<RwLock<Knobs>>,
    charges: Arc<Mutex<HashMap<String, Record>>>,
    stats: Arc<Counters>,
}

#[derive(Default)]
struct Counters {
    requests: AtomicU64,
    errors: AtomicU64,
    timeouts: AtomicU64,
    lost: AtomicU64,
}

/// How many requests reached the provider and which faults chance chose.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stats {
    pub requests: u64,
    pub errors: u64,
    pub timeouts: u64,
    pub lost: u64,
}

/// What chance decided for one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    None,
    Error,
    Timeout,
    Lost,
}

impl Provider {
    pub fn new(knobs: Knobs) -> Self {
        Self {
            knobs: Arc::new(RwLock::new(knobs)),
            ..Self::default()
        }
    }

    /// Every `/v1/*` call must then carry `Authorization: Bearer <key>`.
    pub fn with_api_key(mut self, key: &str) -> Self {
        self.api_key = Some(ServiceTokenArgs::new(key).acceptor());
        self
    }

    fn knobs(&self) -> Knobs {
        self.knobs.read().expect("knobs lock").clone()
    }

    /// Sleeps the latency and rolls the dice for one request.
    async fn fault(&self) -> (Fault, Knobs) {
        let knobs = self.knobs();
        if knobs.latency_ms > 0 {
            tokio::time::sleep(Duration::from_millis(knobs.latency_ms)).await;
        }
        let roll: f64 = rand::thread_rng().gen();
        let stats = &self.stats;
        stats.requests.fetch_add(1, Ordering::Relaxed);
        let fault = if roll < knobs.error_rate {
            Fault::Error
        } else if roll < knobs.error_rate + knobs.timeout_rate {
            Fault::Timeout
        } else if roll < knobs.error_rate + knobs.timeout_rate + knobs.lost_rate {
            Fault::Lost
        } else {
            Fault::None
        };
        match fault {
            Fault::None => {}
            Fault::Error => _ = stats.errors.fetch_add(1, Ordering::Relaxed),
            Fault::Timeout => _ = stats.timeouts.fetch_add(1, Ordering::Relaxed),
            Fault::Lost => _ = stats.lost.fetch_add(1, Ordering::Relaxed),
        }
        (fault, knobs)
    }

    /// Runs `apply` (or not) as the dice say and answers accordingly.
    async fn with_faults(&self, apply: impl FnOnce(&Self) -> Response) -> Response {
        let (fault, knobs) = self.fault().await;
        let hang = Duration::from_millis(knobs.hang_ms);
        match fault {
            Fault::None => apply(self),
            Fault::Error => Problem::unavailable(
                "provider-error",
                "the payment provider failed; nothing was applied",
                1,
            )
            .into_response(),
            Fault::Timeout => {
                tokio::time::sleep(hang).await;
                StatusCode::GATEWAY_TIMEOUT.into_response()
            }
            Fault::Lost => {
                let _applied = apply(self);
                tokio::time::sleep(hang).await;
                StatusCode::GATEWAY_TIMEOUT.into_response()
            }
        }
    }

    fn charge(&self, request: &ChargeRequest) -> Response {
        let decline = rand::thread_rng().gen::<f64>() < self.knobs().decline_rate;
        let mut charges = self.charges.lock().expect("charges lock");
        if let Some(record) = charges.get(&request.idempotency_key) {
            let status = match record.charge.status {
                ChargeStatus::Captured | ChargeStatus::Declined => StatusCode::OK,
                ChargeStatus::Refunded | ChargeStatus::Voided => StatusCode::CONFLICT,
            };
            return (status, axum::Json(record.charge.clone())).into_response();
        }
        let charge = Charge {
            idempotency_key: request.idempotency_key.clone(),
            amount_cents: request.amount_cents,
            status: if decline {
                ChargeStatus::Declined
            } else {
                ChargeStatus::Captured
            },
        };
        let captures = u32::from(!decline);
        charges.insert(
            request.idempotency_key.clone(),
            Record {
                charge: charge.clone(),
                captures,
            },
        );
        (StatusCode::CREATED, axum::Json(charge)).into_response()
    }

    fn lookup(&self, key: &str) -> Response {
        match self.charges.lock().expect("charges lock").get(key) {
            Some(record) => axum::Json(record.charge.clone()).into_response(),
            None => no_charge(key).into_response(),
        }
    }

    fn refund(&self, key: &str) -> Response {
        let mut charges = self.charges.lock().expect("charges lock");
        let Some(record) = charges.get_mut(key) else {
            return no_charge(key).into_response();
        };
        match record.charge.status {
            ChargeStatus::Captured | ChargeStatus::Refunded => {
                record.charge.status = ChargeStatus::Refunded;
                axum::Json(record.charge.clone()).into_response()
            }
            ChargeStatus::Declined | ChargeStatus::Voided => {
                (StatusCode::CONFLICT, axum::Json(record.charge.clone())).into_response()
            }
        }
    }

    fn void(&self, key: &str) -> Response {
        let mut charges = self.charges.lock().expect("charges lock");
        let record = charges.entry(key.to_owned()).or_insert_with(|| Record {
            charge: Charge {
                idempotency_key: key.to_owned(),
                amount_cents: 0,
                status: ChargeStatus::Voided,
            },
            captures: 0,
        });
        let status = match record.charge.status {
            ChargeStatus::Captured | ChargeStatus::Refunded => StatusCode::CONFLICT,
            ChargeStatus::Declined | ChargeStatus::Voided => StatusCode::OK,
        };
        (status, axum::Json(record.charge.clone())).into_response()
    }

    pub fn stats(&self) -> Stats {
        let read = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        Stats {
            requests: read(&self.stats.requests),
            errors: read(&self.stats.errors),
            timeouts: read(&self.stats.timeouts),
            lost: read(&self.stats.lost),
        }
    }

    /// Every key's record (for tests and demos).
    pub fn records(&self) -> Vec<Record> {
        let charges = self.charges.lock().expect("charges lock");
        let mut all: Vec<Record> = charges.values().cloned().collect();
        all.sort_by(|a, b| a.charge.idempotency_key.cmp(&b.charge.idempotency_key));
        all
    }
}

fn no_charge(key: &str) -> Problem {
    Problem::not_found("no-charge", format!("no charge under key {key}"))
}

fn check_key(key: &str) -> Result<(), Problem> {
    if key.is_empty() || key.len() > 128 {
        return Err(invalid("idempotency_key", "1 to 128 characters"));
    }
    Ok(())
}

pub fn router(provider: Provider) -> Router {
    let mut api = Router::new()
        .route("/v1/charges", post(post_charge).get(list_charges))
        .route("/v1/charges/{key}", get(get_charge))
        .route("/v1/charges/{key}/refund", post(post_refund))
        .route("/v1/charges/{key}/void", post(post_void))
        .route("/v1/knobs", get(get_knobs).put(put_knobs))
        .route("/v1/stats", get(get_stats));
    if let Some(key) = provider.api_key.clone() {
        api = api.route_layer(axum::middleware::from_fn_with_state(
            key,
            boxoffice_contract::auth::require_service,
        ));
    }
    let routes = api.route("/healthz", get(|| async { "ok" }));
    boxoffice_contract::problem::with_fallbacks(routes).with_state(provider)
}

async fn post_charge(
    State(provider): State<Provider>,
    Json(request): Json<ChargeRequest>,
) -> Result<Response, Problem> {
    check_key(&request.idempotency_key)?;
    if request.amount_cents < 0 {
        return Err(invalid("amount_cents", "zero or more"));
    }
    Ok(provider.with_faults(|p| p.charge(&request)).await)
}

async fn get_charge(State(provider): State<Provider>, Path(key): Path<String>) -> Response {
    provider.with_faults(|p| p.lookup(&key)).await
}

async fn post_refund(State(provider): State<Provider>, Path(key): Path<String>) -> Response {
    provider.with_faults(|p| p.refund(&key)).await
}

async fn post_void(State(provider): State<Provider>, Path(key): Path<String>) -> Response {
    provider.with_faults(|p| p.void(&key)).await
}

async fn list_charges(State(provider): State<Provider>) -> axum::Json<Vec<Record>> {
    axum::Json(provider.records())
}

async fn get_stats(State(provider): State<Provider>) -> axum::Json<Stats> {
    axum::Json(provider.stats())
}

async fn get_knobs(State(provider): State<Provider>) -> axum::Json<Knobs> {
    axum::Json(provider.knobs())
}

async fn put_knobs(
    State(provider): State<Provider>,
    Json(knobs): Json<Knobs>,
) -> Result<axum::Json<Knobs>, Problem> {
    knobs.check()?;
    *provider.knobs.write().expect("knobs lock") = knobs.clone();
    tracing::info!(?knobs, "payment provider knobs changed");
    Ok(axum::Json(knobs))
}

/// Serves the fake provider on `listener` until `shutdown` resolves.
pub async fn serve(
    listener: tokio::net::TcpListener,
    provider: Provider,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    axum::serve(listener, router(provider))
        .with_graceful_shutdown(shutdown)
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(key: &str) -> ChargeRequest {
        ChargeRequest {
            idempotency_key: key.into(),
            amount_cents: 100,
        }
    }

    #[test]
    fn a_key_is_charged_once_however_often_it_is_sent() {
        let provider = Provider::default();
        assert_eq!(provider.charge(&request("k")).status(), StatusCode::CREATED);
        assert_eq!(provider.charge(&request("k")).status(), StatusCode::OK);
        let records = provider.records();
        assert_eq!(records.len(), 1);
        assert_eq!(records[0].captures, 1);
    }

    #[test]
    fn a_voided_key_refuses_a_late_charge() {
        let provider = Provider::default();
        assert_eq!(provider.void("k").status(), StatusCode::OK);
        assert_eq!(
            provider.charge(&request("k")).status(),
            StatusCode::CONFLICT
        );
        assert_eq!(provider.records()[0].captures, 0);
    }

    #[test]
    fn voiding_a_capture_is_refused() {
        let provider = Provider::default();
        provider.charge(&request("k"));
        assert_eq!(provider.void("k").status(), StatusCode::CONFLICT);
        assert_eq!(provider.records()[0].charge.status, ChargeStatus::Captured);
    }

    #[test]
    fn refunds_are_idempotent_and_need_a_capture() {
        let provider = Provider::default();
        assert_eq!(provider.refund("k").status(), StatusCode::NOT_FOUND);
        provider.charge(&request("k"));
        assert_eq!(provider.refund("k").status(), StatusCode::OK);
        assert_eq!(provider.refund("k").status(), StatusCode::OK);
        assert_eq!(provider.records()[0].charge.status, ChargeStatus::Refunded);
    }

    #[test]
    fn knob_rates_must_be_shares() {
        let mut knobs = Knobs {
            error_rate: 1.5,
            ..Knobs::default()
        };
        assert!(knobs.check().is_err());
        knobs.error_rate = 0.6;
        knobs.lost_rate = 0.6;
        assert!(knobs.check().is_err());
        knobs.lost_rate = 0.4;
        assert!(knobs.check().is_ok());
    }
}
