//! The admin API's capacity planner over HTTP (router in-process).

use axum::body::Body;
use axum::http::{Request, StatusCode};
use serde_json::Value;
use tower::ServiceExt;

async fn app() -> axum::Router {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let redis = redis::aio::ConnectionManager::new(redis::Client::open(url).unwrap()).await.unwrap();
    let config = admission::Config {
        listen: String::new(),
        redis_url: String::new(),
        redis_prefix: format!("t{}", uuid::Uuid::new_v4().simple()),
        admin_token: "admin".into(),
        order_service_url: "http://127.0.0.1:9".into(),
        tick_ms: 100,
        lease_ms: 1_000,
        replica: None,
    };
    admission::api::router(admission::AppState::new(redis, config).unwrap())
}

async fn get(uri: &str, token: Option<&str>) -> (StatusCode, Value) {
    let mut request = Request::get(uri);
    if let Some(token) = token {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    let response = app().await.oneshot(request.body(Body::empty()).unwrap()).await.unwrap();
    let status = response.status();
    let body = axum::body::to_bytes(response.into_body(), 1 << 16).await.unwrap();
    (status, serde_json::from_slice(&body).unwrap())
}

#[tokio::test]
async fn the_planner_applies_littles_law() {
    let (status, plan) = get("/admin/v1/capacity?arrival_rate=200&service_time_ms=50&spike_rate=1000&spike_s=60", Some("admin")).await;
    assert_eq!(status, StatusCode::OK, "{plan}");
    assert_eq!(plan["workers"], 15);
    assert_eq!(plan["busy_workers"], 10.0);
    assert_eq!(plan["spike_backlog"], 42_000.0);
    assert_eq!(plan["drain_s"], 420.0);
}

#[tokio::test]
async fn the_planner_refuses_bad_input_clearly() {
    let (status, body) = get("/admin/v1/capacity?arrival_rate=200&service_time_ms=50&utilization=2", Some("admin")).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(body["detail"].as_str().unwrap().starts_with("utilization"));
    let (status, _) = get("/admin/v1/capacity?service_time_ms=50", Some("admin")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, _) = get("/admin/v1/capacity?arrival_rate=1&service_time_ms=1", None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
}
