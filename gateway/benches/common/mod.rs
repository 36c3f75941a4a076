//! What the edge benchmarks share: the baselines the gateway is measured
//! against.

use axum::extract::State;
use axum::routing::{get, post};
use axum::{Json, Router};
use boxoffice_contract::event::now_ms;
use redis::aio::ConnectionManager;
use redis::AsyncCommands;

#[derive(serde::Deserialize)]
struct Fan {
    fan_id: String,
}

/// The least an edge handler can do for each, at the gateway's paths: one
/// ZRANK of a fan in `queue` for the status poll, or one ZADD to `bare` of
/// the fan named in the body for the join.
pub fn baselines(redis: ConnectionManager, queue: String, bare: String) -> Router {
    Router::new()
        .route(
            "/v1/events/ev/queue/status",
            get(
                |State((mut redis, queue, _)): State<(ConnectionManager, String, String)>| async move {
                    let rank: Option<u64> = redis.zrank(&queue, "filler-25000").await.unwrap_or(None);
                    Json(serde_json::json!({ "position": rank.map(|r| r + 1) }))
                },
            ),
        )
        .route(
            "/v1/events/ev/queue",
            post(
                |State((mut redis, _, bare)): State<(ConnectionManager, String, String)>,
                 Json(fan): Json<Fan>| async move {
                    let added: u64 = redis.zadd(&bare, &fan.fan_id, now_ms()).await.unwrap_or(0);
                    Json(serde_json::json!({ "added": added }))
                },
            ),
        )
        .with_state((redis, queue, bare))
}
