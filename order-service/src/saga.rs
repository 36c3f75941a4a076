//! The purchase saga, orchestrated and persisted in Postgres.
//!
//! | status | hold | step | outcome → next status |
//! | --- | --- | --- | --- |
//! | `reserved` | live | [`Step::Charge`]: charge, idempotency key = order id (the pivot) | captured → `charged`; declined → `failed` + seats released; unknown → reconcile by key, else retry later |
//! | `reserved` | expired | [`Step::Sweep`]: void the key at the provider (reconcile and close in one call) | captured after all → `charged`; nothing taken → `failed` + seats released |
//! | `charged` | — | [`Step::SellAndConfirm`]: seats held → sold; order `confirmed` + outbox `OrderConfirmed`, one transaction | `confirmed` (retried until done) |
//! | `failed` with a capture | — | refund (compensation of the charge), under its own lease and backoff | payment `refunded` |
//!
//! Steps 1-2 (the order and its seat hold) happen in [`store::place_order`]
//! when the fan buys, so "sold out" is answered synchronously. Everything
//! before the pivot is compensable (release the seats, void or refund the
//! charge); everything after it is retried until done.
//!
//! Runners claim due orders under a lease ([`store::claim_due`]), so several
//! runners and replicas share the work, no transaction stays open across a
//! payment call, and a crashed runner's order is taken up again when its
//! lease ends. Every step is safe to repeat: the provider is idempotent per
//! key and every state change is conditional on the status it leaves.

use std::time::Duration;

use boxoffice_contract::envelope::{CloudEvent, OrderConfirmed, ORDER_CONFIRMED_V1};
use boxoffice_contract::otlp;
use boxoffice_contract::trace::TraceContext;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::payments::client::PaymentError;
use crate::payments::{Charge, ChargeStatus};
use crate::store::{self, Claimed, Order, StoreError};
use crate::AppState;

/// What the saga does next for an order it has claimed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    Charge,
    /// The hold ran out before the charge was settled.
    Sweep,
    SellAndConfirm,
}

impl Step {
    /// `None` for statuses the saga has finished with.
    pub fn next(status: &str, hold_expired: bool) -> Option<Self> {
        match (status, hold_expired) {
            ("pending" | "reserved", false) => Some(Self::Charge),
            ("pending" | "reserved", true) => Some(Self::Sweep),
            ("charged", _) => Some(Self::SellAndConfirm),
            _ => None,
        }
    }
}

/// What a provider answer means for a held order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// The money is taken: past the pivot.
    Charged,
    /// Nothing was or will be taken: release the seats and fail the order.
    Fail(&'static str),
    /// The charge may or may not have happened: ask the provider by key.
    Reconcile,
    /// Nothing known changed; take the order up again later.
    RetryLater,
}

fn by_status(charge: &Charge, fail: &'static str) -> Decision {
    match charge.status {
        ChargeStatus::Captured => Decision::Charged,
        ChargeStatus::Declined => Decision::Fail("payment-declined"),
        ChargeStatus::Voided | ChargeStatus::Refunded => Decision::Fail(fail),
    }
}

impl Decision {
    pub fn after_charge(result: &Result<Charge, PaymentError>) -> Self {
        match result {
            Ok(charge) => by_status(charge, "payment-cancelled"),
            Err(PaymentError::Unknown(_)) => Self::Reconcile,
            Err(PaymentError::NotSent(_) | PaymentError::Unexpected(_)) => Self::RetryLater,
        }
    }

    /// After a charge whose outcome was unknown: only the provider's record
    /// decides; no record (yet) or no answer means try again later, never
    /// compensate.
    pub fn after_lookup(result: &Result<Option<Charge>, PaymentError>) -> Self {
        match result {
            Ok(Some(charge)) => by_status(charge, "payment-cancelled"),
            Ok(None) | Err(_) => Self::RetryLater,
        }
    }

    /// At hold expiry, after voiding the key: compensate only when the
    /// provider confirms nothing was taken.
    pub fn after_void(result: &Result<Charge, PaymentError>) -> Self {
        match result {
            Ok(charge) => by_status(charge, "hold-expired"),
            Err(_) => Self::RetryLater,
        }
    }
}

/// Waits before an order is taken up again after its `attempts`-th claim:
/// doubling from half a second, at most 30 s.
pub fn retry_delay(attempts: i32) -> Duration {
    let exponent = attempts.clamp(1, 7) as u32 - 1;
    Duration::from_millis(500 * 2u64.pow(exponent)).min(Duration::from_secs(30))
}

/// An idle runner's first wait before it looks for due work again.
pub const IDLE_FIRST: Duration = Duration::from_millis(200);
/// An idle runner's longest wait: work that comes due by the clock (a
/// retry, a lapsed hold, another replica's lease ended) is taken up at most
/// this late.
pub const IDLE_MAX: Duration = Duration::from_secs(2);

/// How long an idle runner waits after `idle_turns` looks that found
/// nothing: [`IDLE_FIRST`], doubling, at most [`IDLE_MAX`]. Work due `d`
/// after a runner's last piece of work is so taken up less than
/// `min(d + IDLE_FIRST, IDLE_MAX)` late, and an idle service looks only
/// once per [`IDLE_MAX`] per runner.
pub fn idle_pause(idle_turns: u32) -> Duration {
    IDLE_FIRST
        .saturating_mul(2u32.saturating_pow(idle_turns.min(16)))
        .min(IDLE_MAX)
}

/// One saga runner: advances orders and refunds until cancelled, waiting
/// ever longer ([`idle_pause`]) while there is nothing to do. A new order
/// wakes one runner at once (`saga_wakeup`); a runner that found work wakes
/// the next, so a burst brings every runner in. Refunds go first on every
/// other turn, so a stream of due orders cannot starve them.
pub async fn run(state: AppState, runner: usize, cancel: CancellationToken) {
    tracing::debug!(runner, "saga runner started");
    let mut refunds_first = false;
    let mut idle_turns = 0;
    while !cancel.is_cancelled() {
        refunds_first = !refunds_first;
        match advance_one(&state, refunds_first).await {
            Ok(true) => {
                idle_turns = 0;
                state.saga_wakeup.notify_one();
                continue;
            }
            Ok(false) => {}
            Err(error) => tracing::warn!(runner, %error, "saga step failed; retrying"),
        }
        let pause = idle_pause(idle_turns);
        idle_turns = idle_turns.saturating_add(1);
        tokio::select! {
            () = cancel.cancelled() => break,
            () = state.saga_wakeup.notified() => idle_turns = 0,
            () = tokio::time::sleep(pause) => {}
        }
    }
}

/// The lease a runner holds on an order: long enough for a charge and the
/// reconciling lookup, all retries included.
pub fn lease(state: &AppState) -> Duration {
    state.payments.config().call_budget() * 2 + Duration::from_secs(5)
}

/// Does one piece of due work, a refund or one step of an order, trying
/// refunds first if `refunds_first`; `false` when there was nothing to do.
#[allow(
    clippy::if_same_then_else,
    reason = "the arms differ in which step goes first, which is the point"
)]
pub async fn advance_one(state: &AppState, refunds_first: bool) -> Result<bool, StoreError> {
    if refunds_first {
        Ok(refund_one(state).await? || step_one(state).await?)
    } else {
        Ok(step_one(state).await? || refund_one(state).await?)
    }
}

/// Advances one due order by one step; `false` when none was due.
async fn step_one(state: &AppState) -> Result<bool, StoreError> {
    let Some(claimed) = store::claim_due(&state.pool, lease(state)).await? else {
        return Ok(false);
    };
    let Claimed {
        order,
        hold_expired,
        attempts,
        traceparent,
    } = claimed;
    // A span under the request that placed the order; the confirmation hands
    // it on through the outbox row to the ticket worker.
    let (trace, parent) = TraceContext::span_under(traceparent.as_deref());
    let span = tracing::info_span!(
        "saga",
        order_id = %order.order_id,
        trace_id = %trace.trace_id_hex(),
        span_id = %trace.span_id_hex(),
        parent_span_id = %parent
    );
    let step = Step::next(&order.status, hold_expired);
    let mut exported = otlp::Span::start(
        crate::SERVICE,
        match step {
            Some(Step::Charge) => "saga charge",
            Some(Step::Sweep) => "saga sweep",
            Some(Step::SellAndConfirm) | None => "saga confirm",
        },
        otlp::Kind::Internal,
        &trace,
        parent,
    );
    if exported.is_recording() {
        exported.set_attribute(otlp::Attribute::new(
            "boxoffice.order_id",
            order.order_id.to_string(),
        ));
    }
    let done = async {
        let key = order.order_id.to_string();
        match step {
            Some(Step::Charge) => {
                let result = state.payments.charge(&key, order.amount_cents).await;
                let mut decision = Decision::after_charge(&result);
                if decision == Decision::Reconcile {
                    tracing::info!(error = ?result.err(), "charge outcome unknown; reconciling by key");
                    decision = Decision::after_lookup(&state.payments.lookup(&key).await);
                }
                apply(state, &order, decision, attempts, &trace).await
            }
            Some(Step::Sweep) => {
                let decision = Decision::after_void(&state.payments.void(&key).await);
                apply(state, &order, decision, attempts, &trace).await
            }
            Some(Step::SellAndConfirm) => sell_and_confirm(state, &order, &trace).await,
            None => Ok(()),
        }
    }
    .instrument(span)
    .await;
    if let Err(error) = &done {
        exported.set_status(otlp::Status::error(error.to_string()));
    }
    done?;
    Ok(true)
}

async fn apply(
    state: &AppState,
    order: &Order,
    decision: Decision,
    attempts: i32,
    trace: &TraceContext,
) -> Result<(), StoreError> {
    match decision {
        Decision::Charged => {
            if store::mark_charged(&state.pool, order.order_id, order.amount_cents).await? {
                count("charged");
                sell_and_confirm(state, order, trace).await?;
            } else {
                tracing::warn!(order_id = %order.order_id, "captured after the order failed; refunding");
            }
        }
        Decision::Fail(reason) => {
            if let Some((event_id, stock)) =
                store::fail_and_release(&state.pool, order.order_id, reason).await?
            {
                count("failed");
                tracing::info!(order_id = %order.order_id, reason, "order failed; seats released");
                state.stock.publish(&event_id, stock).await;
            }
        }
        Decision::Reconcile | Decision::RetryLater => {
            let delay = retry_delay(attempts);
            tracing::info!(order_id = %order.order_id, attempts, ?delay, "payment unsettled; retrying later");
            store::retry_later(&state.pool, order.order_id, delay).await?;
        }
    }
    Ok(())
}

/// Step 4 and 5 in one transaction: seats held → sold, order confirmed and
/// its `OrderConfirmed` written to the outbox.
async fn sell_and_confirm(
    state: &AppState,
    order: &Order,
    trace: &TraceContext,
) -> Result<(), StoreError> {
    let mut tx = state.pool.begin().await?;
    if !store::lock_charged(&mut tx, order.order_id).await? {
        return Ok(());
    }
    let (first_seat, stock) =
        store::sell_held_seats(&mut tx, &order.event_id, order.quantity).await?;
    let event = confirmed_event(order, first_seat);
    let payload = serde_json::to_value(&event).expect("serializing an envelope");
    store::confirm(
        &mut tx,
        order.order_id,
        first_seat,
        ORDER_CONFIRMED_V1,
        &payload,
        &trace.to_string(),
    )
    .await?;
    tx.commit().await?;
    state.stock.publish(&order.event_id, stock).await;
    count("confirmed");
    tracing::info!(order_id = %order.order_id, first_seat, "order confirmed");
    Ok(())
}

/// Compensation of the charge: gives back one capture whose order failed,
/// claimed under a lease so no transaction stays open across the provider
/// call; a refund not done is tried again after [`retry_delay`]. `false`
/// when no refund was due.
async fn refund_one(state: &AppState) -> Result<bool, StoreError> {
    let Some((order_id, attempts)) = store::claim_refund(&state.pool, lease(state)).await? else {
        return Ok(false);
    };
    match state.payments.refund(&order_id.to_string()).await {
        Ok(charge) if charge.status == ChargeStatus::Refunded => {
            store::mark_refunded(&state.pool, order_id).await?;
            tracing::info!(%order_id, "capture refunded");
        }
        outcome => {
            let delay = retry_delay(attempts);
            tracing::warn!(%order_id, attempts, ?delay, ?outcome, "refund not done; retrying later");
            store::refund_later(&state.pool, order_id, delay).await?;
        }
    }
    Ok(true)
}

fn count(status: &'static str) {
    metrics::counter!("boxoffice_orders_total", "status" => status).increment(1);
}

/// The CloudEvent announcing a confirmed order; its id is made here, once.
pub fn confirmed_event(order: &Order, first_seat: i32) -> CloudEvent<OrderConfirmed> {
    CloudEvent::new(
        ORDER_CONFIRMED_V1,
        order.order_id.to_string(),
        OrderConfirmed {
            order_id: order.order_id,
            event_id: order.event_id.clone(),
            fan_id: order.fan_id.clone(),
            quantity: order.quantity,
            first_seat,
            amount_cents: order.amount_cents,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn charge(status: ChargeStatus) -> Charge {
        Charge {
            idempotency_key: "k".into(),
            amount_cents: 100,
            status,
        }
    }

    #[test]
    fn a_held_order_is_charged_next() {
        assert_eq!(Step::next("reserved", false), Some(Step::Charge));
    }

    #[test]
    fn a_held_order_past_its_hold_is_swept() {
        assert_eq!(Step::next("reserved", true), Some(Step::Sweep));
    }

    #[test]
    fn a_charged_order_is_sold_and_confirmed_next_even_past_its_hold() {
        assert_eq!(Step::next("charged", false), Some(Step::SellAndConfirm));
        assert_eq!(Step::next("charged", true), Some(Step::SellAndConfirm));
    }

    #[test]
    fn finished_orders_have_no_next_step() {
        for status in ["confirmed", "failed", "cancelled", "nonsense"] {
            assert_eq!(Step::next(status, false), None, "{status}");
        }
    }

    #[test]
    fn a_capture_passes_the_pivot() {
        let captured = Ok(charge(ChargeStatus::Captured));
        assert_eq!(Decision::after_charge(&captured), Decision::Charged);
        assert_eq!(
            Decision::after_lookup(&Ok(Some(charge(ChargeStatus::Captured)))),
            Decision::Charged
        );
        assert_eq!(Decision::after_void(&captured), Decision::Charged);
    }

    #[test]
    fn a_decline_releases_the_seats() {
        let declined = Ok(charge(ChargeStatus::Declined));
        assert_eq!(
            Decision::after_charge(&declined),
            Decision::Fail("payment-declined")
        );
    }

    #[test]
    fn an_unknown_charge_is_reconciled_never_compensated() {
        let unknown = Err(PaymentError::Unknown("timed out".into()));
        assert_eq!(Decision::after_charge(&unknown), Decision::Reconcile);
        // The lookup finds nothing (yet) or does not answer: retry, keep the seats.
        assert_eq!(Decision::after_lookup(&Ok(None)), Decision::RetryLater);
        assert_eq!(
            Decision::after_lookup(&Err(PaymentError::Unknown("down".into()))),
            Decision::RetryLater
        );
    }

    #[test]
    fn a_call_refused_on_our_side_is_retried_later() {
        let open = Err(PaymentError::NotSent("circuit open"));
        assert_eq!(Decision::after_charge(&open), Decision::RetryLater);
    }

    #[test]
    fn at_hold_expiry_only_a_confirmed_void_compensates() {
        assert_eq!(
            Decision::after_void(&Ok(charge(ChargeStatus::Voided))),
            Decision::Fail("hold-expired")
        );
        assert_eq!(
            Decision::after_void(&Err(PaymentError::Unknown("down".into()))),
            Decision::RetryLater
        );
    }

    #[test]
    fn idle_runners_wait_ever_longer_up_to_the_cap() {
        assert_eq!(idle_pause(0), IDLE_FIRST);
        assert_eq!(idle_pause(1), IDLE_FIRST * 2);
        assert_eq!(idle_pause(3), IDLE_FIRST * 8);
        assert_eq!(idle_pause(4), IDLE_MAX);
        assert_eq!(idle_pause(u32::MAX), IDLE_MAX);
    }

    #[test]
    fn retries_back_off_to_thirty_seconds() {
        assert_eq!(retry_delay(1), Duration::from_millis(500));
        assert_eq!(retry_delay(2), Duration::from_secs(1));
        assert_eq!(retry_delay(100), Duration::from_secs(30));
    }
}
