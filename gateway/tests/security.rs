//! The security suite: each test is an attack, performed for real over HTTP
//! against the running stack (or the real binary), that must fail.
//! `cargo test -p gateway --test security` ends with cargo's one-line
//! summary of the cases passed.

mod common;

use std::process::Command;

use boxoffice_contract::token::{now_s, Claims, TokenUse};
use common::{Stack, ADMIN_TOKEN, PAYMENT_API_KEY, SERVICE_TOKEN};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

async fn status_of(request: reqwest::RequestBuilder) -> (StatusCode, Value) {
    let response = request.send().await.unwrap();
    let status = response.status();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// A pod that reaches the order service cannot skip the queue, make an event
/// free, read tickets or the pipeline's health without the service token.
#[sqlx::test(migrator = "order_service::MIGRATOR")]
async fn the_internal_plane_refuses_callers_without_the_service_token(
    options: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let stack = Stack::start_with(options, connect, false).await;
    stack.create_event("plane", 10, 50.0, 2).await;
    let o = &stack.order_service;
    let order_id = uuid::Uuid::now_v7();
    let attacks = [
        (
            Method::POST,
            format!("{o}/internal/orders"),
            Some(json!({
                "order_id": order_id, "event_id": "plane", "fan_id": "mallory", "quantity": 2,
            })),
        ),
        (
            Method::PUT,
            format!("{o}/internal/events/plane"),
            Some(json!({
                "name": "free", "capacity": 100000, "price_cents": 0,
            })),
        ),
        (
            Method::PUT,
            format!("{o}/internal/events/plane/settings"),
            Some(json!({ "rate": "1000" })),
        ),
        (Method::GET, format!("{o}/internal/event-settings"), None),
        (
            Method::GET,
            format!("{o}/internal/events/plane/settings"),
            None,
        ),
        (Method::GET, format!("{o}/internal/orders/{order_id}"), None),
        (
            Method::GET,
            format!("{o}/internal/orders/{order_id}/tickets.pdf"),
            None,
        ),
        (Method::GET, format!("{o}/internal/health"), None),
    ];
    for (method, url, body) in &attacks {
        for credential in [
            None,
            Some("Bearer not-the-service-token"),
            Some(ADMIN_TOKEN),
        ] {
            let mut request = stack.http.request(method.clone(), url);
            if let Some(body) = body {
                request = request.json(body);
            }
            if let Some(credential) = credential {
                request = request.header("authorization", credential);
            }
            let (status, problem) = status_of(request).await;
            assert_eq!(
                status,
                StatusCode::UNAUTHORIZED,
                "{method} {url} with {credential:?}: {problem}"
            );
            assert_eq!(
                problem["type"]
                    .as_str()
                    .map(|t| t.ends_with("/unauthorized")),
                Some(true),
                "{problem}"
            );
        }
    }
    let placed: i64 = sqlx::query_scalar("SELECT count(*) FROM orders")
        .fetch_one(&stack.pool)
        .await
        .unwrap();
    assert_eq!(placed, 0, "no order was placed around the queue");
    let price: i64 = sqlx::query_scalar("SELECT price_cents FROM events WHERE event_id = 'plane'")
        .fetch_one(&stack.pool)
        .await
        .unwrap();
    assert_eq!(price, 4_500, "the event was not made free");

    // The probes stay open (orchestrators call them without credentials),
    // and the real caller's token works.
    for path in ["/healthz", "/readyz", "/metrics"] {
        let status = stack
            .http
            .get(format!("{o}{path}"))
            .send()
            .await
            .unwrap()
            .status();
        assert_ne!(status, StatusCode::UNAUTHORIZED, "{path}");
    }
    let (status, seats) = status_of(
        stack
            .http
            .get(format!("{o}/internal/events/plane"))
            .bearer_auth(SERVICE_TOKEN),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{seats}");
    assert_eq!(seats["capacity"], 10);
    stack.stop().await;
}

/// Nobody but the order service may take money or turn the fake provider's knobs.
#[sqlx::test(migrator = "order_service::MIGRATOR")]
async fn the_payment_provider_refuses_callers_without_its_api_key(
    options: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let stack = Stack::start_with(options, connect, false).await;
    let p = &stack.payment_provider;
    let attacks = [
        (
            Method::PUT,
            format!("{p}/v1/knobs"),
            Some(json!({ "error_rate": 1.0 })),
        ),
        (Method::GET, format!("{p}/v1/knobs"), None),
        (Method::GET, format!("{p}/v1/charges"), None),
        (
            Method::POST,
            format!("{p}/v1/charges"),
            Some(json!({ "idempotency_key": "k", "amount_cents": 1 })),
        ),
        (Method::POST, format!("{p}/v1/charges/k/refund"), None),
    ];
    for (method, url, body) in &attacks {
        let mut request = stack
            .http
            .request(method.clone(), url)
            .bearer_auth(SERVICE_TOKEN);
        if let Some(body) = body {
            request = request.json(body);
        }
        let (status, problem) = status_of(request).await;
        assert_eq!(
            status,
            StatusCode::UNAUTHORIZED,
            "{method} {url}: {problem}"
        );
    }
    let (status, knobs) = status_of(
        stack
            .http
            .get(format!("{p}/v1/knobs"))
            .bearer_auth(PAYMENT_API_KEY),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        knobs["error_rate"], 0.0,
        "the knobs were not turned: {knobs}"
    );
    stack.stop().await;
}

/// Guessing the admin token: after ten wrong tries the client is locked out,
/// and the right token from it gets 429 too, so guessing cannot go on.
#[sqlx::test(migrator = "order_service::MIGRATOR")]
async fn admin_token_guesses_are_locked_out(options: PgPoolOptions, connect: PgConnectOptions) {
    let stack = Stack::start_with(options, connect, false).await;
    let url = format!("{}/admin/v1/events", stack.admission);
    let admin = |token: &str| {
        stack
            .http
            .get(&url)
            .header("authorization", token.to_owned())
    };
    // The scheme is case-insensitive (RFC 9110).
    let (status, _) = status_of(admin(&format!("bearer {ADMIN_TOKEN}"))).await;
    assert_eq!(status, StatusCode::OK);
    for guess in 0..10 {
        let (status, _) = status_of(admin(&format!("Bearer guess-{guess}"))).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "guess {guess}");
    }
    let response = admin(&format!("Bearer {ADMIN_TOKEN}"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    let wait: u64 = response.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=300).contains(&wait), "Retry-After {wait}");
    let problem: Value = response.json().await.unwrap();
    assert_eq!(
        problem["type"]
            .as_str()
            .map(|t| t.ends_with("/too-many-failures")),
        Some(true),
        "{problem}"
    );
    stack.stop().await;
}

/// A refused token's answer says "invalid token", never which check failed
/// (a forger learns nothing about signature, key or expiry).
#[sqlx::test(migrator = "order_service::MIGRATOR")]
async fn refused_tokens_do_not_say_which_check_failed(
    options: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let stack = Stack::start_with(options, connect, false).await;
    stack.create_event("vague", 10, 50.0, 2).await;
    let (_, joined) = stack.join("vague", "fan-1").await;
    let ticket = joined["queue_ticket"].as_str().unwrap().to_owned();
    let access = stack.wait_admitted("vague", &ticket).await;
    // The same token with its signature broken, and a queue ticket used as an access token.
    let (head, _) = access.rsplit_once('.').unwrap();
    let forged = format!("{head}.{}", "A".repeat(86));
    let other_key = boxoffice_contract::token::KeySet::from_pems(
        "boxoffice",
        &boxoffice_contract::token::generate_ed25519_pem(),
        &[],
        common::QUEUE_SECRET,
    )
    .unwrap();
    let foreign = other_key.sign(&Claims::new(
        "boxoffice",
        "vague",
        "fan-1",
        TokenUse::Access,
        now_s(),
        60,
    ));
    // And a genuine one that has expired.
    let expired = stack.keys.sign(&Claims::new(
        "boxoffice",
        "vague",
        "fan-1",
        TokenUse::Access,
        now_s() - 3_600,
        60,
    ));
    let mut details = Vec::new();
    for token in [&forged, &ticket, &foreign, &expired, &"x.y.z".to_owned()] {
        let (status, problem) = stack.buy("vague", token, 1, None).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{problem}");
        details.push(problem["detail"].clone());
    }
    assert!(details.iter().all(|d| d == "invalid token"), "{details:?}");
    let (status, problem) = status_of(
        stack
            .http
            .get(format!("{}/v1/events/vague/queue/status", stack.gateway))
            .bearer_auth(&forged),
    )
    .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(problem["detail"], "invalid queue ticket");
    stack.stop().await;
}

fn gateway_binary(env: &[(&str, &str)]) -> std::process::Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_gateway"));
    command
        .env_clear()
        .env("GATEWAY_LISTEN", "127.0.0.1:0")
        .env("REDIS_URL", "redis://127.0.0.1:1")
        .env("RUST_LOG", "warn");
    for (name, value) in env {
        command.env(name, value);
    }
    command.output().unwrap()
}

const GOOD: &str = "3f9a1c0e7b5d2468ace013579bdf2468ace013579bdf2468";

/// No secret has a default that works, and a well-known one is refused unless
/// the development flag says so.
#[test]
fn the_gateway_refuses_to_start_without_its_secrets_or_with_well_known_ones() {
    let key = std::env::temp_dir().join(format!("security-{}.pem", uuid::Uuid::new_v4()));
    std::fs::write(&key, boxoffice_contract::token::generate_ed25519_pem()).unwrap();
    let key = key.display().to_string();
    let cases: [(&[(&str, &str)], &str); 4] = [
        (
            &[
                ("BOXOFFICE_SIGNING_KEY", &key),
                ("BOXOFFICE_QUEUE_SECRET", GOOD),
            ],
            "required arguments were not provided:\n  --service-token",
        ),
        (
            &[
                ("BOXOFFICE_SIGNING_KEY", &key),
                ("BOXOFFICE_SERVICE_TOKEN", GOOD),
            ],
            "required arguments were not provided:\n  --queue-secret",
        ),
        (
            &[
                ("BOXOFFICE_SIGNING_KEY", &key),
                ("BOXOFFICE_SERVICE_TOKEN", GOOD),
                (
                    "BOXOFFICE_QUEUE_SECRET",
                    "dev-queue-secret-change-me-0123456789",
                ),
            ],
            "well-known development value",
        ),
        (
            &[
                ("BOXOFFICE_SIGNING_KEY", &key),
                ("BOXOFFICE_SERVICE_TOKEN", "short"),
                ("BOXOFFICE_QUEUE_SECRET", GOOD),
            ],
            "at least 32 bytes",
        ),
    ];
    for (env, why) in cases {
        let out = gateway_binary(env);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{env:?} started");
        assert!(stderr.contains(why), "{env:?}: {stderr}");
    }
    // With the flag a development value passes the check (and the start then
    // fails further on, at Redis on port 1).
    let out = gateway_binary(&[
        ("BOXOFFICE_SIGNING_KEY", &key),
        ("BOXOFFICE_SERVICE_TOKEN", GOOD),
        (
            "BOXOFFICE_QUEUE_SECRET",
            "dev-queue-secret-change-me-0123456789",
        ),
        ("BOXOFFICE_ALLOW_DEV_SECRETS", "true"),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("Redis"), "{stderr}");
    assert!(!stderr.contains("well-known"), "{stderr}");
}

/// `--help` shows where a secret comes from, never its value.
#[test]
fn help_never_prints_a_secret() {
    let help = Command::new(env!("CARGO_BIN_EXE_gateway"))
        .arg("--help")
        .env(
            "BOXOFFICE_SERVICE_TOKEN",
            "service-token-value-do-not-print",
        )
        .env(
            "BOXOFFICE_SERVICE_TOKENS_ACCEPTED",
            "accepted-token-value-do-not-print",
        )
        .env("BOXOFFICE_QUEUE_SECRET", "queue-secret-value-do-not-print")
        .env(
            "REDIS_URL",
            "rediss://default:redis-password-do-not-print@cache:6380",
        )
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&help.stdout);
    assert!(text.contains("BOXOFFICE_SERVICE_TOKEN"), "{text}");
    assert!(!text.contains("do-not-print"), "{text}");
}

/// An admitted fan cannot buy once ops have closed the sale.
#[sqlx::test(migrator = "order_service::MIGRATOR")]
async fn a_closed_sale_sells_nothing(options: PgPoolOptions, connect: PgConnectOptions) {
    let stack = Stack::start_with(options, connect, false).await;
    stack.create_event("shut", 10, 50.0, 2).await;
    let (_, joined) = stack.join("shut", "fan-1").await;
    let access = stack
        .wait_admitted("shut", joined["queue_ticket"].as_str().unwrap())
        .await;
    let (status, body) = status_of(
        stack
            .http
            .patch(format!("{}/admin/v1/events/shut", stack.admission))
            .bearer_auth(ADMIN_TOKEN)
            .json(&json!({ "state": "closed" })),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, problem) = stack.buy("shut", &access, 1, None).await;
    assert_eq!(status, StatusCode::GONE, "{problem}");
    assert_eq!(
        problem["type"].as_str().map(|t| t.ends_with("/closed")),
        Some(true),
        "{problem}"
    );
    let orders: i64 = sqlx::query_scalar("SELECT count(*) FROM orders")
        .fetch_one(&stack.pool)
        .await
        .unwrap();
    assert_eq!(orders, 0);
    stack.stop().await;
}

/// The pages cannot be framed (clickjacking), sniffed into another type, or
/// run script the page did not ship (an injected inline script is refused by
/// the browser: only the page's own inline blocks are allowed, by hash).
#[sqlx::test(migrator = "order_service::MIGRATOR")]
async fn pages_carry_a_content_security_policy_and_refuse_framing(
    options: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let stack = Stack::start_with(options, connect, false).await;
    for url in [
        format!("{}/", stack.gateway),
        format!("{}/admin/", stack.admission),
    ] {
        let response = stack.http.get(&url).send().await.unwrap();
        assert_eq!(response.status(), StatusCode::OK, "{url}");
        let header = |name: &str| {
            response
                .headers()
                .get(name)
                .map(|v| v.to_str().unwrap().to_owned())
                .unwrap_or_default()
        };
        let csp = header("content-security-policy");
        assert!(csp.contains("frame-ancestors 'none'"), "{url}: {csp}");
        assert!(csp.contains("default-src 'none'"), "{url}: {csp}");
        assert!(
            !csp.contains("unsafe-inline") && !csp.contains("unsafe-eval"),
            "{url}: {csp}"
        );
        assert_eq!(header("x-content-type-options"), "nosniff", "{url}");
        assert_eq!(header("x-frame-options"), "DENY", "{url}");
        assert_eq!(header("referrer-policy"), "no-referrer", "{url}");
    }
    stack.stop().await;
}

/// Whoever can write to `order-events` cannot mint tickets: a forged
/// confirmation (an order PostgreSQL does not have, a real one with more
/// seats than it bought, a declined one) is dead-lettered, and no ticket is
/// written.
#[sqlx::test(migrator = "order_service::MIGRATOR")]
async fn a_forged_confirmation_on_the_topic_mints_no_tickets(
    options: PgPoolOptions,
    connect: PgConnectOptions,
) {
    use boxoffice_contract::envelope::{CloudEvent, OrderConfirmed, ORDER_CONFIRMED_V1};
    use rdkafka::producer::FutureRecord;

    let stack = Stack::start(options, connect).await;
    stack.create_event("forge", 10, 50.0, 2).await;
    let (_, joined) = stack.join("forge", "fan-1").await;
    let access = stack
        .wait_admitted("forge", joined["queue_ticket"].as_str().unwrap())
        .await;
    let (_, bought) = stack.buy("forge", &access, 1, None).await;
    let order_id = bought["order_id"].as_str().unwrap().to_owned();
    stack
        .wait_ticketed(&order_id, bought["order_token"].as_str().unwrap())
        .await;

    // A second fan's card is declined: that order fails, unpaid.
    stack.knobs(json!({ "decline_rate": 1.0 })).await;
    let (_, joined) = stack.join("forge", "fan-2").await;
    let access = stack
        .wait_admitted("forge", joined["queue_ticket"].as_str().unwrap())
        .await;
    let (_, declined) = stack.buy("forge", &access, 1, None).await;
    let declined_id = declined["order_id"].as_str().unwrap().to_owned();
    for _ in 0..300 {
        let (_, order) = stack
            .order(&declined_id, declined["order_token"].as_str().unwrap())
            .await;
        if order["status"] == "failed" {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }

    let real: uuid::Uuid = order_id.parse().unwrap();
    let confirmation = |order_id, fan: &str, quantity, first_seat| OrderConfirmed {
        order_id,
        event_id: "forge".into(),
        fan_id: fan.into(),
        quantity,
        first_seat,
        amount_cents: 0,
    };
    let forged = [
        // An order nobody placed.
        confirmation(uuid::Uuid::now_v7(), "mallory", 2, 3),
        // The real order, claiming four more seats (free ones).
        confirmation(real, "fan-1", 4, 5),
        // The declined order, as if it had been paid.
        confirmation(declined_id.parse().unwrap(), "fan-2", 1, 9),
    ];
    let producer = order_service::kafka::producer(&common::brokers()).unwrap();
    for order in &forged {
        let event = CloudEvent::new(
            ORDER_CONFIRMED_V1,
            order.order_id.to_string(),
            order.clone(),
        );
        producer
            .send(
                FutureRecord::to(&stack.topic)
                    .key(&order.order_id.to_string())
                    .payload(&serde_json::to_vec(&event).unwrap()),
                std::time::Duration::from_secs(30),
            )
            .await
            .map_err(|(e, _)| e)
            .unwrap();
    }
    // Wait until the workers have taken (and committed) everything.
    let group = stack.topic.replace("order-events-", "ticket-issuer-");
    let probe =
        order_service::health::BrokerProbe::new(&common::brokers(), &group, &stack.topic).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(90);
    loop {
        let lag = probe.lag().await;
        if matches!(&lag, Ok(p) if !p.is_empty() && p.iter().all(|(_, lag)| *lag == 0)) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never consumed: {lag:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    let tickets: Vec<(uuid::Uuid, i64)> =
        sqlx::query_as("SELECT order_id, count(*) FROM tickets GROUP BY order_id")
            .fetch_all(&stack.pool)
            .await
            .unwrap();
    assert_eq!(tickets, [(real, 1)], "only the real order's one ticket");
    stack.stop().await;
}

/// A fresh admission of `fan_id`: its access token.
async fn admitted(stack: &Stack, event_id: &str, fan_id: &str) -> String {
    let (status, joined) = stack.join(event_id, fan_id).await;
    assert!(status.is_success(), "{joined}");
    stack
        .wait_admitted(event_id, joined["queue_ticket"].as_str().unwrap())
        .await
}

/// The per-fan limit is a limit on seats per fan per event across all
/// orders: a fan that bought its limit, joined again and was admitted again
/// cannot buy more (PostgreSQL counts, not the admission); also when
/// PostgreSQL has lost, or never got, its copy of the event's settings (the
/// gateway hands on the limit it checked).
#[sqlx::test(migrator = "order_service::MIGRATOR")]
async fn a_fan_cannot_buy_past_its_limit_by_joining_again(
    options: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let stack = Stack::start_with(options, connect, false).await;
    for (event, settings_lost) in [("greedy", false), ("greedy-lost", true)] {
        stack.create_event(event, 10, 50.0, 2).await;
        if settings_lost {
            sqlx::query("UPDATE events SET settings = NULL WHERE event_id = $1")
                .bind(event)
                .execute(&stack.pool)
                .await
                .unwrap();
        }
        let first = admitted(&stack, event, "fan-1").await;
        let (status, body) = stack.buy(event, &first, 2, None).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{event}: {body}");

        let second = admitted(&stack, event, "fan-1").await;
        assert_ne!(first, second, "a second admission");
        let (status, problem) = stack.buy(event, &second, 1, None).await;
        assert_eq!(status, StatusCode::CONFLICT, "{event}: {problem}");
        assert_eq!(
            problem["type"]
                .as_str()
                .map(|t| t.ends_with("/fan-limit-reached")),
            Some(true),
            "{event}: {problem}"
        );
        let seats: i64 = sqlx::query_scalar(
            "SELECT coalesce(sum(quantity), 0) FROM orders WHERE event_id = $1 AND fan_id = 'fan-1'",
        )
        .bind(event)
        .fetch_one(&stack.pool)
        .await
        .unwrap();
        assert_eq!(seats, 2, "{event}: the fan holds its limit, no more");
    }
    stack.stop().await;
}

/// Once an event has opened its shuffle seed is public; moving `opens_at`
/// into the future again would let new prequeue fans pick ids that land
/// first, so it is refused, and the published seed stays the event's.
#[sqlx::test(migrator = "order_service::MIGRATOR")]
async fn an_opened_event_cannot_be_rescheduled_to_reuse_its_public_seed(
    options: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let stack = Stack::start_with(options, connect, false).await;
    stack.create_event("again", 10, 50.0, 2).await;
    let event = |stack: &Stack| {
        stack
            .http
            .get(format!("{}/v1/events/again", stack.gateway))
            .send()
    };
    let before: Value = event(&stack).await.unwrap().json().await.unwrap();
    let seed = before["shuffle_seed"]
        .as_str()
        .expect("published once open")
        .to_owned();
    let later = chrono::Utc::now() + chrono::Duration::hours(1);
    let (status, problem) = status_of(
        stack
            .http
            .put(format!("{}/admin/v1/events/again", stack.admission))
            .bearer_auth(ADMIN_TOKEN)
            .json(&json!({
                "name": "Again", "capacity": 10, "opens_at": later, "identity": "declared",
                "prequeue_at": later - chrono::Duration::minutes(30),
                "admission_rate_per_s": 50.0, "per_fan_limit": 2,
            })),
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT, "{problem}");
    assert_eq!(
        problem["type"]
            .as_str()
            .map(|t| t.ends_with("/seed-published")),
        Some(true),
        "{problem}"
    );
    let after: Value = event(&stack).await.unwrap().json().await.unwrap();
    assert_eq!(
        after["shuffle_seed"],
        seed.as_str(),
        "still open, same seed: {after}"
    );
    assert_eq!(after["shuffle_commitment"], before["shuffle_commitment"]);
    stack.stop().await;
}

/// Redis lost an opened event's settings (a restart without persistence,
/// a flush) and an admin write comes before the periodic restore: the
/// event is still what PostgreSQL kept. Its published seed stays, and the
/// checks that guard it still hold: no new opening in the future.
#[sqlx::test(migrator = "order_service::MIGRATOR")]
async fn an_admin_write_after_redis_lost_the_event_keeps_its_published_seed(
    options: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let stack = Stack::start_with(options, connect, false).await;
    stack.create_event("lost", 10, 50.0, 2).await;
    let seed = stack.public_event("lost").await["shuffle_seed"]
        .as_str()
        .unwrap()
        .to_owned();
    let mut redis = redis::Client::open(common::redis_url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let config = boxoffice_contract::keys::EventKeys::new(&stack.prefix, "lost").config();
    let put = |opens_at: chrono::DateTime<chrono::Utc>| {
        status_of(
            stack
                .http
                .put(format!("{}/admin/v1/events/lost", stack.admission))
                .bearer_auth(ADMIN_TOKEN)
                .json(&json!({
                    "name": "Lost", "capacity": 10, "opens_at": opens_at, "identity": "declared",
                    "prequeue_at": opens_at - chrono::Duration::minutes(30),
                    "admission_rate_per_s": 50.0, "per_fan_limit": 2,
                })),
        )
    };

    let _: () = redis::cmd("DEL")
        .arg(&config)
        .query_async(&mut redis)
        .await
        .unwrap();
    let (status, problem) = put(chrono::Utc::now() + chrono::Duration::hours(1)).await;
    assert_eq!(
        (status, slug(&problem)),
        (StatusCode::CONFLICT, "seed-published"),
        "{problem}"
    );

    let _: () = redis::cmd("DEL")
        .arg(&config)
        .query_async(&mut redis)
        .await
        .unwrap();
    let (status, body) = put(chrono::Utc::now() - chrono::Duration::seconds(1)).await;
    assert_eq!(
        status,
        StatusCode::OK,
        "a replacement, not a new event: {body}"
    );
    assert_eq!(
        stack.public_event("lost").await["shuffle_seed"],
        seed.as_str(),
        "the published seed stays"
    );
    stack.stop().await;
}

/// An event's way of naming fans is fixed once fans hold places under it
/// or it has opened: a PUT that leaves `identity` out (a PUT replaces every
/// setting) must not quietly make an anonymous sale `declared`, where
/// anyone could act as any fan by its id.
/// Admin writes of one event that come at once (two operators, two
/// admission replicas) all reach PostgreSQL's copy of its settings, which
/// is what a Redis loss restores: after a burst of PATCHes of different
/// fields, the copy is exactly what Redis holds. (Each write read the
/// settings, kept the whole in PostgreSQL, then wrote Redis; interleaved,
/// the copy lost some of them.)
#[sqlx::test(migrator = "order_service::MIGRATOR")]
async fn concurrent_admin_writes_all_reach_the_kept_settings(
    options: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let stack = Stack::start_with(options, connect, false).await;
    stack.create_event("tuned", 10, 50.0, 2).await;
    let mut redis = redis::Client::open(common::redis_url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let config = boxoffice_contract::keys::EventKeys::new(&stack.prefix, "tuned").config();
    for round in 0..3 {
        let patches = (0..12).map(|i| {
            let body = match i % 3 {
                0 => json!({ "admission_rate_per_s": 10.0 + f64::from(i + 100 * round) }),
                1 => json!({ "max_active": 500 + i + 100 * round }),
                _ => json!({ "pow_bits": (i + round) % 4 }),
            };
            stack
                .http
                .patch(format!("{}/admin/v1/events/tuned", stack.admission))
                .bearer_auth(ADMIN_TOKEN)
                .json(&body)
                .send()
        });
        for response in futures_util::future::join_all(patches).await {
            let response = response.unwrap();
            assert_eq!(
                response.status(),
                StatusCode::OK,
                "{:?}",
                response.text().await
            );
        }
        let live: std::collections::BTreeMap<String, String> =
            redis::AsyncCommands::hgetall(&mut redis, &config)
                .await
                .unwrap();
        let (kept,): (Value,) =
            sqlx::query_as("SELECT settings FROM events WHERE event_id = 'tuned'")
                .fetch_one(&stack.pool)
                .await
                .unwrap();
        let kept: std::collections::BTreeMap<String, String> =
            serde_json::from_value(kept).unwrap();
        assert_eq!(
            kept, live,
            "round {round}: the kept copy differs from Redis"
        );
    }
    stack.stop().await;
}

#[sqlx::test(migrator = "order_service::MIGRATOR")]
async fn an_events_identity_cannot_change_once_fans_are_in_line(
    options: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let stack = Stack::start_with(options, connect, false).await;
    let put = |event_id: &str, extra: Value| {
        let mut body = json!({
            "name": "Anon", "capacity": 10, "admission_rate_per_s": 0.001,
            "opens_at": chrono::Utc::now() - chrono::Duration::seconds(1),
        });
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        status_of(
            stack
                .http
                .put(format!("{}/admin/v1/events/{event_id}", stack.admission))
                .bearer_auth(ADMIN_TOKEN)
                .json(&body),
        )
    };

    // Not open yet and nobody in line: still the organiser's to change.
    let later = chrono::Utc::now() + chrono::Duration::hours(1);
    let (status, body) = put(
        "soon",
        json!({ "identity": "anonymous", "opens_at": later }),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let (status, body) = put("soon", json!({ "identity": "account", "opens_at": later })).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(stack.public_event("soon").await["identity"], "account");

    // Left out, an event names its fans itself: a client's word is no
    // identity unless the organiser says so.
    let (status, body) = put("plain", json!({})).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(stack.public_event("plain").await["identity"], "anonymous");
    let (status, problem) = join_with(&stack, "plain", json!({ "fan_id": "victim" }), None).await;
    assert_eq!(
        (status, slug(&problem)),
        (StatusCode::UNPROCESSABLE_ENTITY, "fan-id-not-accepted"),
        "{problem}"
    );

    // Open, with a fan in line: fixed. A PUT that leaves `identity` out
    // would make a declared sale anonymous, so it is refused too.
    let (status, body) = put("named", json!({ "identity": "declared" })).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let (status, body) = join_with(&stack, "named", json!({ "fan_id": "ann" }), None).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let (status, problem) = put("named", json!({ "name": "Named, renamed" })).await;
    assert_eq!(
        (status, slug(&problem)),
        (StatusCode::CONFLICT, "identity-fixed"),
        "{problem}"
    );
    assert!(
        problem["detail"].as_str().unwrap().contains("declared"),
        "{problem}"
    );
    assert_eq!(stack.public_event("named").await["identity"], "declared");
    // Restating it is a replacement like any other.
    let (status, body) = put(
        "named",
        json!({ "name": "Named, renamed", "identity": "declared" }),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");

    // Not open yet, but the prequeue is, and a fan is in it: fixed too.
    let prequeue = json!({
        "identity": "anonymous", "opens_at": later,
        "prequeue_at": chrono::Utc::now() - chrono::Duration::seconds(1),
    });
    let (status, body) = put("pre", prequeue.clone()).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let (status, body) = join_with(&stack, "pre", json!({}), None).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let mut declared = prequeue;
    declared["identity"] = json!("declared");
    let (status, problem) = put("pre", declared).await;
    assert_eq!(
        (status, slug(&problem)),
        (StatusCode::CONFLICT, "identity-fixed"),
        "{problem}"
    );
    stack.stop().await;
}

async fn join_with(
    stack: &Stack,
    event_id: &str,
    body: Value,
    ticket: Option<&str>,
) -> (StatusCode, Value) {
    let mut request = stack
        .http
        .post(format!("{}/v1/events/{event_id}/queue", stack.gateway))
        .json(&body);
    if let Some(ticket) = ticket {
        request = request.bearer_auth(ticket);
    }
    status_of(request).await
}

fn slug(problem: &Value) -> &str {
    problem["type"]
        .as_str()
        .and_then(|t| t.rsplit('/').next())
        .unwrap_or("")
}

/// `anonymous` events: a client-sent id is never an identity. Knowing or
/// guessing a fan's id gets nothing: the gateway names each fan, and only
/// the holder of a fan's queue ticket keeps (or reads) that fan's place.
#[sqlx::test(migrator = "order_service::MIGRATOR")]
async fn an_anonymous_fan_cannot_be_impersonated_by_its_id(
    options: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let stack = Stack::start_with(options, connect, false).await;
    stack
        .create_event_with(
            "anon",
            json!({ "identity": "anonymous", "admission_rate_per_s": 0.001 }),
        )
        .await;
    stack.create_event_with("other", json!({})).await;

    let (status, problem) = join_with(
        &stack,
        "anon",
        json!({ "fan_id": "victim@example.com" }),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{problem}");
    assert_eq!(slug(&problem), "fan-id-not-accepted");

    let (status, first) = join_with(&stack, "anon", json!({}), None).await;
    assert_eq!(status, StatusCode::CREATED, "{first}");
    let fan = first["fan_id"].as_str().unwrap().to_owned();
    assert!(fan.starts_with("anon-"), "{fan}");
    let ticket = first["queue_ticket"].as_str().unwrap().to_owned();

    // The ticket's holder keeps the place; anyone else is a new fan.
    let (status, again) = join_with(&stack, "anon", json!({}), Some(&ticket)).await;
    assert_eq!(status, StatusCode::OK, "{again}");
    assert_eq!(again["fan_id"], fan.as_str());
    assert_eq!(again["position"], first["position"]);
    let (status, stranger) = join_with(&stack, "anon", json!({}), None).await;
    assert_eq!(status, StatusCode::CREATED, "{stranger}");
    assert_ne!(stranger["fan_id"], fan.as_str());

    // Another event's ticket (or a forged one) is no key to this line.
    let (_, declared) = join_with(&stack, "other", json!({ "fan_id": fan }), None).await;
    let foreign = declared["queue_ticket"].as_str().unwrap();
    let (status, problem) = join_with(&stack, "anon", json!({}), Some(foreign)).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{problem}");
    assert_eq!(slug(&problem), "invalid-ticket");
    let public = stack.public_event("anon").await;
    assert_eq!(public["identity"], "anonymous");

    // With proof of work, an anonymous join's work is bound to no fan id,
    // so one solved challenge must not buy a second place.
    stack
        .create_event_with(
            "anonpow",
            json!({ "identity": "anonymous", "pow_bits": 8, "admission_rate_per_s": 0.001 }),
        )
        .await;
    let challenge: Value = stack
        .http
        .get(format!("{}/v1/events/anonpow/challenge", stack.gateway))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let challenge = challenge["challenge"].as_str().unwrap();
    let pow = json!({ "challenge": challenge, "nonce": gateway::pow::solve(challenge, "", 8) });
    let (status, body) = join_with(&stack, "anonpow", json!({ "pow": pow }), None).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let (status, problem) = join_with(&stack, "anonpow", json!({ "pow": pow }), None).await;
    assert_eq!(
        (status, slug(&problem)),
        (StatusCode::UNPROCESSABLE_ENTITY, "invalid-proof-of-work"),
        "{problem}"
    );
    stack.stop().await;
}

/// The site rotates its login keys by publishing a new JWKS: the gateway
/// reads it again (here every second) and takes the new key without a
/// restart, and a key the site withdrew stops letting anyone in.
#[sqlx::test(migrator = "order_service::MIGRATOR")]
async fn the_gateway_follows_the_sites_login_key_rotation(
    options: PgPoolOptions,
    connect: PgConnectOptions,
) {
    use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
    use std::time::{Duration, Instant};

    const ISSUER: &str = "https://login.example.com";
    let jwks_of = |pem: &str| {
        serde_json::to_value(
            boxoffice_contract::token::KeySet::from_pems("login", pem, &[], common::QUEUE_SECRET)
                .unwrap()
                .jwks(),
        )
        .unwrap()
    };
    let (old_pem, new_pem) = (
        boxoffice_contract::token::generate_ed25519_pem(),
        boxoffice_contract::token::generate_ed25519_pem(),
    );
    let (old, new) = (jwks_of(&old_pem), jwks_of(&new_pem));
    let token = |pem: &str, jwks: &Value, sub: &str| {
        let mut header = Header::new(Algorithm::EdDSA);
        header.kid = jwks["keys"][0]["kid"].as_str().map(str::to_owned);
        encode(
            &header,
            &json!({ "sub": sub, "iss": ISSUER, "aud": "boxoffice", "exp": now_s() as i64 + 300 }),
            &EncodingKey::from_ed_pem(pem.as_bytes()).unwrap(),
        )
        .unwrap()
    };
    let jwks_file = std::env::temp_dir().join(format!("jwks-{}.json", uuid::Uuid::new_v4()));
    std::fs::write(&jwks_file, old.to_string()).unwrap();
    let path = jwks_file.display().to_string();
    let stack = Stack::start_with_gateway(options, connect, |c| {
        c.identity_jwks = Some(path);
        c.identity_issuer = ISSUER.into();
        c.identity_audience = "boxoffice".into();
        c.identity_jwks_refresh_s = 1;
    })
    .await;
    stack
        .create_event_with(
            "acct",
            json!({ "identity": "account", "admission_rate_per_s": 0.001 }),
        )
        .await;
    let join = |token: String| join_with(&stack, "acct", json!({ "identity_token": token }), None);

    let (status, problem) = join(token(&new_pem, &new, "user-1")).await;
    assert_eq!(
        (status, slug(&problem)),
        (StatusCode::UNAUTHORIZED, "invalid-identity"),
        "a key the site has not published yet"
    );
    let (status, joined) = join(token(&old_pem, &old, "user-2")).await;
    assert_eq!(status, StatusCode::CREATED, "{joined}");

    // The site publishes the new key beside the old one...
    let both = json!({ "keys": [old["keys"][0].clone(), new["keys"][0].clone()] });
    std::fs::write(&jwks_file, both.to_string()).unwrap();
    let started = Instant::now();
    loop {
        let (status, joined) = join(token(&new_pem, &new, "user-1")).await;
        if status == StatusCode::CREATED {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "the new key was not taken within 15 s: {status} {joined}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // ...where a token without a `kid` is checked against both.
    let (status, joined) = join(token(&new_pem, &json!({}), "user-4")).await;
    assert_eq!(
        status,
        StatusCode::CREATED,
        "a kid-less token of the new key: {joined}"
    );

    // Then withdraws the old one.
    std::fs::write(&jwks_file, new.to_string()).unwrap();
    let started = Instant::now();
    loop {
        let (status, problem) = join(token(&old_pem, &old, "user-3")).await;
        if status == StatusCode::UNAUTHORIZED {
            assert_eq!(slug(&problem), "invalid-identity", "a withdrawn key");
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "the old key still let user-3 in after 15 s: {status} {problem}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let _ = std::fs::remove_file(jwks_file);
    stack.stop().await;
}

/// A login JWKS URL that cannot be fetched does not stop the gateway (other
/// events sell), but the gateway is not ready and `account` joins are told
/// to come back; a JWKS URL in clear is refused at start.
#[sqlx::test(migrator = "order_service::MIGRATOR")]
async fn an_unreachable_login_jwks_keeps_the_gateway_unready_not_down(
    options: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let mut clear = gateway::Config::defaults();
    clear.identity_jwks = Some("http://login.example.com/jwks.json".into());
    clear.identity_issuer = "https://login.example.com".into();
    clear.identity_audience = "boxoffice".into();
    let redis = boxoffice_contract::redis_link::connect(&common::redis_url())
        .await
        .unwrap();
    let keys = boxoffice_contract::token::KeySet::from_pems(
        "boxoffice",
        &boxoffice_contract::token::generate_ed25519_pem(),
        &[],
        common::QUEUE_SECRET,
    )
    .unwrap();
    let refused = gateway::AppState::new(redis, keys, clear)
        .err()
        .expect("http:// refused");
    assert!(refused.to_string().contains("https://"), "{refused}");

    let stack = Stack::start_with_gateway(options, connect, |c| {
        c.identity_jwks = Some("https://127.0.0.1:9/jwks.json".into());
        c.identity_issuer = "https://login.example.com".into();
        c.identity_audience = "boxoffice".into();
    })
    .await;
    let ready = stack
        .http
        .get(format!("{}/readyz", stack.gateway))
        .send()
        .await
        .unwrap();
    assert_eq!(ready.status(), StatusCode::SERVICE_UNAVAILABLE);
    stack
        .create_event_with(
            "acct",
            json!({ "identity": "account", "admission_rate_per_s": 0.001 }),
        )
        .await;
    let (status, problem) =
        join_with(&stack, "acct", json!({ "identity_token": "a.b.c" }), None).await;
    assert_eq!(
        (status, slug(&problem)),
        (StatusCode::SERVICE_UNAVAILABLE, "identity-unavailable")
    );
    stack.create_event("plain", 10, 50.0, 2).await;
    let (status, joined) = stack.join("plain", "fan-1").await;
    assert_eq!(status, StatusCode::CREATED, "other events sell: {joined}");
    stack.stop().await;
}

/// `account` events: the fan is the `sub` of an identity token from the
/// site's login, checked against its JWKS (EdDSA and ES256 keys here);
/// one place per account, and no token, a forged one, one for another
/// audience, an expired one or an HMAC one made with a public key gets in.
#[sqlx::test(migrator = "order_service::MIGRATOR")]
async fn an_account_fan_is_the_subject_of_a_verified_identity_token(
    options: PgPoolOptions,
    connect: PgConnectOptions,
) {
    use jsonwebtoken::{encode, jwk::Jwk, Algorithm, EncodingKey, Header};

    let ed_pem = boxoffice_contract::token::generate_ed25519_pem();
    let ed_jwks =
        boxoffice_contract::token::KeySet::from_pems("login", &ed_pem, &[], common::QUEUE_SECRET)
            .unwrap()
            .jwks();
    let ed_jwks = serde_json::to_value(ed_jwks).unwrap();
    let ed_kid = ed_jwks["keys"][0]["kid"].as_str().unwrap().to_owned();
    let ec_pem = Command::new("openssl")
        .args([
            "genpkey",
            "-algorithm",
            "EC",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
        ])
        .output()
        .unwrap()
        .stdout;
    let ec_key = EncodingKey::from_ec_pem(&ec_pem).unwrap();
    let mut ec_jwk = Jwk::from_encoding_key(&ec_key, Algorithm::ES256).unwrap();
    ec_jwk.common.key_id = Some("ec-1".into());
    let mut keys = ed_jwks["keys"].as_array().unwrap().clone();
    keys.push(serde_json::to_value(&ec_jwk).unwrap());
    let jwks_file = std::env::temp_dir().join(format!("jwks-{}.json", uuid::Uuid::new_v4()));
    std::fs::write(&jwks_file, json!({ "keys": keys }).to_string()).unwrap();

    const ISSUER: &str = "https://login.example.com";
    let path = jwks_file.display().to_string();
    let stack = Stack::start_with_gateway(options, connect, |c| {
        c.identity_jwks = Some(path);
        c.identity_issuer = ISSUER.into();
        c.identity_audience = "boxoffice".into();
    })
    .await;
    stack
        .create_event_with(
            "acct",
            json!({ "identity": "account", "admission_rate_per_s": 0.001 }),
        )
        .await;

    let claims = |sub: &str, aud: &str, exp_in: i64| json!({ "sub": sub, "iss": ISSUER, "aud": aud, "exp": now_s() as i64 + exp_in });
    let ed = |claims: &Value| {
        let mut header = Header::new(Algorithm::EdDSA);
        header.kid = Some(ed_kid.clone());
        encode(
            &header,
            claims,
            &EncodingKey::from_ed_pem(ed_pem.as_bytes()).unwrap(),
        )
        .unwrap()
    };
    let ec = |claims: &Value| {
        let mut header = Header::new(Algorithm::ES256);
        header.kid = Some("ec-1".into());
        encode(&header, claims, &ec_key).unwrap()
    };
    let join = |token: String| join_with(&stack, "acct", json!({ "identity_token": token }), None);

    let (status, first) = join(ed(&claims("user-42", "boxoffice", 300))).await;
    assert_eq!(status, StatusCode::CREATED, "{first}");
    assert_eq!(first["fan_id"], "user-42");
    // The same account through the other key of the site: the same place.
    let (status, again) = join(ec(&claims("user-42", "boxoffice", 300))).await;
    assert_eq!(status, StatusCode::OK, "{again}");
    assert_eq!(
        (&again["fan_id"], &again["position"]),
        (&first["fan_id"], &first["position"])
    );

    // What an attacker might try instead.
    let other_pem = boxoffice_contract::token::generate_ed25519_pem();
    let forged = {
        let mut header = Header::new(Algorithm::EdDSA);
        header.kid = Some(ed_kid.clone());
        encode(
            &header,
            &claims("user-42", "boxoffice", 300),
            &EncodingKey::from_ed_pem(other_pem.as_bytes()).unwrap(),
        )
        .unwrap()
    };
    let hmac_with_public_key = {
        let x = ed_jwks["keys"][0]["x"].as_str().unwrap();
        let mut header = Header::new(Algorithm::HS256);
        header.kid = Some(ed_kid.clone());
        encode(
            &header,
            &claims("user-42", "boxoffice", 300),
            &EncodingKey::from_secret(x.as_bytes()),
        )
        .unwrap()
    };
    for (what, token) in [
        ("signed by another key", forged),
        (
            "for another audience",
            ed(&claims("user-42", "another-site", 300)),
        ),
        ("expired", ed(&claims("user-42", "boxoffice", -600))),
        ("not valid before an hour from now", {
            let mut early = claims("user-42", "boxoffice", 7200);
            early["nbf"] = json!(now_s() as i64 + 3600);
            ed(&early)
        }),
        ("HS256 with the public key as secret", hmac_with_public_key),
        ("not a JWT", "user-42".into()),
    ] {
        let (status, problem) = join(token).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{what}: {problem}");
        assert_eq!(slug(&problem), "invalid-identity", "{what}");
    }
    let (status, problem) = join_with(&stack, "acct", json!({}), None).await;
    assert_eq!(
        (status, slug(&problem)),
        (StatusCode::UNAUTHORIZED, "identity-required")
    );
    let (status, problem) = join_with(&stack, "acct", json!({ "fan_id": "user-42" }), None).await;
    assert_eq!(
        (status, slug(&problem)),
        (StatusCode::UNPROCESSABLE_ENTITY, "fan-id-not-accepted")
    );
    stack.stop().await;
}
