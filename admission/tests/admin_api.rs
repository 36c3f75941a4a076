//! The admin API's capacity planner over HTTP (router in-process).

use axum::body::Body;
use axum::http::{Request, StatusCode};
use serde_json::Value;
use tower::ServiceExt;

async fn redis() -> redis::aio::ConnectionManager {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    redis::aio::ConnectionManager::new(redis::Client::open(url).unwrap())
        .await
        .unwrap()
}

async fn app() -> axum::Router {
    app_with_prefix(&format!("t{}", uuid::Uuid::new_v4().simple())).await
}

async fn app_with_prefix(prefix: &str) -> axum::Router {
    let config = {
        let mut c = admission::Config::defaults("admin");
        c.redis_prefix = prefix.to_owned();
        c.order_service_url = "http://127.0.0.1:9".into();
        c
    };
    admission::api::router(admission::AppState::new(redis().await, config).unwrap())
}

async fn call(app: axum::Router, uri: &str, token: Option<&str>) -> (StatusCode, Vec<u8>) {
    let mut request = Request::get(uri);
    if let Some(token) = token {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    let response = app
        .oneshot(request.body(Body::empty()).unwrap())
        .await
        .unwrap();
    let status = response.status();
    (
        status,
        axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .unwrap()
            .to_vec(),
    )
}

async fn get(uri: &str, token: Option<&str>) -> (StatusCode, Value) {
    let (status, body) = call(app().await, uri, token).await;
    (status, serde_json::from_slice(&body).unwrap())
}

#[tokio::test]
async fn ops_see_live_stats_and_prometheus_metrics() {
    use boxoffice_contract::event::{now_ms, EventConfig, FIFO_BASE};
    use boxoffice_contract::keys::{events_key, EventKeys};
    use redis::AsyncCommands;

    let prefix = format!("t{}", uuid::Uuid::new_v4().simple());
    let event = format!("m-{}", uuid::Uuid::new_v4().simple());
    let keys = EventKeys::new(&prefix, &event);
    let mut redis = redis().await;
    let now = now_ms();
    let config = {
        let mut c = EventConfig::open("Stats", 1_000, 10.0);
        c.access_ttl_s = 600;
        c.max_queue = 1_000;
        c.shuffle_seed = "seed".into();
        c
    };
    let _: () = redis
        .hset_multiple(keys.config(), &config.to_fields())
        .await
        .unwrap();
    let _: () = redis.sadd(events_key(&prefix), &event).await.unwrap();
    let fans: Vec<(u64, String)> = (1..=100)
        .map(|i| (FIFO_BASE + i, format!("fan-{i}")))
        .collect();
    let _: () = redis.zadd_multiple(keys.queue(), &fans).await.unwrap();
    // As join.lua records it: the line reached sequence 1 five seconds ago.
    let _: () = redis
        .zadd(keys.joins(), format!("1:{}", now - 5_000), 1)
        .await
        .unwrap();

    let app = app_with_prefix(&prefix).await;
    boxoffice_contract::telemetry::prometheus();
    let admitter = admission::admitter::Admitter::new(
        redis.clone(),
        &prefix,
        "a",
        std::time::Duration::from_secs(1),
        std::time::Duration::from_millis(100),
    );
    for tick in 0..=30 {
        admitter.tick_all(now + tick * 100).await.unwrap();
    }

    let (status, body) = call(
        app.clone(),
        &format!("/admin/v1/events/{event}"),
        Some("admin"),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let view: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        (
            view["admitted_total"].as_u64(),
            view["queue_length"].as_u64()
        ),
        (Some(30), Some(70))
    );
    assert_eq!(view["admit_rate_1m"], 10.0, "30 fans in 3 s");
    let waited = view["oldest_wait_s"].as_f64().unwrap();
    assert!((5.0..60.0).contains(&waited), "{waited}");

    let (status, body) = call(app, "/metrics", None).await;
    assert_eq!(status, StatusCode::OK);
    let text = String::from_utf8(body).unwrap();
    for line in [
        format!("boxoffice_queue_length{{event=\"{event}\"}} 70"),
        format!("boxoffice_active{{event=\"{event}\"}} 30"),
        format!("boxoffice_admitted_total{{event=\"{event}\"}} 30"),
        format!("boxoffice_admission_rate{{event=\"{event}\"}} 10"),
    ] {
        assert!(text.lines().any(|l| l == line), "missing {line} in\n{text}");
    }
    let keys: Vec<String> = redis.keys(format!("{prefix}:*")).await.unwrap();
    let _: () = redis.del(keys).await.unwrap();
}

#[tokio::test]
async fn the_planner_applies_littles_law() {
    let (status, plan) = get(
        "/admin/v1/capacity?arrival_rate=200&service_time_ms=50&spike_rate=1000&spike_s=60",
        Some("admin"),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{plan}");
    assert_eq!(plan["workers"], 15);
    assert_eq!(plan["busy_workers"], 10.0);
    assert_eq!(plan["spike_backlog"], 42_000.0);
    assert_eq!(plan["drain_s"], 420.0);
}

#[tokio::test]
async fn the_planner_refuses_bad_input_clearly() {
    let (status, body) = get(
        "/admin/v1/capacity?arrival_rate=200&service_time_ms=50&utilization=2",
        Some("admin"),
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(body["detail"].as_str().unwrap().starts_with("utilization"));
    let (status, _) = get("/admin/v1/capacity?service_time_ms=50", Some("admin")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, _) = get("/admin/v1/capacity?arrival_rate=1&service_time_ms=1", None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn the_dashboard_history_holds_each_events_samples_and_refuses_unknown_events() {
    use boxoffice_contract::event::{EventConfig, FIFO_BASE};
    use boxoffice_contract::keys::{events_key, EventKeys};
    use redis::AsyncCommands;

    let prefix = format!("t{}", uuid::Uuid::new_v4().simple());
    let event = "dash";
    let keys = EventKeys::new(&prefix, event);
    let mut redis = redis().await;
    let config = {
        let mut c = EventConfig::open("Dash", 1_000, 25.0);
        c.shuffle_seed = "seed".into();
        c
    };
    let _: () = redis
        .hset_multiple(keys.config(), &config.to_fields())
        .await
        .unwrap();
    let _: () = redis.sadd(events_key(&prefix), event).await.unwrap();
    let fans: Vec<(u64, String)> = (1..=40)
        .map(|i| (FIFO_BASE + i, format!("fan-{i}")))
        .collect();
    let _: () = redis.zadd_multiple(keys.queue(), &fans).await.unwrap();

    let state = {
        let mut c = admission::Config::defaults("admin");
        c.redis_prefix = prefix.clone();
        // No order service: the pipeline figures are missing, the sampler carries on.
        c.order_service_url = "http://127.0.0.1:9".into();
        c.history_samples = 2;
        admission::AppState::new(redis.clone(), c).unwrap()
    };
    for _ in 0..3 {
        assert_eq!(admission::sampler::sample_all(&state).await.unwrap(), 1);
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let app = admission::api::router(state);

    let (status, body) = call(
        app.clone(),
        "/admin/v1/events/dash/history?since_ms=0",
        Some("admin"),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let history: Value = serde_json::from_slice(&body).unwrap();
    let samples = history["samples"].as_array().unwrap();
    assert_eq!(samples.len(), 2, "the window keeps the newest two");
    assert_eq!(samples[1]["queue_length"], 40);
    assert_eq!(samples[1]["rate_set"], 25.0);
    assert_eq!(samples[1]["outbox_backlog"], Value::Null);
    let first = samples[0]["t_ms"].as_i64().unwrap();
    let (_, body) = call(
        app.clone(),
        &format!("/admin/v1/events/dash/history?since_ms={first}"),
        Some("admin"),
    )
    .await;
    let later: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(later["samples"].as_array().unwrap().len(), 1);

    let (status, body) = call(app.clone(), "/admin/v1/events", Some("admin")).await;
    assert_eq!(status, StatusCode::OK);
    let events: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(events[0]["event_id"], "dash");
    assert_eq!(events[0]["name"], "Dash");

    for (uri, token, expected) in [
        (
            "/admin/v1/events/nope/history",
            Some("admin"),
            StatusCode::NOT_FOUND,
        ),
        (
            "/admin/v1/events/dash/history?since_ms=soon",
            Some("admin"),
            StatusCode::BAD_REQUEST,
        ),
        (
            "/admin/v1/events/dash/history",
            None,
            StatusCode::UNAUTHORIZED,
        ),
        ("/admin/v1/events", Some("wrong"), StatusCode::UNAUTHORIZED),
    ] {
        let (status, body) = call(app.clone(), uri, token).await;
        assert_eq!(status, expected, "{uri}");
        let problem: Value = serde_json::from_slice(&body).unwrap();
        assert!(
            problem["type"].as_str().unwrap().contains("/problems/"),
            "{uri}"
        );
    }
}
