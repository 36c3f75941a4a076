//! What the edge benchmarks share: the event, the gateway's settings, and
//! the baselines the gateway is measured against.

use axum::extract::State;
use axum::routing::{get, post};
use axum::{Json, Router};
use boxoffice_contract::event::{now_ms, EventConfig, Identity};
use boxoffice_contract::keys::{events_key, EventKeys};
use boxoffice_contract::token::{generate_ed25519_pem, KeySet};
use redis::aio::ConnectionManager;
use redis::AsyncCommands;

const SECRET: &[u8] = b"bench-queue-secret-of-32-bytes-at-least!";

/// The benchmarks' event: open, 60,000 seats, `max_queue` places in line.
pub fn event(max_queue: u64) -> EventConfig {
    let mut c = EventConfig::open("Bench", 60_000, 500.0);
    c.opens_at_ms = now_ms() - 1_000;
    c.max_queue = max_queue;
    c.shuffle_seed = "bench".into();
    // Each request names its fan in the body, as a load test does.
    c.identity = Identity::Declared;
    c
}

/// A connection to the local Redis (`REDIS_URL`), its URL, a fresh key
/// prefix, and the event `ev` under it: [`event`] with `max_queue`, 60,000
/// seats remaining in the stock view, listed among the prefix's events.
pub async fn open_event(max_queue: u64) -> (ConnectionManager, String, String, EventKeys) {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let mut redis = ConnectionManager::new(redis::Client::open(url.clone()).unwrap())
        .await
        .unwrap();
    let prefix = format!("bench{}", uuid::Uuid::new_v4().simple());
    let keys = EventKeys::new(&prefix, "ev");
    let _: () = redis
        .hset_multiple(keys.config(), &event(max_queue).to_fields())
        .await
        .unwrap();
    let _: () = redis
        .hset_multiple(keys.stock(), &[("remaining", 60_000), ("version", 1)])
        .await
        .unwrap();
    let _: () = redis.sadd(events_key(&prefix), "ev").await.unwrap();
    (redis, url, prefix, keys)
}

/// Fresh signing keys and the queue secret.
pub fn keyset() -> KeySet {
    KeySet::from_pems("boxoffice", &generate_ed25519_pem(), &[], SECRET).unwrap()
}

/// The gateway with its default limits, behind a trusted proxy on
/// 127.0.0.1 that names each request's client.
pub fn gateway_config(redis_url: String, prefix: &str) -> gateway::Config {
    let mut c = gateway::Config::defaults();
    c.redis_url = redis_url;
    c.redis_prefix = prefix.to_owned();
    c.order_service_url = "http://127.0.0.1:9".into();
    c.queue_ticket_ttl_s = 3600;
    c.trusted_proxies = vec!["127.0.0.1/32".parse().unwrap()];
    c
}

/// Deletes every key under `prefix`.
pub async fn cleanup(redis: &mut ConnectionManager, prefix: &str) {
    let keys: Vec<String> = redis.keys(format!("{prefix}:*")).await.unwrap();
    for chunk in keys.chunks(1000) {
        let _: () = redis.del(chunk).await.unwrap();
    }
}

#[derive(serde::Deserialize)]
struct Fan {
    fan_id: String,
}

/// CPU the status baseline burns on each request before its ZRANK:
/// `BENCH_BASELINE_SPIN_NS` (default 0, none). Set to the gateway's extra
/// server CPU per poll (the edge benchmark's CPU table), it gives a baseline
/// as costly as the gateway, so the fixed-rate tails compare at equal CPU:
/// what is left of the gap is not the extra work's queueing.
fn baseline_spin() -> std::time::Duration {
    static SPIN: std::sync::OnceLock<std::time::Duration> = std::sync::OnceLock::new();
    *SPIN.get_or_init(|| {
        std::time::Duration::from_nanos(
            std::env::var("BENCH_BASELINE_SPIN_NS")
                .ok()
                .and_then(|ns| ns.parse().ok())
                .unwrap_or(0),
        )
    })
}

/// The least an edge handler can do for each, at the gateway's paths: one
/// ZRANK of a fan in `queue` (`filler-0`, whom both benches put in line) for
/// the status poll (after [`baseline_spin`]), or one ZADD to `bare` of the
/// fan named in the body for the join.
pub fn baselines(redis: ConnectionManager, queue: String, bare: String) -> Router {
    let spin = baseline_spin();
    Router::new()
        .route(
            "/v1/events/ev/queue/status",
            get(
                move |State((mut redis, queue, _)): State<(ConnectionManager, String, String)>| async move {
                    if !spin.is_zero() {
                        let started = std::time::Instant::now();
                        while started.elapsed() < spin {
                            std::hint::spin_loop();
                        }
                    }
                    let rank: Option<u64> = redis.zrank(&queue, "filler-0").await.unwrap_or(None);
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

/// The same one round trip as the gateway's join, and nothing else: the
/// join script (one EVALSHA) for the fan named in the body, one fan a call,
/// as the gateway calls it when no other join is with Redis, on an event of
/// its own under `prefix`. Against it, the join's ratio is the gateway's own
/// cost around the Redis work the join must do; against [`baselines`]' ZADD,
/// it is that cost and the script's.
pub fn script_baseline(redis: ConnectionManager, prefix: &str) -> Router {
    let keys = EventKeys::new(prefix, "script-baseline");
    let script = std::sync::Arc::new(redis::Script::new(include_str!("../../src/join.lua")));
    Router::new()
        .route(
            "/v1/events/ev/queue",
            post(
                |State((mut redis, keys, script)): State<(
                    ConnectionManager,
                    EventKeys,
                    std::sync::Arc<redis::Script>,
                )>,
                 Json(fan): Json<Fan>| async move {
                    let reply: String = script
                        .key(keys.queue())
                        .key(keys.seq())
                        .key(keys.active())
                        .key(keys.joins())
                        .arg(now_ms())
                        .arg(100_000_000u64)
                        .arg("0")
                        .arg("0")
                        .arg(&fan.fan_id)
                        .invoke_async(&mut redis)
                        .await
                        .unwrap_or_default();
                    Json(serde_json::json!({ "reply": reply }))
                },
            ),
        )
        .with_state((redis, keys, script))
}
