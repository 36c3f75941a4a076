//! The payment client's resilience layers against the fake provider over
//! real HTTP: retries of transient failures, the bulkhead, and the circuit
//! breaker opening under an outage, half-opening and closing on recovery.

mod common;

use std::time::Duration;

use common::start_provider;
use futures::future::join_all;
use order_service::payments::client::{PaymentClient, PaymentConfig, PaymentError};
use order_service::payments::provider::Knobs;
use order_service::payments::ChargeStatus;
use tokio_util::sync::CancellationToken;

async fn set_knobs(url: &str, knobs: &Knobs) {
    let response = reqwest::Client::new()
        .put(format!("{url}/v1/knobs"))
        .json(knobs)
        .send()
        .await
        .unwrap();
    assert!(response.status().is_success());
}

#[tokio::test]
async fn transient_errors_are_retried_and_each_key_is_charged_once() {
    let cancel = CancellationToken::new();
    let knobs = Knobs {
        error_rate: 0.4,
        ..Knobs::default()
    };
    let (provider, url) = start_provider(knobs, &cancel).await;
    let mut config = PaymentConfig::defaults(&url);
    config.payment_retries = 20;
    config.payment_backoff_ms = 1;
    config.payment_backoff_max_ms = 10;
    config.payment_retry_percent = 1_000.0;
    config.payment_breaker_failure_rate = 1.0;
    let client = PaymentClient::new(config).unwrap();
    for key in 0..30 {
        let charge = client.charge(&format!("key-{key}"), 100).await.unwrap();
        assert_eq!(charge.status, ChargeStatus::Captured);
    }
    let stats = provider.stats();
    assert!(stats.errors > 0, "{stats:?}");
    assert_eq!(stats.requests, 30 + stats.errors, "one retry per error");
    assert!(provider.records().iter().all(|r| r.captures == 1));
    cancel.cancel();
}

#[tokio::test]
async fn the_retry_budget_stops_retries_when_most_calls_fail() {
    let cancel = CancellationToken::new();
    let knobs = Knobs {
        error_rate: 1.0,
        ..Knobs::default()
    };
    let (provider, url) = start_provider(knobs, &cancel).await;
    let mut config = PaymentConfig::defaults(&url);
    config.payment_retries = 5;
    config.payment_backoff_ms = 1;
    config.payment_backoff_max_ms = 2;
    config.payment_retry_percent = 0.2;
    config.payment_breaker_failure_rate = 1.0;
    let client = PaymentClient::new(config).unwrap();
    for key in 0..50 {
        let outcome = client.charge(&format!("key-{key}"), 100).await;
        assert!(
            matches!(outcome, Err(PaymentError::Unknown(_))),
            "{outcome:?}"
        );
    }
    // Without the budget: 50 × 6 attempts. With it: the calls plus about a fifth.
    let requests = provider.stats().requests;
    assert!(requests < 50 * 2, "{requests} requests for 50 calls");
    assert!(requests > 50, "some retries are allowed: {requests}");
    cancel.cancel();
}

#[tokio::test]
async fn the_bulkhead_refuses_calls_past_its_bound_without_sending_them() {
    let cancel = CancellationToken::new();
    let knobs = Knobs {
        latency_ms: 300,
        ..Knobs::default()
    };
    let (provider, url) = start_provider(knobs, &cancel).await;
    let mut config = PaymentConfig::defaults(&url);
    config.payment_max_in_flight = 2;
    let client = PaymentClient::new(config).unwrap();
    let calls = (0..6).map(|key| {
        let client = client.clone();
        async move { client.charge(&format!("key-{key}"), 100).await }
    });
    let outcomes = join_all(calls).await;
    let done = outcomes.iter().filter(|o| o.is_ok()).count();
    let refused = outcomes
        .iter()
        .filter(|o| matches!(o, Err(PaymentError::NotSent(_))))
        .count();
    assert_eq!((done, refused), (2, 4), "{outcomes:?}");
    assert_eq!(provider.stats().requests, 2);
    cancel.cancel();
}

#[tokio::test]
async fn the_breaker_opens_under_an_outage_then_half_opens_and_closes() {
    let cancel = CancellationToken::new();
    let (provider, url) = start_provider(Knobs::default(), &cancel).await;
    let mut config = PaymentConfig::defaults(&url);
    config.payment_retries = 0;
    config.payment_breaker_min_requests = 5;
    // failsafe judges only once a whole window of history exists.
    config.payment_breaker_window_s = 1;
    config.payment_breaker_failure_rate = 0.5;
    config.payment_breaker_open_ms = 1_000;
    let client = PaymentClient::new(config).unwrap();
    assert!(client.circuit_closed());

    // Outage: every call fails until the window holds enough of them.
    let outage = Knobs {
        error_rate: 1.0,
        ..Knobs::default()
    };
    set_knobs(&url, &outage).await;
    let mut failures = 0;
    while client.circuit_closed() {
        let outcome = client.charge(&format!("down-{failures}"), 100).await;
        assert!(
            matches!(outcome, Err(PaymentError::Unknown(_))),
            "{outcome:?}"
        );
        failures += 1;
        assert!(failures <= 60, "the breaker never opened");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        failures >= 5,
        "opened before its minimum volume: {failures}"
    );

    // Open: calls fail fast and none reaches the provider.
    let before = provider.stats().requests;
    for key in 0..20 {
        let started = std::time::Instant::now();
        let outcome = client.charge(&format!("open-{key}"), 100).await;
        assert_eq!(
            outcome,
            Err(PaymentError::NotSent("payment provider circuit open"))
        );
        assert!(started.elapsed() < Duration::from_millis(50));
    }
    assert_eq!(
        provider.stats().requests,
        before,
        "calls went through an open breaker"
    );

    // Recovery: after the open period one call tests the provider and closes it.
    set_knobs(&url, &Knobs::default()).await;
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let charge = client.charge("probe", 100).await.unwrap();
    assert_eq!(charge.status, ChargeStatus::Captured);
    assert!(client.circuit_closed());
    for key in 0..5 {
        client.charge(&format!("up-{key}"), 100).await.unwrap();
    }
    cancel.cancel();
}

#[tokio::test]
async fn a_lost_answer_times_out_and_the_lookup_finds_the_capture() {
    let cancel = CancellationToken::new();
    let knobs = Knobs {
        lost_rate: 1.0,
        hang_ms: 2_000,
        ..Knobs::default()
    };
    let (_provider, url) = start_provider(knobs, &cancel).await;
    let mut config = PaymentConfig::defaults(&url);
    config.payment_retries = 0;
    config.payment_attempt_timeout_ms = 200;
    let client = PaymentClient::new(config).unwrap();
    let outcome = client.charge("lost", 100).await;
    assert!(
        matches!(outcome, Err(PaymentError::Unknown(_))),
        "{outcome:?}"
    );
    set_knobs(&url, &Knobs::default()).await;
    let found = client
        .lookup("lost")
        .await
        .unwrap()
        .expect("the charge was applied");
    assert_eq!(found.status, ChargeStatus::Captured);
    assert_eq!(client.lookup("never").await.unwrap(), None);
    cancel.cancel();
}
