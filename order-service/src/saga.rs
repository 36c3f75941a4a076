//! The purchase saga, orchestrated and persisted in Postgres.
//!
//! | status | next step (one local transaction) | then |
//! | --- | --- | --- |
//! | `reserved` | charge, idempotency key = order id (the pivot) | `charged` |
//! | `charged` | seats held → sold; order confirmed + outbox `OrderConfirmed` | `confirmed` |
//!
//! Steps 1-2 (order `pending` + seat hold) happen in [`store::place_order`]
//! when the fan buys, so "sold out" is answered synchronously. The charge here
//! is a recorded step that always succeeds; the payment provider, its
//! resilience layers and the compensations (release, refund) slot in as the
//! `reserved → charged` transition. Each runner claims one order with
//! `FOR UPDATE SKIP LOCKED`, so replicas share the work and a restarted
//! process resumes every saga from its last committed status.

use std::time::Duration;

use boxoffice_contract::envelope::{CloudEvent, OrderConfirmed, ORDER_CONFIRMED_V1};
use tokio_util::sync::CancellationToken;

use crate::store::{self, Order, StoreError};
use crate::AppState;

/// What the saga does next for an order in a given status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    Charge,
    SellAndConfirm,
}

impl Step {
    /// `None` for statuses the saga has finished with (or never started).
    pub fn after(status: &str) -> Option<Self> {
        match status {
            "reserved" => Some(Self::Charge),
            "charged" => Some(Self::SellAndConfirm),
            _ => None,
        }
    }
}

/// One saga runner: advances orders until cancelled, sleeping when idle.
pub async fn run(state: AppState, runner: usize, cancel: CancellationToken) {
    tracing::debug!(runner, "saga runner started");
    while !cancel.is_cancelled() {
        match advance_one(&state.pool).await {
            Ok(true) => continue,
            Ok(false) => {}
            Err(error) => tracing::warn!(runner, %error, "saga step failed; retrying"),
        }
        tokio::select! {
            () = cancel.cancelled() => break,
            () = state.saga_wakeup.notified() => {}
            () = tokio::time::sleep(Duration::from_millis(500)) => {}
        }
    }
}

/// Advances one unfinished order by one step; `false` when there was none.
pub async fn advance_one(pool: &sqlx::PgPool) -> Result<bool, StoreError> {
    let mut tx = pool.begin().await?;
    let Some(order) = store::claim_unfinished(&mut tx).await? else {
        return Ok(false);
    };
    match Step::after(&order.status) {
        Some(Step::Charge) => {
            store::record_payment(&mut tx, order.order_id, order.amount_cents).await?;
            store::set_status(&mut tx, order.order_id, "charged").await?;
        }
        Some(Step::SellAndConfirm) => {
            let first_seat =
                store::sell_held_seats(&mut tx, &order.event_id, order.quantity).await?;
            let event = confirmed_event(&order, first_seat);
            let payload = serde_json::to_value(&event).expect("serializing an envelope");
            store::confirm(
                &mut tx,
                order.order_id,
                first_seat,
                ORDER_CONFIRMED_V1,
                &payload,
            )
            .await?;
            tracing::info!(order_id = %order.order_id, first_seat, "order confirmed");
        }
        None => {}
    }
    tx.commit().await?;
    Ok(true)
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

    #[test]
    fn a_held_order_is_charged_next() {
        assert_eq!(Step::after("reserved"), Some(Step::Charge));
    }

    #[test]
    fn a_charged_order_is_sold_and_confirmed_next() {
        assert_eq!(Step::after("charged"), Some(Step::SellAndConfirm));
    }

    #[test]
    fn finished_orders_have_no_next_step() {
        for status in ["confirmed", "failed", "cancelled", "pending", "nonsense"] {
            assert_eq!(Step::after(status), None, "{status}");
        }
    }
}
