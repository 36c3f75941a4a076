//! The purchase saga against a real Postgres and the fake payment provider
//! over real HTTP: no overselling under contention, and no double charge,
//! lost charge or stuck seat under provider faults.

mod common;

use std::time::Duration;

use common::*;
use futures::future::join_all;
use order_service::payments::provider::Knobs;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

fn prefix() -> String {
    format!("t{}", uuid::Uuid::new_v4().simple())
}

#[sqlx::test(migrator = "order_service::MIGRATOR")]
async fn three_hundred_purchases_for_a_hundred_seats_sell_exactly_a_hundred(pool: PgPool) {
    let cancel = CancellationToken::new();
    let (provider, provider_url) = start_provider(Knobs::default(), &cancel).await;
    let service = OrderService::start(pool.clone(), config(&prefix(), &provider_url)).await;
    create_event(&service.http, &service.url, "ev", 100).await;

    let purchases = (0..300).map(|fan| {
        let (http, url) = (service.http.clone(), service.url.clone());
        async move { place(&http, &url, "ev", &format!("fan-{fan}"), 1).await.0 }
    });
    let statuses = join_all(purchases).await;
    let accepted = statuses.iter().filter(|s| **s == 202).count();
    // Refused: sold out, or (while the last holds are paying) seats held.
    let refused = statuses.iter().filter(|s| **s == 410 || **s == 409).count();
    assert_eq!((accepted, refused), (100, 200), "{statuses:?}");

    wait_settled(&pool, Duration::from_secs(60)).await;
    let confirmed = check_orders(&pool, "ev", 100).await;
    assert_eq!(confirmed.len(), 100);
    check_books(&provider, &confirmed);
    // The same invariant, as SQL sees it.
    let within: bool = sqlx::query_scalar(
        "SELECT sold = capacity AND reserved + sold <= capacity FROM inventory WHERE event_id = 'ev'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(within);

    // Metrics: the outbox holds one row per confirmed order (no relay here).
    let text = service
        .http
        .get(format!("{}/metrics", service.url))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let value = |name: &str| -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {name} in\n{text}"))
    };
    assert_eq!(value("boxoffice_outbox_backlog"), 100.0);
    assert!(value("boxoffice_outbox_oldest_age_seconds") >= 0.0);
    assert!(value("boxoffice_orders_total{status=\"confirmed\"}") >= 100.0);
    assert!(value("boxoffice_orders_total{status=\"reserved\"}") >= 100.0);

    service.stop().await;
    cancel.cancel();
}

#[sqlx::test(migrator = "order_service::MIGRATOR")]
async fn provider_errors_and_lost_answers_never_charge_twice_nor_strand_a_seat(pool: PgPool) {
    let cancel = CancellationToken::new();
    let knobs = Knobs {
        error_rate: 0.3,
        lost_rate: 0.1,
        decline_rate: 0.05,
        hang_ms: 600,
        ..Knobs::default()
    };
    let (provider, provider_url) = start_provider(knobs, &cancel).await;
    let mut config = config(&prefix(), &provider_url);
    config.payment.payment_retries = 2;
    // Short holds, so some orders reach the sweep while their charge is unsettled.
    config.reservation_ttl_s = 2;
    // The breaker is tested on its own; here every call should reach the provider.
    config.payment.payment_breaker_failure_rate = 1.0;
    let service = OrderService::start(pool.clone(), config).await;
    create_event(&service.http, &service.url, "ev", 100).await;

    let purchases = (0..120).map(|fan| {
        let (http, url) = (service.http.clone(), service.url.clone());
        async move { place(&http, &url, "ev", &format!("fan-{fan}"), 1).await.0 }
    });
    let statuses = join_all(purchases).await;
    assert_eq!(statuses.iter().filter(|s| **s == 202).count(), 100);

    wait_settled(&pool, Duration::from_secs(120)).await;
    let confirmed = check_orders(&pool, "ev", 100).await;
    check_books(&provider, &confirmed);
    let stats = provider.stats();
    assert!(
        stats.errors > 0 && stats.lost > 0,
        "the faults must have happened: {stats:?}"
    );
    let failed: Vec<(String,)> =
        sqlx::query_as("SELECT failure_reason FROM orders WHERE status = 'failed'")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert!(
        failed.iter().all(
            |(r,)| ["payment-declined", "hold-expired", "payment-cancelled"].contains(&r.as_str())
        ),
        "{failed:?}"
    );
    assert!(!confirmed.is_empty());
    println!(
        "confirmed {}, failed {}, provider {stats:?}",
        confirmed.len(),
        failed.len()
    );

    service.stop().await;
    cancel.cancel();
}

#[sqlx::test(migrator = "order_service::MIGRATOR")]
async fn a_capture_for_an_order_that_failed_meanwhile_is_refunded(pool: PgPool) {
    let cancel = CancellationToken::new();
    let (provider, provider_url) = start_provider(Knobs::default(), &cancel).await;
    let mut config = config(&prefix(), &provider_url);
    config.saga_runners = 0;
    let service = OrderService::start(pool.clone(), config.clone()).await;
    create_event(&service.http, &service.url, "ev", 10).await;
    let (status, order_id) = place(&service.http, &service.url, "ev", "fan", 2).await;
    assert_eq!(status, 202);

    refunding(&pool, &provider_url, order_id).await;
    service.stop().await;

    // A saga runner gives the money back.
    config.saga_runners = 1;
    let service = OrderService::start(pool.clone(), config).await;
    wait_settled(&pool, Duration::from_secs(20)).await;
    let payment: String = sqlx::query_scalar("SELECT status FROM payments WHERE order_id = $1")
        .bind(order_id)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(payment, "refunded");
    check_books(&provider, &[]);
    check_orders(&pool, "ev", 10).await;

    service.stop().await;
    cancel.cancel();
}

/// Makes a held order fail (its hold swept) while a charge under its key is
/// captured anyway (a provider without void, a racing runner): the capture
/// waits as `refunding`.
async fn refunding(pool: &PgPool, provider_url: &str, order_id: uuid::Uuid) {
    order_service::store::fail_and_release(pool, order_id, "hold-expired")
        .await
        .unwrap()
        .expect("the order was held");
    let captured = reqwest::Client::new()
        .post(format!("{provider_url}/v1/charges"))
        .json(
            &serde_json::json!({ "idempotency_key": order_id.to_string(), "amount_cents": 9_000 }),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(captured.status(), 201);
    let charged = order_service::store::mark_charged(pool, order_id, 9_000)
        .await
        .unwrap();
    assert!(!charged, "a failed order must not become charged");
}

async fn set_knobs(provider_url: &str, knobs: serde_json::Value) {
    let response = reqwest::Client::new()
        .put(format!("{provider_url}/v1/knobs"))
        .json(&knobs)
        .send()
        .await
        .unwrap();
    assert!(response.status().is_success());
}

async fn refund_row(pool: &PgPool, order_id: uuid::Uuid) -> (String, i32, bool) {
    sqlx::query_as(
        "SELECT status, refund_attempts, next_refund_at > now() FROM payments WHERE order_id = $1",
    )
    .bind(order_id)
    .fetch_one(pool)
    .await
    .unwrap()
}

#[sqlx::test(migrator = "order_service::MIGRATOR")]
async fn a_refund_holds_no_lock_across_the_provider_call_and_backs_off_when_refused(pool: PgPool) {
    let cancel = CancellationToken::new();
    let (_provider, provider_url) = start_provider(Knobs::default(), &cancel).await;
    let mut config = config(&prefix(), &provider_url);
    config.saga_runners = 0;
    config.payment.payment_attempt_timeout_ms = 5_000;
    config.payment.payment_retries = 0;
    let service = OrderService::start(pool.clone(), config.clone()).await;
    create_event(&service.http, &service.url, "ev", 10).await;
    let (status, order_id) = place(&service.http, &service.url, "ev", "fan", 1).await;
    assert_eq!(status, 202);
    refunding(&pool, &provider_url, order_id).await;
    let redis = redis::aio::ConnectionManager::new(redis::Client::open(redis_url()).unwrap())
        .await
        .unwrap();
    let state = order_service::AppState::new(pool.clone(), redis, config).unwrap();

    // The provider refuses: the refund is tried once, then waits its backoff.
    set_knobs(&provider_url, serde_json::json!({ "error_rate": 1.0 })).await;
    assert!(order_service::saga::advance_one(&state, true)
        .await
        .unwrap());
    assert_eq!(
        refund_row(&pool, order_id).await,
        ("refunding".into(), 1, true)
    );
    assert!(
        !order_service::saga::advance_one(&state, true)
            .await
            .unwrap(),
        "nothing else is due"
    );
    assert_eq!(
        refund_row(&pool, order_id).await.1,
        1,
        "retried before its backoff"
    );

    // Its backoff over, a slow provider: while the call is in flight the
    // payment row is not locked, and the refund is leased.
    set_knobs(&provider_url, serde_json::json!({ "latency_ms": 1_500 })).await;
    sqlx::query("UPDATE payments SET next_refund_at = now() WHERE order_id = $1")
        .bind(order_id)
        .execute(&pool)
        .await
        .unwrap();
    let refund = tokio::spawn({
        let state = state.clone();
        async move { order_service::saga::advance_one(&state, true).await }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut tx = pool.begin().await.unwrap();
    let locked = sqlx::query("SELECT 1 FROM payments WHERE order_id = $1 FOR UPDATE NOWAIT")
        .bind(order_id)
        .execute(&mut *tx)
        .await;
    assert!(
        locked.is_ok(),
        "the payment row is locked across the call: {locked:?}"
    );
    tx.rollback().await.unwrap();
    assert_eq!(
        refund_row(&pool, order_id).await,
        ("refunding".into(), 2, true)
    );
    assert!(refund.await.unwrap().unwrap());
    assert_eq!(refund_row(&pool, order_id).await.0, "refunded");

    service.stop().await;
    cancel.cancel();
}

#[sqlx::test(migrator = "order_service::MIGRATOR")]
async fn a_refund_is_not_starved_by_a_stream_of_due_orders(pool: PgPool) {
    let cancel = CancellationToken::new();
    // Each call takes 250 ms: one runner needs ten seconds for the orders.
    let knobs = Knobs {
        latency_ms: 250,
        ..Knobs::default()
    };
    let (_provider, provider_url) = start_provider(knobs, &cancel).await;
    let mut config = config(&prefix(), &provider_url);
    config.saga_runners = 0;
    config.payment.payment_attempt_timeout_ms = 5_000;
    let service = OrderService::start(pool.clone(), config.clone()).await;
    create_event(&service.http, &service.url, "ev", 100).await;
    let (_, refund) = place(&service.http, &service.url, "ev", "refunded-fan", 1).await;
    refunding(&pool, &provider_url, refund).await;
    for fan in 0..40 {
        let (status, _) = place(&service.http, &service.url, "ev", &format!("fan-{fan}"), 1).await;
        assert_eq!(status, 202);
    }
    service.stop().await;

    config.saga_runners = 1;
    let service = OrderService::start(pool.clone(), config).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let unfinished_when_refunded = loop {
        let (refunded, unfinished): (bool, i64) = sqlx::query_as(
            "SELECT (SELECT status = 'refunded' FROM payments WHERE order_id = $1),
                    (SELECT count(*) FROM orders WHERE status IN ('reserved', 'charged'))",
        )
        .bind(refund)
        .fetch_one(&pool)
        .await
        .unwrap();
        if refunded {
            break unfinished;
        }
        assert!(tokio::time::Instant::now() < deadline, "never refunded");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(
        unfinished_when_refunded >= 30,
        "the refund waited for the orders: {unfinished_when_refunded} of 40 unfinished when it was done"
    );
    wait_settled(&pool, Duration::from_secs(60)).await;

    service.stop().await;
    cancel.cancel();
}

#[sqlx::test(migrator = "order_service::MIGRATOR")]
async fn the_order_shows_its_intermediate_state(pool: PgPool) {
    let cancel = CancellationToken::new();
    // A slow provider keeps the order in `reserved` long enough to read it.
    let knobs = Knobs {
        latency_ms: 1_500,
        ..Knobs::default()
    };
    let (_provider, provider_url) = start_provider(knobs, &cancel).await;
    let mut config = config(&prefix(), &provider_url);
    config.payment.payment_attempt_timeout_ms = 5_000;
    let service = OrderService::start(pool.clone(), config).await;
    create_event(&service.http, &service.url, "ev", 10).await;
    let (status, order_id) = place(&service.http, &service.url, "ev", "fan", 1).await;
    assert_eq!(status, 202);
    let view = service.order(order_id).await;
    assert_eq!(view["status"], "reserved");
    assert_eq!(view["status_detail"], "seats held — processing payment");
    wait_settled(&pool, Duration::from_secs(30)).await;
    let view = service.order(order_id).await;
    assert_eq!(view["status"], "confirmed");

    service.stop().await;
    cancel.cancel();
}

#[sqlx::test(migrator = "order_service::MIGRATOR")]
async fn an_expired_hold_is_released_only_once_the_provider_confirms_nothing_was_taken(
    pool: PgPool,
) {
    let cancel = CancellationToken::new();
    let down = Knobs {
        error_rate: 1.0,
        ..Knobs::default()
    };
    let (provider, provider_url) = start_provider(down, &cancel).await;
    let mut config = config(&prefix(), &provider_url);
    config.reservation_ttl_s = 1;
    config.payment.payment_retries = 0;
    config.payment.payment_breaker_failure_rate = 1.0;
    let service = OrderService::start(pool.clone(), config).await;
    create_event(&service.http, &service.url, "ev", 10).await;
    let (status, order_id) = place(&service.http, &service.url, "ev", "fan", 3).await;
    assert_eq!(status, 202);

    // The provider is down past the hold: the seats stay held, nothing is decided.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let view = service.order(order_id).await;
    assert_eq!(view["status"], "reserved", "{view}");
    let held: i32 = sqlx::query_scalar("SELECT reserved FROM inventory WHERE event_id = 'ev'")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(held, 3);

    // It comes back: the sweep voids the key, then releases the seats.
    let response = reqwest::Client::new()
        .put(format!("{provider_url}/v1/knobs"))
        .json(&Knobs::default())
        .send()
        .await
        .unwrap();
    assert!(response.status().is_success());
    wait_settled(&pool, Duration::from_secs(40)).await;
    let view = service.order(order_id).await;
    assert_eq!(
        (view["status"].as_str(), view["failure_reason"].as_str()),
        (Some("failed"), Some("hold-expired")),
        "{view}"
    );
    let records = provider.records();
    assert_eq!(records.len(), 1);
    assert_eq!(
        records[0].charge.status,
        order_service::payments::ChargeStatus::Voided
    );
    check_orders(&pool, "ev", 10).await;

    service.stop().await;
    cancel.cancel();
}

/// Index and sequential scans of `orders` so far, as the statistics say.
async fn orders_scans(pool: &PgPool) -> i64 {
    sqlx::query_scalar(
        "SELECT coalesce(seq_scan, 0) + coalesce(idx_scan, 0) FROM pg_stat_user_tables
         WHERE relname = 'orders'",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

/// Idle runners do not poll the orders every 200 ms: they wait ever longer,
/// up to `saga::IDLE_MAX`. Yet work that comes due by the clock while they
/// wait, with nothing to wake them (a charged order due a second from now,
/// written straight to the table), is taken up at most `IDLE_MAX` late.
#[sqlx::test(migrator = "order_service::MIGRATOR")]
async fn idle_runners_look_rarely_yet_take_up_due_work_in_time(pool: PgPool) {
    let cancel = CancellationToken::new();
    let (_provider, provider_url) = start_provider(Knobs::default(), &cancel).await;
    let config = config(&prefix(), &provider_url);
    let runners = config.saga_runners as i64;
    let service = OrderService::start(pool.clone(), config).await;
    create_event(&service.http, &service.url, "ev", 10).await;

    // Settled into their longest wait, runners look once per IDLE_MAX. The
    // statistics reach the table after each backend's flush (at most once a
    // second), so the window is long and the bound loose: polling every
    // 200 ms, 8 runners scanned it about 480 times in these 4 s; now about 40.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let before = orders_scans(&pool).await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let scans = orders_scans(&pool).await - before;
    eprintln!("{scans} scans of the orders in 4 s idle by {runners} runners");
    let looks = runners * (4 / order_service::saga::IDLE_MAX.as_secs() as i64 + 1);
    assert!(
        scans <= 2 * looks,
        "{scans} scans of the orders in 4 s idle by {runners} runners (at most {} expected)",
        2 * looks
    );

    // A charged order, due in a second, that no wakeup announces.
    let order_id = uuid::Uuid::now_v7();
    sqlx::query("UPDATE inventory SET reserved = reserved + 1 WHERE event_id = 'ev'")
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO orders (order_id, event_id, fan_id, quantity, amount_cents, status, next_attempt_at)
         VALUES ($1, 'ev', 'fan', 1, 4500, 'charged', now() + interval '1 second')",
    )
    .bind(order_id)
    .execute(&pool)
    .await
    .unwrap();
    let written = tokio::time::Instant::now();
    let bound = Duration::from_secs(1) + order_service::saga::IDLE_MAX + Duration::from_millis(500);
    loop {
        let status: String = sqlx::query_scalar("SELECT status FROM orders WHERE order_id = $1")
            .bind(order_id)
            .fetch_one(&pool)
            .await
            .unwrap();
        if status == "confirmed" {
            break;
        }
        assert!(
            written.elapsed() < bound,
            "a due order still {status} {:?} after it was written (due after 1 s)",
            written.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        written.elapsed() >= Duration::from_millis(900),
        "taken up before it was due"
    );

    service.stop().await;
    cancel.cancel();
}
