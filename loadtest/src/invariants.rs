//! The sale's invariants, checked in Postgres after a run:
//! 1. never oversold: `reserved + sold <= capacity`, and the confirmed
//!    quantities add up to `sold`;
//! 2. every confirmed order has exactly one `OrderConfirmed` effect: one
//!    outbox row, and (once the workers have caught up) exactly `quantity`
//!    tickets, no seat ticketed twice, no ticket without a confirmed order.

use serde::Serialize;
use sqlx::PgPool;

#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize)]
pub struct Report {
    pub capacity: i64,
    pub reserved: i64,
    pub sold: i64,
    pub confirmed_orders: i64,
    pub confirmed_quantity: i64,
    pub tickets: i64,
    /// Broken invariants, each said in a sentence; empty when all hold.
    pub violations: Vec<String>,
}

impl Report {
    pub fn holds(&self) -> bool {
        self.violations.is_empty()
    }
}

/// Checks one event. `tickets_due`: whether every confirmed order should have
/// its tickets by now (false while the workers may still be catching up).
pub async fn check(pool: &PgPool, event_id: &str, tickets_due: bool) -> sqlx::Result<Report> {
    let mut report = Report::default();
    let stock: Option<(i32, i32, i32)> =
        sqlx::query_as("SELECT capacity, reserved, sold FROM inventory WHERE event_id = $1")
            .bind(event_id)
            .fetch_optional(pool)
            .await?;
    let Some((capacity, reserved, sold)) = stock else {
        report
            .violations
            .push(format!("event {event_id} has no inventory row"));
        return Ok(report);
    };
    (report.capacity, report.reserved, report.sold) =
        (capacity.into(), reserved.into(), sold.into());
    if report.reserved + report.sold > report.capacity {
        report.violations.push(format!(
            "oversold: reserved {reserved} + sold {sold} > capacity {capacity}"
        ));
    }
    (report.confirmed_orders, report.confirmed_quantity) = sqlx::query_as(
        "SELECT count(*), coalesce(sum(quantity), 0)::bigint FROM orders WHERE event_id = $1 AND status = 'confirmed'",
    )
    .bind(event_id)
    .fetch_one(pool)
    .await?;
    if report.confirmed_quantity != report.sold {
        report.violations.push(format!(
            "confirmed quantities {} differ from sold {sold}",
            report.confirmed_quantity
        ));
    }
    let outbox_mismatch: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM orders o WHERE o.event_id = $1 AND o.status = 'confirmed'
         AND (SELECT count(*) FROM outbox x WHERE x.aggregate_id = o.order_id::text AND x.event_type = 'boxoffice.order.confirmed.v1') <> 1",
    )
    .bind(event_id)
    .fetch_one(pool)
    .await?;
    if outbox_mismatch > 0 {
        report.violations.push(format!(
            "{outbox_mismatch} confirmed orders without exactly one OrderConfirmed outbox row"
        ));
    }
    report.tickets = sqlx::query_scalar("SELECT count(*) FROM tickets WHERE event_id = $1")
        .bind(event_id)
        .fetch_one(pool)
        .await?;
    let wrong_sets: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM orders o WHERE o.event_id = $1 AND o.status = 'confirmed'
         AND (SELECT count(*) FROM tickets t WHERE t.order_id = o.order_id) NOT IN (0, o.quantity)",
    )
    .bind(event_id)
    .fetch_one(pool)
    .await?;
    if wrong_sets > 0 {
        report.violations.push(format!(
            "{wrong_sets} orders with a partial or doubled ticket set"
        ));
    }
    let orphans: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM tickets t JOIN orders o USING (order_id) WHERE t.event_id = $1 AND o.status <> 'confirmed'",
    )
    .bind(event_id)
    .fetch_one(pool)
    .await?;
    if orphans > 0 {
        report.violations.push(format!(
            "{orphans} tickets of orders that are not confirmed"
        ));
    }
    if tickets_due && report.tickets != report.confirmed_quantity {
        report.violations.push(format!(
            "{} tickets for {} confirmed seats",
            report.tickets, report.confirmed_quantity
        ));
    }
    Ok(report)
}
