//! One admission buys once, even when Redis loses the record of the spent
//! token; and a purchase whose answer was lost can be retried by the same
//! admission, with or without an Idempotency-Key.

mod common;

use std::time::Duration;

use common::Stack;
use reqwest::StatusCode;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

/// What a Redis restart without persistence, a failover that loses the last
/// writes or an eviction does to a spent access token.
async fn forget_spent_tokens(stack: &Stack, event_id: &str) -> usize {
    let mut redis =
        redis::aio::ConnectionManager::new(redis::Client::open(common::redis_url()).unwrap())
            .await
            .unwrap();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{}:{{{event_id}}}:jti:*", stack.prefix))
        .query_async(&mut redis)
        .await
        .unwrap();
    if !keys.is_empty() {
        let _: () = redis::cmd("DEL")
            .arg(&keys)
            .query_async(&mut redis)
            .await
            .unwrap();
    }
    keys.len()
}

async fn orders_of(stack: &Stack, event_id: &str) -> Vec<(uuid::Uuid, i32)> {
    sqlx::query_as("SELECT order_id, quantity FROM orders WHERE event_id = $1")
        .bind(event_id)
        .fetch_all(&stack.pool)
        .await
        .unwrap()
}

#[sqlx::test(migrator = "order_service::MIGRATOR")]
async fn an_admission_buys_once_even_when_redis_forgets_the_spend(
    options: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let stack = Stack::start_with(options, connect, false).await;
    stack.create_event("once", 10, 50.0, 2).await;
    let (_, joined) = stack.join("once", "fan-1").await;
    let access = stack
        .wait_admitted("once", joined["queue_ticket"].as_str().unwrap())
        .await;
    let (status, first) = stack.buy("once", &access, 1, Some("k-1")).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{first}");

    assert_eq!(forget_spent_tokens(&stack, "once").await, 1);
    let (status, second) = stack.buy("once", &access, 1, Some("k-2")).await;
    assert_eq!(
        status,
        StatusCode::CONFLICT,
        "PostgreSQL refuses a second order: {second}"
    );
    assert!(
        second["type"].as_str().unwrap().ends_with("/token-used"),
        "{second}"
    );

    // After the loss, a retry of the first purchase finds the first order.
    forget_spent_tokens(&stack, "once").await;
    let (status, again) = stack.buy("once", &access, 1, Some("k-1")).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{again}");
    assert_eq!(again["order_id"], first["order_id"]);
    // ... but not for another quantity.
    forget_spent_tokens(&stack, "once").await;
    let (status, other) = stack.buy("once", &access, 2, Some("k-1")).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{other}");
    assert!(
        other["type"]
            .as_str()
            .unwrap()
            .ends_with("/idempotency-key-reused"),
        "{other}"
    );

    let orders = orders_of(&stack, "once").await;
    assert_eq!(orders.len(), 1, "one order for the admission: {orders:?}");
    let (reserved, sold): (i32, i32) =
        sqlx::query_as("SELECT reserved, sold FROM inventory WHERE event_id = 'once'")
            .fetch_one(&stack.pool)
            .await
            .unwrap();
    assert_eq!(
        (reserved, sold),
        (1, 0),
        "the refused attempts held no seats"
    );
    stack.stop().await;
}

#[sqlx::test(migrator = "order_service::MIGRATOR")]
async fn a_purchase_whose_answer_was_lost_is_retried_by_the_same_admission(
    options: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let stack = Stack::start_with(options, connect, false).await;
    stack.create_event("lost", 10, 50.0, 2).await;
    let (_, joined) = stack.join("lost", "fan-1").await;
    let access = stack
        .wait_admitted("lost", joined["queue_ticket"].as_str().unwrap())
        .await;

    // Hold the event's inventory row: the order service's purchase blocks on
    // it past the gateway's 5 s call timeout, after the token was spent.
    let mut lock = stack.pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM inventory WHERE event_id = 'lost' FOR UPDATE")
        .execute(&mut *lock)
        .await
        .unwrap();
    let (status, lost) = stack.buy("lost", &access, 2, None).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{lost}");
    let detail = lost["detail"].as_str().unwrap();
    assert!(
        detail.contains("your admission is kept"),
        "says what to do: {detail}"
    );
    // A retry of the spent token may not ask for more than the per-fan limit
    // (refused at the edge, before the order service is asked).
    let (status, bigger) = stack.buy("lost", &access, 5, None).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{bigger}");
    lock.rollback().await.unwrap();
    // Whatever became of the blocked call, let it finish.
    tokio::time::sleep(Duration::from_millis(500)).await;

    // The same admission, again without a key: the same purchase, not 409.
    let (status, retried) = stack.buy("lost", &access, 2, None).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{retried}");
    let (status, again) = stack.buy("lost", &access, 2, None).await;
    assert_eq!(
        (status, &again["order_id"]),
        (StatusCode::ACCEPTED, &retried["order_id"])
    );
    let orders = orders_of(&stack, "lost").await;
    assert_eq!(orders.len(), 1, "{orders:?}");
    assert_eq!(
        orders[0].0.to_string(),
        retried["order_id"].as_str().unwrap()
    );
    // A purchase under a key of the fan's is a second purchase: refused.
    let (status, _) = stack.buy("lost", &access, 1, Some("mine")).await;
    assert_eq!(status, StatusCode::CONFLICT);
    stack.stop().await;
}
