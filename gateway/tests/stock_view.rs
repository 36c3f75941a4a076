//! The edge's "sold out" heals: when the last seat's hold is released (a
//! declined card) and the publish of the new stock to Redis is lost, the
//! order service's reconciler republishes it from PostgreSQL, so the seat is
//! sold to the next fan within one reconcile period (1 s) plus the gateway's
//! event cache.

mod common;

use std::time::{Duration, Instant};

use common::Stack;
use reqwest::StatusCode;
use serde_json::json;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

#[sqlx::test(migrator = "order_service::MIGRATOR")]
async fn a_seat_released_at_sold_out_is_sold_again_when_its_publish_was_lost(
    options: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let stack = Stack::start(options, connect).await;
    stack.create_event("last", 1, 50.0, 1).await;
    let knobs = |decline: f64| {
        stack
            .http
            .put(format!("{}/v1/knobs", stack.payment_provider))
            .json(&json!({ "decline_rate": decline }))
            .send()
    };
    assert!(knobs(1.0).await.unwrap().status().is_success());

    // Fan A holds the only seat; the card is declined and the hold released.
    let (_, joined) = stack.join("last", "fan-a").await;
    let access = stack
        .wait_admitted("last", joined["queue_ticket"].as_str().unwrap())
        .await;
    let (status, bought) = stack.buy("last", &access, 1, Some("a")).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{bought}");
    let order_id = bought["order_id"].as_str().unwrap();
    let token = bought["order_token"].as_str().unwrap();
    for _ in 0..100 {
        if stack.order(order_id, token).await.1["status"] == "failed" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(stack.order(order_id, token).await.1["status"], "failed");
    assert!(knobs(0.0).await.unwrap().status().is_success());

    // The publish of "1 left" is lost: Redis still says sold out, at the
    // version of the hold.
    let version: i64 = sqlx::query_scalar("SELECT version FROM inventory WHERE event_id = 'last'")
        .fetch_one(&stack.pool)
        .await
        .unwrap();
    let mut redis =
        redis::aio::ConnectionManager::new(redis::Client::open(common::redis_url()).unwrap())
            .await
            .unwrap();
    let _: () = redis::cmd("HSET")
        .arg(format!("{}:{{last}}:stock", stack.prefix))
        .arg("remaining")
        .arg(0)
        .arg("version")
        .arg(version - 1)
        .query_async(&mut redis)
        .await
        .unwrap();
    let stale = Instant::now();

    // Fan B: told sold out for at most about a second, then sold the seat.
    let joined = loop {
        let (status, body) = stack.join("last", "fan-b").await;
        if status.is_success() {
            break body;
        }
        assert_eq!(status, StatusCode::GONE, "{body}");
        assert!(
            stale.elapsed() < Duration::from_secs(3),
            "still sold out after {:?}",
            stale.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let healed = stale.elapsed();
    let access = stack
        .wait_admitted("last", joined["queue_ticket"].as_str().unwrap())
        .await;
    let (status, bought) = stack.buy("last", &access, 1, Some("b")).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{bought}");
    let order = stack
        .wait_ticketed(
            bought["order_id"].as_str().unwrap(),
            bought["order_token"].as_str().unwrap(),
        )
        .await;
    assert_eq!(order["status"], "confirmed");
    assert!(healed < Duration::from_secs(3), "{healed:?}");
    stack.stop().await;
}
