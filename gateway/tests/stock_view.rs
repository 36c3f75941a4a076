//! The edge's "sold out" heals: when the last seat's hold is released (a
//! declined card) and the publish of the new stock to Redis is lost, the
//! order service's reconciler republishes it from PostgreSQL, so the seat is
//! sold to the next fan within one reconcile period (1 s) plus the gateway's
//! event cache. And while every seat is only held, fans are not told
//! "sold out".

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
    stack.knobs(json!({ "decline_rate": 1.0 })).await;

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
    stack.knobs(json!({})).await;

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

/// While no seat is free but some are only held by fans still paying (here
/// the payment provider fails every call, so a hold neither confirms nor
/// lapses), fans are not told "sold out": the event reads `all_held`, the
/// line stays open, a waiting fan is told seats are held, and an admitted
/// fan's purchase answers 409 `seats-held` with Retry-After, keeping the
/// admission. When the hold is given back, that fan buys the seat with the
/// same token; then the sale is sold out, final.
#[sqlx::test(migrator = "order_service::MIGRATOR")]
async fn while_every_seat_is_only_held_fans_keep_their_place(
    options: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let stack = Stack::start(options, connect).await;
    stack.create_event("held", 1, 50.0, 1).await;
    stack.knobs(json!({ "error_rate": 1.0 })).await;
    let event_state = || async {
        let response = stack
            .http
            .get(format!("{}/v1/events/held", stack.gateway))
            .send()
            .await
            .unwrap();
        let body: serde_json::Value = response.json().await.unwrap();
        body["state"].as_str().unwrap().to_owned()
    };
    let state_becomes = |wanted: &'static str| async move {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let state = event_state().await;
            if state == wanted {
                return;
            }
            assert!(Instant::now() < deadline, "never {wanted}: {state}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };

    // Fans A and C are admitted; A holds the only seat, its payment failing.
    let mut access = Vec::new();
    for fan in ["fan-a", "fan-c"] {
        let (_, joined) = stack.join("held", fan).await;
        access.push(
            stack
                .wait_admitted("held", joined["queue_ticket"].as_str().unwrap())
                .await,
        );
    }
    let (status, held_by_a) = stack.buy("held", &access[0], 1, None).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{held_by_a}");
    state_becomes("all_held").await;

    // Fan B can still line up, and is told why the line does not move.
    let (status, joined) = stack.join("held", "fan-b").await;
    assert!(status.is_success(), "{status} {joined}");
    let waiting: serde_json::Value = stack
        .http
        .get(format!("{}/v1/events/held/queue/status", stack.gateway))
        .bearer_auth(joined["queue_ticket"].as_str().unwrap())
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(waiting["state"], "waiting", "{waiting}");
    assert_eq!(waiting["all_seats_held"], true, "{waiting}");
    assert_eq!(waiting["eta_seconds"], serde_json::Value::Null, "{waiting}");

    // Fan C may come back for a seat.
    let held = stack
        .http
        .post(format!("{}/v1/events/held/orders", stack.gateway))
        .bearer_auth(&access[1])
        .json(&json!({ "quantity": 1 }))
        .send()
        .await
        .unwrap();
    assert_eq!(held.status(), StatusCode::CONFLICT);
    assert_eq!(held.headers()["retry-after"], "5");
    let problem: serde_json::Value = held.json().await.unwrap();
    assert_eq!(
        problem["type"].as_str().unwrap().rsplit('/').next(),
        Some("seats-held")
    );

    // A's card is declined at the next attempt: the seat comes back and C,
    // retrying with the same token, buys it.
    stack.knobs(json!({ "decline_rate": 1.0 })).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    let (order_a, token_a) = (
        held_by_a["order_id"].as_str().unwrap(),
        held_by_a["order_token"].as_str().unwrap(),
    );
    while stack.order(order_a, token_a).await.1["status"] != "failed" {
        assert!(Instant::now() < deadline, "A's hold was never given back");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stack.knobs(json!({})).await;
    let bought = loop {
        let (status, body) = stack.buy("held", &access[1], 1, None).await;
        if status == StatusCode::ACCEPTED {
            break body;
        }
        assert_eq!(status, StatusCode::CONFLICT, "{body}");
        assert!(Instant::now() < deadline, "the held seat never came back");
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let order = stack
        .wait_ticketed(
            bought["order_id"].as_str().unwrap(),
            bought["order_token"].as_str().unwrap(),
        )
        .await;
    assert_eq!(order["status"], "confirmed");
    state_becomes("sold_out").await;
    stack.stop().await;
}

/// An event of one seat (10 s access tokens) whose payments fail, with fans
/// A and C admitted and A holding the seat: C's access token, and A's order.
async fn one_seat_held_by_a(stack: &Stack, event: &str) -> (String, serde_json::Value) {
    stack
        .create_event_with(
            event,
            json!({ "capacity": 1, "per_fan_limit": 1, "access_ttl_s": 10 }),
        )
        .await;
    stack.knobs(json!({ "error_rate": 1.0 })).await;
    let mut access = Vec::new();
    for fan in ["fan-a", "fan-c"] {
        let (_, joined) = stack.join(event, fan).await;
        access.push(
            stack
                .wait_admitted(event, joined["queue_ticket"].as_str().unwrap())
                .await,
        );
    }
    let (status, held_by_a) = stack.buy(event, &access[0], 1, None).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{held_by_a}");
    (access.swap_remove(1), held_by_a)
}

/// A 409 `seats-held`: keeps the renewed access token it carries, if any.
fn keep_renewed(problem: &serde_json::Value, token: &mut String) {
    assert!(
        problem["type"].as_str().unwrap().ends_with("/seats-held"),
        "{problem}"
    );
    if let Some(fresh) = problem["admission"]["access_token"].as_str() {
        *token = fresh.to_owned();
    }
}

/// C retries every 2 s for 18 s, well past the first token's 10 s (and its
/// 5 s of leeway), each time told `seats-held`, with the token each answer gives.
async fn retry_while_held(stack: &Stack, event: &str, token: &mut String, key: Option<&str>) {
    let waited = Instant::now();
    while waited.elapsed() < Duration::from_secs(18) {
        let (status, problem) = stack.buy(event, token, 1, key).await;
        assert_eq!(
            status,
            StatusCode::CONFLICT,
            "after {:?}: {problem}",
            waited.elapsed()
        );
        keep_renewed(&problem, token);
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

/// A's hold lapses, and the provider is back: A's saga, backing off (up to
/// 30 s), voids it at its next turn and the seat comes back. C keeps
/// retrying meanwhile, as told, and so keeps its admission, then buys; its
/// order is confirmed with tickets.
async fn buy_once_the_hold_lapses(
    stack: &Stack,
    event: &str,
    held_by_a: &serde_json::Value,
    token: &mut String,
    key: Option<&str>,
) {
    let order_a = uuid::Uuid::parse_str(held_by_a["order_id"].as_str().unwrap()).unwrap();
    sqlx::query("UPDATE orders SET hold_expires_at = now() WHERE order_id = $1")
        .bind(order_a)
        .execute(&stack.pool)
        .await
        .unwrap();
    stack.knobs(json!({})).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    let bought = loop {
        let (status, body) = stack.buy(event, token, 1, key).await;
        if status == StatusCode::ACCEPTED {
            break body;
        }
        assert_eq!(status, StatusCode::CONFLICT, "{body}");
        keep_renewed(&body, token);
        assert!(Instant::now() < deadline, "the held seat never came back");
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    let order = stack
        .wait_ticketed(
            bought["order_id"].as_str().unwrap(),
            bought["order_token"].as_str().unwrap(),
        )
        .await;
    assert_eq!(order["status"], "confirmed");
}

/// A fan told `seats-held` keeps the admission however long the seats stay
/// held, past the access token's life (`access_ttl_s`, 10 s here): each
/// `seats-held` answer carries a fresh access token for the same admission.
/// When the hold is given back, the fan buys the seat with the last token it
/// was given.
#[sqlx::test(migrator = "order_service::MIGRATOR")]
async fn a_fan_told_seats_are_held_keeps_the_admission_past_its_token(
    options: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let stack = Stack::start(options, connect).await;
    let (mut token, held_by_a) = one_seat_held_by_a(&stack, "longheld").await;
    let deadline = Instant::now() + Duration::from_secs(5);
    while stack.public_event("longheld").await["state"] != "all_held" {
        assert!(Instant::now() < deadline, "never all_held");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    retry_while_held(&stack, "longheld", &mut token, None).await;
    assert_eq!(stack.public_event("longheld").await["state"], "all_held");
    buy_once_the_hold_lapses(&stack, "longheld", &held_by_a, &mut token, None).await;
    // One admission, one purchase: the first token is spent with it.
    let (status, body) = stack.buy("longheld", &token, 1, Some("another")).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert!(
        body["type"].as_str().unwrap().ends_with("/token-used"),
        "{body}"
    );
    stack.stop().await;
}

/// The same when PostgreSQL, not the edge, says every seat is held (the
/// edge's view still showed a seat, so the token was spent on the way): the
/// 409 `seats-held` carries a renewed token, which can only retry that
/// purchase, past the first token's life, until it is placed.
#[sqlx::test(migrator = "order_service::MIGRATOR")]
async fn a_spent_token_told_seats_are_held_retries_past_its_life(
    options: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let stack = Stack::start(options, connect).await;
    let (mut token, held_by_a) = one_seat_held_by_a(&stack, "lateheld").await;

    // The edge's view says a seat is free, at a version no publish passes.
    let mut redis =
        redis::aio::ConnectionManager::new(redis::Client::open(common::redis_url()).unwrap())
            .await
            .unwrap();
    let _: () = redis::cmd("HSET")
        .arg(format!("{}:{{lateheld}}:stock", stack.prefix))
        .arg("remaining")
        .arg(1)
        .arg("held")
        .arg(0)
        .arg("version")
        .arg(i64::MAX / 2)
        .query_async(&mut redis)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;

    retry_while_held(&stack, "lateheld", &mut token, Some("c")).await;
    // The renewed token cannot start another purchase.
    let (status, body) = stack.buy("lateheld", &token, 1, Some("other")).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert!(
        body["type"].as_str().unwrap().ends_with("/token-used"),
        "{body}"
    );
    buy_once_the_hold_lapses(&stack, "lateheld", &held_by_a, &mut token, Some("c")).await;
    stack.stop().await;
}
