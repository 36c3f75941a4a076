//! Every SQL statement of the order service, one function each.

use serde::Serialize;
use sqlx::{PgPool, Postgres, Transaction};
use uuid::Uuid;

/// What remains of an event's seats, with the version that orders the views.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, sqlx::FromRow)]
pub struct Stock {
    pub capacity: i32,
    pub reserved: i32,
    pub sold: i32,
    pub version: i64,
}

impl Stock {
    pub fn remaining(&self) -> i32 {
        self.capacity - self.reserved - self.sold
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow)]
pub struct Order {
    pub order_id: Uuid,
    pub event_id: String,
    pub fan_id: String,
    pub quantity: i32,
    pub amount_cents: i64,
    pub status: String,
    pub failure_reason: Option<String>,
    pub first_seat: Option<i32>,
}

/// The [`Order`] in a `query!` record that selects its columns (each query
/// has a record type of its own, so a function could not take them all).
macro_rules! order_of {
    ($r:ident) => {
        Order {
            order_id: $r.order_id,
            event_id: $r.event_id,
            fan_id: $r.fan_id,
            quantity: $r.quantity,
            amount_cents: $r.amount_cents,
            status: $r.status,
            failure_reason: $r.failure_reason,
            first_seat: $r.first_seat,
        }
    };
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("unknown event")]
    UnknownEvent,
    #[error("capacity {requested} is below the {committed} seats already reserved or sold")]
    CapacityBelowCommitted { requested: i32, committed: i32 },
    #[error("database: {0}")]
    Db(#[from] sqlx::Error),
}

/// Keeps the admission service's settings of an event; `false` if there is no such event.
pub async fn save_settings(
    pool: &PgPool,
    event_id: &str,
    settings: &serde_json::Value,
) -> Result<bool, StoreError> {
    Ok(sqlx::query!(
        "UPDATE events SET settings = $2, updated_at = now() WHERE event_id = $1",
        event_id,
        settings,
    )
    .execute(pool)
    .await?
    .rows_affected()
        == 1)
}

/// One event's kept settings, if it has any.
pub async fn settings(
    pool: &PgPool,
    event_id: &str,
) -> Result<Option<serde_json::Value>, StoreError> {
    Ok(sqlx::query_scalar!(
        r#"SELECT settings AS "settings!" FROM events WHERE event_id = $1 AND settings IS NOT NULL"#,
        event_id,
    )
    .fetch_optional(pool)
    .await?)
}

/// Every event's kept settings.
pub async fn all_settings(pool: &PgPool) -> Result<Vec<(String, serde_json::Value)>, StoreError> {
    Ok(sqlx::query!(
        r#"SELECT event_id, settings AS "settings!" FROM events WHERE settings IS NOT NULL ORDER BY event_id"#,
    )
    .fetch_all(pool)
    .await?
    .into_iter()
    .map(|r| (r.event_id, r.settings))
    .collect())
}

/// Creates an event with its inventory, or renames/re-prices/resizes it.
/// Capacity never drops below what is already reserved or sold.
pub async fn upsert_event(
    pool: &PgPool,
    event_id: &str,
    name: &str,
    capacity: i32,
    price_cents: i64,
) -> Result<Stock, StoreError> {
    let mut tx = pool.begin().await?;
    sqlx::query!(
        "INSERT INTO events (event_id, name, price_cents) VALUES ($1, $2, $3)
         ON CONFLICT (event_id) DO UPDATE SET name = $2, price_cents = $3, updated_at = now()",
        event_id,
        name,
        price_cents,
    )
    .execute(&mut *tx)
    .await?;
    let current: Option<Stock> = sqlx::query_as!(
        Stock,
        "SELECT capacity, reserved, sold, version FROM inventory WHERE event_id = $1 FOR UPDATE",
        event_id,
    )
    .fetch_optional(&mut *tx)
    .await?;
    if let Some(current) = current {
        let committed = current.reserved + current.sold;
        if capacity < committed {
            return Err(StoreError::CapacityBelowCommitted {
                requested: capacity,
                committed,
            });
        }
    }
    let stock: Stock = sqlx::query_as!(
        Stock,
        "INSERT INTO inventory (event_id, capacity) VALUES ($1, $2)
         ON CONFLICT (event_id) DO UPDATE SET capacity = $2, version = inventory.version + 1
         RETURNING capacity, reserved, sold, version",
        event_id,
        capacity,
    )
    .fetch_one(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(stock)
}

pub async fn stock(pool: &PgPool, event_id: &str) -> Result<Stock, StoreError> {
    sqlx::query_as!(
        Stock,
        "SELECT capacity, reserved, sold, version FROM inventory WHERE event_id = $1",
        event_id,
    )
    .fetch_optional(pool)
    .await?
    .ok_or(StoreError::UnknownEvent)
}

/// An order and how many of its tickets exist, in one round trip.
pub async fn order(pool: &PgPool, order_id: Uuid) -> Result<Option<(Order, i64)>, StoreError> {
    let row = sqlx::query!(
        r#"SELECT order_id, event_id, fan_id, quantity, amount_cents, status, failure_reason, first_seat,
                (SELECT count(*) FROM tickets t WHERE t.order_id = o.order_id) AS "tickets!"
         FROM orders o WHERE order_id = $1"#,
        order_id,
    )
    .fetch_optional(pool)
    .await?;
    Ok(row.map(|r| (order_of!(r), r.tickets)))
}

/// The outcome of placing an order.
#[derive(Debug)]
pub enum Placed {
    /// Seats are held; the saga takes it from here.
    Reserved(Order, Stock),
    /// This order id, or an order of this admission, was placed before: its
    /// current state and the Idempotency-Key it was placed with.
    Existing(Order, Option<String>),
    /// Not enough seats left; nothing was written.
    SoldOut(Stock),
    /// The fan's orders of this event (failed ones aside) already hold
    /// `held` of the `limit` seats one fan may buy; nothing was written.
    FanLimit { held: i64, limit: i64 },
}

/// Who buys: the admission (the access token's `jti`) and the key the
/// purchase was made with (the fan's Idempotency-Key, or one per admission).
#[derive(Debug, Clone, Copy)]
pub struct Admission<'a> {
    pub id: &'a str,
    pub idempotency_key: &'a str,
    /// The event's per-fan limit the edge checked this admission against:
    /// enforced here when PostgreSQL keeps no settings of the event.
    pub per_fan_limit: Option<u32>,
}

struct Found {
    order: Order,
    idempotency_key: Option<String>,
}

/// The order with this id, or else the order of this admission.
async fn existing(
    pool: &PgPool,
    order_id: Uuid,
    admission: Option<Admission<'_>>,
) -> Result<Option<Found>, StoreError> {
    let row = sqlx::query!(
        "SELECT order_id, event_id, fan_id, quantity, amount_cents, status, failure_reason, first_seat, idempotency_key
         FROM orders WHERE order_id = $1 OR admission_id = $2
         ORDER BY order_id = $1 DESC LIMIT 1",
        order_id,
        admission.map(|a| a.id),
    )
    .fetch_optional(pool)
    .await?;
    Ok(row.map(|r| Found {
        order: order_of!(r),
        idempotency_key: r.idempotency_key,
    }))
}

/// Steps 1 and 2 of the saga in one local transaction: the order row and its
/// seat hold. The conditional UPDATE on the inventory row is what makes
/// overselling impossible; the CHECK constraint is the second line.
/// With an admission, a second order of that admission is never written:
/// the first one is answered instead, for the caller to judge.
#[allow(clippy::too_many_arguments)]
pub async fn place_order(
    pool: &PgPool,
    order_id: Uuid,
    event_id: &str,
    fan_id: &str,
    quantity: i32,
    hold_s: i64,
    traceparent: Option<&str>,
    admission: Option<Admission<'_>>,
) -> Result<Placed, StoreError> {
    if let Some(found) = existing(pool, order_id, admission).await? {
        return Ok(Placed::Existing(found.order, found.idempotency_key));
    }
    let mut tx = pool.begin().await?;
    let event = sqlx::query!(
        r#"SELECT price_cents, (settings->>'per_fan_limit')::bigint AS "per_fan_limit?" FROM events WHERE event_id = $1"#,
        event_id,
    )
    .fetch_optional(&mut *tx)
    .await?
    .ok_or(StoreError::UnknownEvent)?;
    let price = event.price_cents;
    let limit = event
        .per_fan_limit
        .or_else(|| admission.and_then(|a| a.per_fan_limit).map(i64::from));
    // The per-fan limit spans every order of the fan at this event, however
    // many times it was admitted; one fan's purchases take turns here.
    if let Some(limit) = limit.filter(|l| *l > 0) {
        sqlx::query!(
            "SELECT pg_advisory_xact_lock(hashtextextended($1 || '/' || $2, 0))",
            event_id,
            fan_id,
        )
        .execute(&mut *tx)
        .await?;
        let held: i64 = sqlx::query_scalar!(
            r#"SELECT coalesce(sum(quantity), 0) AS "held!" FROM orders
             WHERE event_id = $1 AND fan_id = $2 AND status NOT IN ('failed', 'cancelled')"#,
            event_id,
            fan_id,
        )
        .fetch_one(&mut *tx)
        .await?;
        if held + i64::from(quantity) > limit {
            tx.rollback().await?;
            return Ok(Placed::FanLimit { held, limit });
        }
    }
    let held: Option<Stock> = sqlx::query_as!(
        Stock,
        "UPDATE inventory SET reserved = reserved + $2, version = version + 1
         WHERE event_id = $1 AND reserved + sold + $2 <= capacity
         RETURNING capacity, reserved, sold, version",
        event_id,
        quantity,
    )
    .fetch_optional(&mut *tx)
    .await?;
    let Some(stock) = held else {
        tx.rollback().await?;
        return Ok(Placed::SoldOut(self::stock(pool, event_id).await?));
    };
    // No conflict target: a second order of the same admission conflicts on
    // `orders_one_per_admission` just as a retried order id does on the key.
    let inserted: Option<Order> = sqlx::query_as!(
        Order,
        "INSERT INTO orders (order_id, event_id, fan_id, quantity, amount_cents, status, hold_expires_at, traceparent,
                             admission_id, idempotency_key)
         VALUES ($1, $2, $3, $4, $5, 'reserved', now() + make_interval(secs => $6), $7, $8, $9)
         ON CONFLICT DO NOTHING
         RETURNING order_id, event_id, fan_id, quantity, amount_cents, status, failure_reason, first_seat",
        order_id,
        event_id,
        fan_id,
        quantity,
        price * i64::from(quantity),
        hold_s as f64,
        traceparent,
        admission.map(|a| a.id),
        admission.map(|a| a.idempotency_key),
    )
    .fetch_optional(&mut *tx)
    .await?;
    match inserted {
        Some(order) => {
            tx.commit().await?;
            Ok(Placed::Reserved(order, stock))
        }
        None => {
            // A concurrent retry of the same order, or another purchase of
            // the same admission, won; undo our hold.
            tx.rollback().await?;
            let found = existing(pool, order_id, admission)
                .await?
                .ok_or(StoreError::UnknownEvent)?;
            Ok(Placed::Existing(found.order, found.idempotency_key))
        }
    }
}

/// An order a saga runner has claimed, with what the claim found.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Claimed {
    #[sqlx(flatten)]
    pub order: Order,
    /// The seat hold ran out before this claim.
    pub hold_expired: bool,
    /// Claims so far, this one included.
    pub attempts: i32,
    /// The purchase's W3C trace context, when the order was placed with one.
    pub traceparent: Option<String>,
}

/// Claims the unfinished order that has been due longest, under a lease: no
/// other runner takes it up before `lease` has passed (the claim commits at
/// once, so no transaction stays open across a payment call). A runner that
/// dies mid-step leaves the order to be claimed again when the lease ends;
/// every step is safe to repeat.
pub async fn claim_due(
    pool: &PgPool,
    lease: std::time::Duration,
) -> Result<Option<Claimed>, StoreError> {
    let row = sqlx::query!(
        r#"UPDATE orders SET next_attempt_at = now() + make_interval(secs => $1), attempts = attempts + 1
         WHERE order_id = (
             SELECT order_id FROM orders
             WHERE status IN ('pending', 'reserved', 'charged')
               AND (next_attempt_at IS NULL OR next_attempt_at <= now())
             ORDER BY next_attempt_at NULLS FIRST LIMIT 1 FOR UPDATE SKIP LOCKED)
         RETURNING order_id, event_id, fan_id, quantity, amount_cents, status, failure_reason, first_seat,
                   coalesce(hold_expires_at <= now(), false) AS "hold_expired!", attempts, traceparent"#,
        lease.as_secs_f64(),
    )
    .fetch_optional(pool)
    .await?;
    Ok(row.map(|r| Claimed {
        order: order_of!(r),
        hold_expired: r.hold_expired,
        attempts: r.attempts,
        traceparent: r.traceparent,
    }))
}

/// Hands an order back to be taken up again after `delay`, but no later
/// than a live hold expires (when the sweep step must run).
pub async fn retry_later(
    pool: &PgPool,
    order_id: Uuid,
    delay: std::time::Duration,
) -> Result<(), StoreError> {
    sqlx::query!(
        "UPDATE orders SET next_attempt_at = CASE
                WHEN hold_expires_at > now() THEN least(now() + make_interval(secs => $2), hold_expires_at)
                ELSE now() + make_interval(secs => $2) END
         WHERE order_id = $1 AND status IN ('pending', 'reserved', 'charged')",
        order_id,
        delay.as_secs_f64(),
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// The pivot: records the capture under the order id (its idempotency key)
/// and moves a held order to `charged`, due at once for its last step.
/// Returns `false` if the order was no longer held (failed meanwhile): the
/// capture is then recorded as `refunding`, so the refund compensation
/// gives it back.
pub async fn mark_charged(
    pool: &PgPool,
    order_id: Uuid,
    amount_cents: i64,
) -> Result<bool, StoreError> {
    let mut tx = pool.begin().await?;
    let charged = sqlx::query!(
        "UPDATE orders SET status = 'charged', next_attempt_at = now(), updated_at = now()
         WHERE order_id = $1 AND status = 'reserved'",
        order_id,
    )
    .execute(&mut *tx)
    .await?
    .rows_affected()
        == 1;
    let already_charged: bool = if charged {
        false
    } else {
        sqlx::query_scalar!(
            r#"SELECT status IN ('charged', 'confirmed') AS "charged!" FROM orders WHERE order_id = $1"#,
            order_id,
        )
        .fetch_optional(&mut *tx)
        .await?
        .unwrap_or(false)
    };
    sqlx::query!(
        "INSERT INTO payments (order_id, amount_cents, status) VALUES ($1, $2, $3)
         ON CONFLICT (order_id) DO NOTHING",
        order_id,
        amount_cents,
        if charged || already_charged {
            "captured"
        } else {
            "refunding"
        },
    )
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(charged)
}

/// Compensation of the hold: fails a held order with `reason` and gives its
/// seats back. Returns the new stock, or `None` if the order was no longer held.
pub async fn fail_and_release(
    pool: &PgPool,
    order_id: Uuid,
    reason: &str,
) -> Result<Option<(String, Stock)>, StoreError> {
    let mut tx = pool.begin().await?;
    let failed = sqlx::query!(
        "UPDATE orders SET status = 'failed', failure_reason = $2, hold_expires_at = NULL,
                next_attempt_at = NULL, updated_at = now()
         WHERE order_id = $1 AND status IN ('pending', 'reserved')
         RETURNING event_id, quantity",
        order_id,
        reason,
    )
    .fetch_optional(&mut *tx)
    .await?
    .map(|r| (r.event_id, r.quantity));
    let Some((event_id, quantity)) = failed else {
        return Ok(None);
    };
    let stock: Stock = sqlx::query_as!(
        Stock,
        "UPDATE inventory SET reserved = reserved - $2, version = version + 1
         WHERE event_id = $1 RETURNING capacity, reserved, sold, version",
        &event_id,
        quantity,
    )
    .fetch_one(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(Some((event_id, stock)))
}

/// Claims the capture waiting to be refunded that has been due longest,
/// under a lease, as [`claim_due`] does for orders: the claim commits at
/// once, so no row stays locked across the provider call. Returns the order
/// id and the refund's claims so far, this one included.
pub async fn claim_refund(
    pool: &PgPool,
    lease: std::time::Duration,
) -> Result<Option<(Uuid, i32)>, StoreError> {
    Ok(sqlx::query!(
        "UPDATE payments SET next_refund_at = now() + make_interval(secs => $1),
                refund_attempts = refund_attempts + 1
         WHERE order_id = (
             SELECT order_id FROM payments
             WHERE status = 'refunding' AND next_refund_at <= now()
             ORDER BY next_refund_at LIMIT 1 FOR UPDATE SKIP LOCKED)
         RETURNING order_id, refund_attempts",
        lease.as_secs_f64(),
    )
    .fetch_optional(pool)
    .await?
    .map(|r| (r.order_id, r.refund_attempts)))
}

/// Hands a refund the provider did not complete back, to be tried after `delay`.
pub async fn refund_later(
    pool: &PgPool,
    order_id: Uuid,
    delay: std::time::Duration,
) -> Result<(), StoreError> {
    sqlx::query!(
        "UPDATE payments SET next_refund_at = now() + make_interval(secs => $2)
         WHERE order_id = $1 AND status = 'refunding'",
        order_id,
        delay.as_secs_f64(),
    )
    .execute(pool)
    .await?;
    Ok(())
}

pub async fn mark_refunded(pool: &PgPool, order_id: Uuid) -> Result<(), StoreError> {
    sqlx::query!(
        "UPDATE payments SET status = 'refunded' WHERE order_id = $1 AND status = 'refunding'",
        order_id,
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// Locks a charged order for its last step; `false` if it is not (or no longer) charged.
pub async fn lock_charged(
    tx: &mut Transaction<'_, Postgres>,
    order_id: Uuid,
) -> Result<bool, StoreError> {
    let status: Option<String> = sqlx::query_scalar!(
        "SELECT status FROM orders WHERE order_id = $1 FOR UPDATE",
        order_id
    )
    .fetch_optional(&mut **tx)
    .await?;
    Ok(status.as_deref() == Some("charged"))
}

/// Moves held seats to sold; returns the first seat number of the order and
/// the new stock (its version bumped: the edge view's `held` changes).
pub async fn sell_held_seats(
    tx: &mut Transaction<'_, Postgres>,
    event_id: &str,
    quantity: i32,
) -> Result<(i32, Stock), StoreError> {
    let stock: Stock = sqlx::query_as!(
        Stock,
        "UPDATE inventory SET reserved = reserved - $2, sold = sold + $2, version = version + 1
         WHERE event_id = $1 RETURNING capacity, reserved, sold, version",
        event_id,
        quantity,
    )
    .fetch_one(&mut **tx)
    .await?;
    Ok((stock.sold - quantity + 1, stock))
}

/// Confirms the order and writes its outbox row in the same transaction; the
/// row carries the confirming span's `traceparent` for the relay to send on.
pub async fn confirm(
    tx: &mut Transaction<'_, Postgres>,
    order_id: Uuid,
    first_seat: i32,
    event_type: &str,
    payload: &serde_json::Value,
    traceparent: &str,
) -> Result<(), StoreError> {
    sqlx::query!(
        "UPDATE orders SET status = 'confirmed', first_seat = $2, hold_expires_at = NULL,
         next_attempt_at = NULL, updated_at = now() WHERE order_id = $1",
        order_id,
        first_seat,
    )
    .execute(&mut **tx)
    .await?;
    sqlx::query!(
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, traceparent)
         VALUES ('order', $1, $2, $3, $4)",
        order_id.to_string(),
        event_type,
        payload,
        traceparent,
    )
    .execute(&mut **tx)
    .await?;
    Ok(())
}
