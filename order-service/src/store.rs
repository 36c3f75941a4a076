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

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("unknown event")]
    UnknownEvent,
    #[error("capacity {requested} is below the {committed} seats already reserved or sold")]
    CapacityBelowCommitted { requested: i32, committed: i32 },
    #[error("database: {0}")]
    Db(#[from] sqlx::Error),
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
    sqlx::query(
        "INSERT INTO events (event_id, name, price_cents) VALUES ($1, $2, $3)
         ON CONFLICT (event_id) DO UPDATE SET name = $2, price_cents = $3, updated_at = now()",
    )
    .bind(event_id)
    .bind(name)
    .bind(price_cents)
    .execute(&mut *tx)
    .await?;
    let current: Option<Stock> = sqlx::query_as(
        "SELECT capacity, reserved, sold, version FROM inventory WHERE event_id = $1 FOR UPDATE",
    )
    .bind(event_id)
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
    let stock: Stock = sqlx::query_as(
        "INSERT INTO inventory (event_id, capacity) VALUES ($1, $2)
         ON CONFLICT (event_id) DO UPDATE SET capacity = $2, version = inventory.version + 1
         RETURNING capacity, reserved, sold, version",
    )
    .bind(event_id)
    .bind(capacity)
    .fetch_one(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(stock)
}

pub async fn stock(pool: &PgPool, event_id: &str) -> Result<Stock, StoreError> {
    sqlx::query_as("SELECT capacity, reserved, sold, version FROM inventory WHERE event_id = $1")
        .bind(event_id)
        .fetch_optional(pool)
        .await?
        .ok_or(StoreError::UnknownEvent)
}

/// An order and how many of its tickets exist, in one round trip.
pub async fn order(pool: &PgPool, order_id: Uuid) -> Result<Option<(Order, i64)>, StoreError> {
    #[derive(sqlx::FromRow)]
    struct Row {
        #[sqlx(flatten)]
        order: Order,
        tickets: i64,
    }
    let row: Option<Row> = sqlx::query_as(
        "SELECT order_id, event_id, fan_id, quantity, amount_cents, status, failure_reason, first_seat,
                (SELECT count(*) FROM tickets t WHERE t.order_id = o.order_id) AS tickets
         FROM orders o WHERE order_id = $1",
    )
    .bind(order_id)
    .fetch_optional(pool)
    .await?;
    Ok(row.map(|r| (r.order, r.tickets)))
}

/// The outcome of placing an order.
#[derive(Debug)]
pub enum Placed {
    /// Seats are held; the saga takes it from here.
    Reserved(Order, Stock),
    /// This order id was placed before (a retried request): its current state.
    Existing(Order),
    /// Not enough seats left; nothing was written.
    SoldOut(Stock),
}

/// Steps 1 and 2 of the saga in one local transaction: the order row and its
/// seat hold. The conditional UPDATE on the inventory row is what makes
/// overselling impossible; the CHECK constraint is the second line.
pub async fn place_order(
    pool: &PgPool,
    order_id: Uuid,
    event_id: &str,
    fan_id: &str,
    quantity: i32,
    hold_s: i64,
) -> Result<Placed, StoreError> {
    if let Some((existing, _)) = order(pool, order_id).await? {
        return Ok(Placed::Existing(existing));
    }
    let mut tx = pool.begin().await?;
    let price: i64 = sqlx::query_scalar("SELECT price_cents FROM events WHERE event_id = $1")
        .bind(event_id)
        .fetch_optional(&mut *tx)
        .await?
        .ok_or(StoreError::UnknownEvent)?;
    let held: Option<Stock> = sqlx::query_as(
        "UPDATE inventory SET reserved = reserved + $2, version = version + 1
         WHERE event_id = $1 AND reserved + sold + $2 <= capacity
         RETURNING capacity, reserved, sold, version",
    )
    .bind(event_id)
    .bind(quantity)
    .fetch_optional(&mut *tx)
    .await?;
    let Some(stock) = held else {
        tx.rollback().await?;
        return Ok(Placed::SoldOut(self::stock(pool, event_id).await?));
    };
    let inserted: Option<Order> = sqlx::query_as(
        "INSERT INTO orders (order_id, event_id, fan_id, quantity, amount_cents, status, hold_expires_at)
         VALUES ($1, $2, $3, $4, $5, 'reserved', now() + make_interval(secs => $6))
         ON CONFLICT (order_id) DO NOTHING
         RETURNING order_id, event_id, fan_id, quantity, amount_cents, status, failure_reason, first_seat",
    )
    .bind(order_id)
    .bind(event_id)
    .bind(fan_id)
    .bind(quantity)
    .bind(price * i64::from(quantity))
    .bind(hold_s as f64)
    .fetch_optional(&mut *tx)
    .await?;
    match inserted {
        Some(order) => {
            tx.commit().await?;
            Ok(Placed::Reserved(order, stock))
        }
        None => {
            // A concurrent retry of the same order won; undo our hold.
            tx.rollback().await?;
            let (existing, _) = order(pool, order_id)
                .await?
                .ok_or(StoreError::UnknownEvent)?;
            Ok(Placed::Existing(existing))
        }
    }
}

/// Claims the oldest unfinished order no other runner holds. The row stays
/// locked until `tx` ends, so each order advances in one runner at a time.
pub async fn claim_unfinished(
    tx: &mut Transaction<'_, Postgres>,
) -> Result<Option<Order>, StoreError> {
    Ok(sqlx::query_as(
        "SELECT order_id, event_id, fan_id, quantity, amount_cents, status, failure_reason, first_seat
         FROM orders WHERE status IN ('reserved', 'charged')
         ORDER BY updated_at LIMIT 1 FOR UPDATE SKIP LOCKED",
    )
    .fetch_optional(&mut **tx)
    .await?)
}

pub async fn set_status(
    tx: &mut Transaction<'_, Postgres>,
    order_id: Uuid,
    status: &str,
) -> Result<(), StoreError> {
    sqlx::query("UPDATE orders SET status = $2, updated_at = now() WHERE order_id = $1")
        .bind(order_id)
        .bind(status)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// Records the charge under the order id, its idempotency key: a second
/// attempt finds the first.
pub async fn record_payment(
    tx: &mut Transaction<'_, Postgres>,
    order_id: Uuid,
    amount_cents: i64,
) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO payments (order_id, amount_cents, status) VALUES ($1, $2, 'captured')
         ON CONFLICT (order_id) DO NOTHING",
    )
    .bind(order_id)
    .bind(amount_cents)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Moves held seats to sold and returns the first seat number of the order.
pub async fn sell_held_seats(
    tx: &mut Transaction<'_, Postgres>,
    event_id: &str,
    quantity: i32,
) -> Result<i32, StoreError> {
    let sold: i32 = sqlx::query_scalar(
        "UPDATE inventory SET reserved = reserved - $2, sold = sold + $2
         WHERE event_id = $1 RETURNING sold",
    )
    .bind(event_id)
    .bind(quantity)
    .fetch_one(&mut **tx)
    .await?;
    Ok(sold - quantity + 1)
}

/// Confirms the order and writes its outbox row in the same transaction.
pub async fn confirm(
    tx: &mut Transaction<'_, Postgres>,
    order_id: Uuid,
    first_seat: i32,
    event_type: &str,
    payload: &serde_json::Value,
) -> Result<(), StoreError> {
    sqlx::query(
        "UPDATE orders SET status = 'confirmed', first_seat = $2, hold_expires_at = NULL,
         updated_at = now() WHERE order_id = $1",
    )
    .bind(order_id)
    .bind(first_seat)
    .execute(&mut **tx)
    .await?;
    sqlx::query(
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
         VALUES ('order', $1, $2, $3)",
    )
    .bind(order_id.to_string())
    .bind(event_type)
    .bind(payload)
    .execute(&mut **tx)
    .await?;
    Ok(())
}
