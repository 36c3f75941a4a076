//! Payments: a fake provider to test against, and the resilient client the
//! saga charges through.
//!
//! - [`provider`]: the fake payment provider (`order-service payment-provider`),
//!   real HTTP, with knobs for latency, errors, timeouts and lost responses.
//! - [`client`]: bulkhead ▸ circuit breaker ▸ retry (full jitter, budget) ▸
//!   per-attempt timeout, and the provider's wire types.

pub mod client;
pub mod provider;

use serde::{Deserialize, Serialize};

/// A charge as the provider reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Charge {
    pub idempotency_key: String,
    pub amount_cents: i64,
    pub status: ChargeStatus,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChargeStatus {
    /// Money taken.
    Captured,
    /// The card said no; nothing was taken and nothing will be under this key.
    Declined,
    /// Captured, then given back.
    Refunded,
    /// Cancelled before any capture: a later charge under this key is refused.
    Voided,
}

/// Body of `POST /v1/charges`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ChargeRequest {
    pub idempotency_key: String,
    pub amount_cents: i64,
}
