//! The flash-sale scenario: each goose user is a stream of fans; each fan
//! joins, polls its place at the pace `Retry-After` asks, buys when admitted,
//! and follows the order to `confirmed`. Sold-out and room-full answers are the
//! edge doing its job, not errors.

use std::sync::OnceLock;
use std::time::Duration;

use goose::prelude::*;
use serde_json::{json, Value};

/// The sale the fans go for, and how many seats each buys.
#[derive(Debug, Clone)]
pub struct Sale {
    pub event_id: String,
    pub quantity: u32,
}

static SALE: OnceLock<Sale> = OnceLock::new();

/// Sets the sale once per process (goose transactions are plain functions).
pub fn configure(sale: Sale) {
    let _ = SALE.set(sale);
}

fn sale() -> &'static Sale {
    SALE.get_or_init(|| Sale {
        event_id: "demo".into(),
        quantity: 1,
    })
}

/// The scenario to register: one transaction, one fan's whole journey.
pub fn flash_sale() -> Scenario {
    scenario!("FlashSaleFan")
        .register_transaction(transaction!(fan_journey).set_name("fan journey"))
}

/// `Retry-After` in seconds, capped so a run never stalls on one fan.
fn retry_after(response: &reqwest::Response) -> Duration {
    let seconds = response
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(1);
    Duration::from_secs(seconds.clamp(1, 30))
}

async fn send(
    user: &mut GooseUser,
    name: &str,
    method: GooseMethod,
    path: &str,
    token: Option<&str>,
    body: Option<Value>,
) -> Result<Option<reqwest::Response>, Box<TransactionError>> {
    let mut builder = user.get_request_builder(&method, path)?;
    if let Some(token) = token {
        builder = builder.bearer_auth(token);
    }
    if let Some(body) = body {
        builder = builder.json(&body);
    }
    let request = GooseRequest::builder()
        .method(method)
        .path(path)
        .name(name)
        .set_request_builder(builder)
        .build();
    Ok(user.request(request).await?.response.ok())
}

async fn json_of(response: reqwest::Response) -> Option<Value> {
    response.json().await.ok()
}

/// One fan, from joining to a confirmed order (or a clear "no").
pub async fn fan_journey(user: &mut GooseUser) -> TransactionResult {
    let event = sale().event_id.clone();
    let fan = format!(
        "goose-{}-{}",
        user.weighted_users_index,
        rand::random::<u32>()
    );
    let Some(joined) = send(
        user,
        "join",
        GooseMethod::Post,
        &format!("/v1/events/{event}/queue"),
        None,
        Some(json!({ "fan_id": fan })),
    )
    .await?
    else {
        return Ok(());
    };
    if !joined.status().is_success() {
        // Sold out, room full, not open: answered at the edge, as designed.
        tokio::time::sleep(retry_after(&joined)).await;
        return Ok(());
    }
    let Some(ticket) = json_of(joined)
        .await
        .and_then(|b| b["queue_ticket"].as_str().map(str::to_owned))
    else {
        return Ok(());
    };

    let status_path = format!("/v1/events/{event}/queue/status");
    let access = loop {
        let Some(response) = send(
            user,
            "status",
            GooseMethod::Get,
            &status_path,
            Some(&ticket),
            None,
        )
        .await?
        else {
            return Ok(());
        };
        if !response.status().is_success() {
            return Ok(()); // sold out or lapsed
        }
        let pause = retry_after(&response);
        let body = json_of(response).await.unwrap_or_default();
        if let Some(token) = body["access_token"].as_str() {
            break token.to_owned();
        }
        tokio::time::sleep(pause).await;
    };

    let key = format!("{fan}-buy");
    let mut builder =
        user.get_request_builder(&GooseMethod::Post, &format!("/v1/events/{event}/orders"))?;
    builder = builder
        .bearer_auth(&access)
        .header("idempotency-key", key)
        .json(&json!({ "quantity": sale().quantity }));
    let request = GooseRequest::builder()
        .method(GooseMethod::Post)
        .path("/orders")
        .name("buy")
        .set_request_builder(builder)
        .build();
    let Ok(bought) = user.request(request).await?.response else {
        return Ok(());
    };
    if !bought.status().is_success() {
        return Ok(());
    }
    let body = json_of(bought).await.unwrap_or_default();
    let (Some(order_id), Some(order_token)) =
        (body["order_id"].as_str(), body["order_token"].as_str())
    else {
        return Ok(());
    };
    let (order_id, order_token) = (order_id.to_owned(), order_token.to_owned());
    for _ in 0..60 {
        let Some(response) = send(
            user,
            "order",
            GooseMethod::Get,
            &format!("/v1/orders/{order_id}"),
            Some(&order_token),
            None,
        )
        .await?
        else {
            return Ok(());
        };
        let body = json_of(response).await.unwrap_or_default();
        if matches!(
            body["status"].as_str(),
            Some("confirmed" | "failed" | "cancelled")
        ) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Ok(())
}
