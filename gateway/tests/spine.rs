//! The whole purchase path, end to end, on real Redis, Postgres and Kafka:
//! create an event, join, get admitted, buy, and find the order confirmed
//! with exactly one ticket set.

mod common;

use common::Stack;
use futures_util::future::join_all;
use reqwest::StatusCode;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

#[sqlx::test(migrator = "order_service::MIGRATOR")]
async fn one_fan_buys_and_gets_exactly_one_ticket_set(
    options: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let stack = Stack::start(options, connect).await;
    stack.create_event("solo", 10, 20.0, 4).await;

    let (status, joined) = stack.join("solo", "fan-1").await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(
        (joined["state"].as_str(), joined["position"].as_i64()),
        (Some("waiting"), Some(1))
    );
    let (status, again) = stack.join("solo", "fan-1").await;
    assert_eq!(
        (status, again["position"].as_i64()),
        (StatusCode::OK, Some(1)),
        "a repeat join keeps the place"
    );

    let access = stack
        .wait_admitted("solo", joined["queue_ticket"].as_str().unwrap())
        .await;
    let (status, bought) = stack.buy("solo", &access, 2, Some("k-1")).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{bought}");
    let order_id = bought["order_id"].as_str().unwrap().to_owned();
    let order_token = bought["order_token"].as_str().unwrap().to_owned();

    // The same Idempotency-Key gets the same order; a different one finds the token spent.
    let (status, replay) = stack.buy("solo", &access, 2, Some("k-1")).await;
    assert_eq!(
        (status, replay["order_id"].as_str()),
        (StatusCode::ACCEPTED, Some(order_id.as_str()))
    );
    let (status, used) = stack.buy("solo", &access, 2, Some("k-2")).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert!(used["type"].as_str().unwrap().ends_with("/token-used"));

    let order = stack.wait_ticketed(&order_id, &order_token).await;
    assert_eq!(order["quantity"], 2);
    // The access token that bought it can read it too.
    assert_eq!(stack.order(&order_id, &access).await.0, StatusCode::OK);

    let uuid: uuid::Uuid = order_id.parse().unwrap();
    let tickets: Vec<(i32,)> =
        sqlx::query_as("SELECT seat_no FROM tickets WHERE order_id = $1 ORDER BY seat_no")
            .bind(uuid)
            .fetch_all(&stack.pool)
            .await
            .unwrap();
    assert_eq!(tickets, [(1,), (2,)]);
    let (sold, reserved): (i32, i32) =
        sqlx::query_as("SELECT sold, reserved FROM inventory WHERE event_id = 'solo'")
            .fetch_one(&stack.pool)
            .await
            .unwrap();
    assert_eq!((sold, reserved), (2, 0));
    let (outbox, published): (i64, i64) =
        sqlx::query_as("SELECT count(*), count(published_at) FROM outbox WHERE aggregate_id = $1")
            .bind(&order_id)
            .fetch_one(&stack.pool)
            .await
            .unwrap();
    assert_eq!((outbox, published), (1, 1), "one outbox row, published");
    let payments: i64 = sqlx::query_scalar("SELECT count(*) FROM payments WHERE order_id = $1")
        .bind(uuid)
        .fetch_one(&stack.pool)
        .await
        .unwrap();
    assert_eq!(payments, 1);

    // The tickets: a PDF, one page a seat, for this order's holders only.
    let pdf_url = format!("/v1/orders/{order_id}/tickets.pdf");
    assert_eq!(order["tickets_url"], pdf_url.as_str());
    let pdf = stack
        .http
        .get(format!("{}{pdf_url}", stack.gateway))
        .bearer_auth(&order_token)
        .send()
        .await
        .unwrap();
    assert_eq!(pdf.status(), StatusCode::OK);
    assert_eq!(pdf.headers()["content-type"], "application/pdf");
    let pdf = String::from_utf8_lossy(&pdf.bytes().await.unwrap()).into_owned();
    assert!(pdf.starts_with("%PDF-"));
    let pages = pdf.matches("/Type /Page").count() - pdf.matches("/Type /Pages").count();
    assert_eq!(pages, 2);
    assert!(pdf.contains("(Test solo)") && pdf.contains("(Seat 1)") && pdf.contains("(Seat 2)"));
    let codes: Vec<(String,)> =
        sqlx::query_as("SELECT code FROM tickets WHERE order_id = $1 ORDER BY seat_no")
            .bind(uuid)
            .fetch_all(&stack.pool)
            .await
            .unwrap();
    for (code,) in &codes {
        assert!(
            pdf.contains(code.as_str()),
            "the PDF prints the signed code {code}"
        );
    }
    let stranger = stack
        .http
        .get(format!("{}{pdf_url}", stack.gateway))
        .bearer_auth(stack.keys.sign(&boxoffice_contract::token::Claims {
            order_id: Some(uuid::Uuid::now_v7()),
            ..boxoffice_contract::token::Claims::new(
                "boxoffice",
                "solo",
                "someone-else",
                boxoffice_contract::token::TokenUse::Order,
                boxoffice_contract::token::now_s(),
                60,
            )
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(stranger.status(), StatusCode::NOT_FOUND);

    // The pipeline's health, as adaptive admission reads it: nothing waits anywhere.
    let mut health = serde_json::Value::Null;
    for _ in 0..100 {
        health = stack
            .http
            .get(format!("{}/internal/health", stack.order_service))
            .bearer_auth(common::SERVICE_TOKEN)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if health["consumer_lag"] == 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    assert_eq!(
        (
            health["outbox_backlog"].as_i64(),
            health["consumer_lag"].as_i64()
        ),
        (Some(0), Some(0)),
        "{health}"
    );
    assert!(health["order_latency_p95_ms"].as_f64().unwrap() > 0.0);
    stack.stop().await;
}

#[sqlx::test(migrator = "order_service::MIGRATOR")]
async fn fifty_fans_for_twenty_seats_never_oversell(
    options: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let stack = Stack::start(options, connect).await;
    stack.create_event("rush", 20, 100.0, 1).await;

    let mut tickets = Vec::new();
    for i in 0..50 {
        let (status, joined) = stack.join("rush", &format!("fan-{i}")).await;
        assert_eq!(status, StatusCode::CREATED);
        // The admission loop runs meanwhile, so earlier fans may already be gone.
        let position = joined["position"].as_i64().unwrap();
        assert!((1..=i + 1).contains(&position), "{position}");
        tickets.push(joined["queue_ticket"].as_str().unwrap().to_owned());
    }
    let access: Vec<String> =
        join_all(tickets.iter().map(|t| stack.wait_admitted("rush", t))).await;
    let outcomes = join_all(access.iter().map(|a| stack.buy("rush", a, 1, None))).await;

    let mut bought = Vec::new();
    for (status, body) in &outcomes {
        match *status {
            StatusCode::ACCEPTED => bought.push((
                body["order_id"].as_str().unwrap().to_owned(),
                body["order_token"].as_str().unwrap().to_owned(),
            )),
            StatusCode::GONE => assert!(
                body["type"].as_str().unwrap().ends_with("/sold-out"),
                "{body}"
            ),
            // Bought while the last seats were held by fans still paying.
            StatusCode::CONFLICT => assert!(
                body["type"].as_str().unwrap().ends_with("/seats-held"),
                "{body}"
            ),
            other => panic!("unexpected {other}: {body}"),
        }
    }
    assert_eq!(
        bought.len(),
        20,
        "exactly the 20 seats are sold; the other 30 are told sold-out or held"
    );
    for (order_id, token) in &bought {
        stack.wait_ticketed(order_id, token).await;
    }

    let (capacity, sold, reserved): (i32, i32, i32) =
        sqlx::query_as("SELECT capacity, sold, reserved FROM inventory WHERE event_id = 'rush'")
            .fetch_one(&stack.pool)
            .await
            .unwrap();
    assert_eq!((capacity, sold, reserved), (20, 20, 0));
    let confirmed: i64 = sqlx::query_scalar("SELECT coalesce(sum(quantity), 0) FROM orders WHERE event_id = 'rush' AND status = 'confirmed'")
        .fetch_one(&stack.pool)
        .await
        .unwrap();
    assert_eq!(confirmed, 20, "confirmed quantities add up to sold");
    let (tickets, seats): (i64, i64) = sqlx::query_as(
        "SELECT count(*), count(DISTINCT seat_no) FROM tickets WHERE event_id = 'rush'",
    )
    .fetch_one(&stack.pool)
    .await
    .unwrap();
    assert_eq!(
        (tickets, seats),
        (20, 20),
        "one ticket per seat, none twice"
    );

    // Sold out is now answered at the edge, from Redis.
    let (status, body) = stack.join("rush", "late-fan").await;
    assert_eq!(status, StatusCode::GONE);
    assert!(body["type"].as_str().unwrap().ends_with("/sold-out"));
    stack.stop().await;
}
