//! Edge benchmark: join and status against a bare axum handler doing one Redis
//! round trip, measured in the same run with wrk; and Redis memory per queued
//! fan at one million fans against a bare sorted set of the same ids.
//!
//! `cargo bench -p gateway --bench edge` (needs `wrk` and the local Redis).
//! Knobs: BENCH_SECONDS (default 8), BENCH_CONNECTIONS (64), BENCH_FANS (1000000).

use std::process::Command;
use std::time::Duration;

use axum::extract::State;
use axum::routing::get;
use axum::Router;
use boxoffice_contract::event::{now_ms, EventConfig, Identity};
use boxoffice_contract::keys::{events_key, EventKeys};
use boxoffice_contract::token::{generate_ed25519_pem, KeySet};
use redis::aio::ConnectionManager;
use redis::AsyncCommands;

/// glibc's malloc serialises the hot paths' many small allocations on its
/// arena locks (a fifth of the status poll's CPU); mimalloc does not.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const SECRET: &[u8] = b"bench-queue-secret-of-32-bytes-at-least!";

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

struct Run {
    requests_per_s: f64,
    p99_ms: f64,
}

/// Runs wrk and reads its requests/s and 99th percentile latency.
fn wrk(url: &str, script: Option<&str>, header: Option<&str>) -> Run {
    let seconds: u64 = env_or("BENCH_SECONDS", 8);
    let connections: u64 = env_or("BENCH_CONNECTIONS", 64);
    let mut command = Command::new("wrk");
    command.args([
        "-t1",
        &format!("-c{connections}"),
        &format!("-d{seconds}s"),
        "--latency",
    ]);
    if let Some(script) = script {
        command.args(["-s", script]);
    }
    if let Some(header) = header {
        command.args(["-H", header]);
    }
    let output = command
        .arg(url)
        .output()
        .expect("running wrk (apt-get install wrk)");
    let text = String::from_utf8_lossy(&output.stdout);
    let field = |prefix: &str| -> &str {
        text.lines()
            .find_map(|l| l.trim().strip_prefix(prefix))
            .unwrap_or_else(|| panic!("no '{prefix}' in wrk output:\n{text}"))
            .trim()
    };
    let requests_per_s = field("Requests/sec:").parse().unwrap();
    let p99 = field("99%");
    let p99_ms = if let Some(v) = p99.strip_suffix("us") {
        v.parse::<f64>().unwrap() / 1000.0
    } else if let Some(v) = p99.strip_suffix("ms") {
        v.parse().unwrap()
    } else {
        p99.trim_end_matches('s').parse::<f64>().unwrap() * 1000.0
    };
    if text.contains("Non-2xx") {
        eprintln!("warning: wrk saw non-2xx answers for {url}:\n{text}");
    }
    Run {
        requests_per_s,
        p99_ms,
    }
}

async fn serve(app: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    url
}

fn config(max_queue: u64) -> EventConfig {
    {
        let mut c = EventConfig::open("Bench", 60_000, 500.0);
        c.opens_at_ms = now_ms() - 1_000;
        c.max_queue = max_queue;
        c.shuffle_seed = "bench".into();
        // wrk names each fan in the body, as a load test does.
        c.identity = Identity::Declared;
        c
    }
}

async fn cleanup(redis: &mut ConnectionManager, prefix: &str) {
    let keys: Vec<String> = redis.keys(format!("{prefix}:*")).await.unwrap();
    for chunk in keys.chunks(1000) {
        let _: () = redis.del(chunk).await.unwrap();
    }
}

#[tokio::main]
async fn main() {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let mut redis = ConnectionManager::new(redis::Client::open(url.clone()).unwrap())
        .await
        .unwrap();
    let prefix = format!("bench{}", uuid::Uuid::new_v4().simple());
    let keys = EventKeys::new(&prefix, "ev");
    let _: () = redis
        .hset_multiple(keys.config(), &config(100_000_000).to_fields())
        .await
        .unwrap();
    let _: () = redis
        .hset_multiple(keys.stock(), &[("remaining", 60_000), ("version", 1)])
        .await
        .unwrap();
    let _: () = redis.sadd(events_key(&prefix), "ev").await.unwrap();

    // Baseline: the least an edge handler can do, one Redis round trip.
    let baseline_key = format!("{prefix}:baseline");
    let _: () = redis.set(&baseline_key, "1").await.unwrap();
    let baseline = Router::new()
        .route(
            "/",
            get(
                |State((mut redis, key)): State<(ConnectionManager, String)>| async move {
                    let value: Option<String> = redis.get(&key).await.unwrap_or(None);
                    value.unwrap_or_default()
                },
            ),
        )
        .with_state((redis.clone(), baseline_key));
    let baseline_url = serve(baseline).await;

    let gateway_config = {
        let mut c = gateway::Config::defaults();
        c.redis_url = url;
        c.redis_prefix = prefix.clone();
        c.order_service_url = "http://127.0.0.1:9".into();
        c.queue_ticket_ttl_s = 3600;
        c.order_token_ttl_s = 3600;
        c.upstream_timeout_ms = 1000;
        c.per_ip_rate = 1_000_000;
        c.per_ip_burst = 1_000_000;
        c.per_client_in_flight = 1_000_000;
        c.per_fan_rate = 1_000_000;
        c.per_fan_burst = 1_000_000;
        c
    };
    let keyset = KeySet::from_pems("boxoffice", &generate_ed25519_pem(), &[], SECRET).unwrap();
    // The production stack, protective layers included.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let gateway_url = format!("http://{}", listener.local_addr().unwrap());
    let state = gateway::AppState::new(redis.clone(), keyset, gateway_config).unwrap();
    tokio::spawn(gateway::serve(listener, state, std::future::pending()));

    // A fan far back in the line for the status poll.
    let filler: Vec<(u64, String)> = (0..10_000).map(|i| (i, format!("filler-{i}"))).collect();
    let _: () = redis.zadd_multiple(keys.queue(), &filler).await.unwrap();
    let joined: serde_json::Value = reqwest::Client::new()
        .post(format!("{gateway_url}/v1/events/ev/queue"))
        .json(&serde_json::json!({ "fan_id": "bench-poller" }))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let ticket = joined["queue_ticket"].as_str().unwrap().to_owned();

    let script = std::env::temp_dir().join(format!("{prefix}-join.lua"));
    std::fs::write(
        &script,
        r#"wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local n = 0
request = function()
  n = n + 1
  return wrk.format(nil, nil, nil, '{"fan_id":"wrk-' .. math.random(1, 1000000000) .. '-' .. n .. '"}')
end
"#,
    )
    .unwrap();

    tokio::time::sleep(Duration::from_millis(200)).await;
    let (base, join, status) = tokio::task::spawn_blocking({
        let script = script.to_string_lossy().into_owned();
        let (gateway_url, ticket) = (gateway_url.clone(), ticket.clone());
        move || {
            let base = wrk(&format!("{baseline_url}/"), None, None);
            let join = wrk(
                &format!("{gateway_url}/v1/events/ev/queue"),
                Some(&script),
                None,
            );
            let status = wrk(
                &format!("{gateway_url}/v1/events/ev/queue/status"),
                None,
                Some(&format!("Authorization: Bearer {ticket}")),
            );
            (base, join, status)
        }
    })
    .await
    .unwrap();
    let _ = std::fs::remove_file(&script);

    // The same status poll with span export on, to a collector that takes
    // and drops every batch (the cost is the gateway's, not a collector's).
    let sink = serve(Router::new().route(
        "/v1/traces",
        axum::routing::post(|_: axum::body::Bytes| async { "" }),
    ))
    .await;
    boxoffice_contract::otlp::install(gateway::SERVICE, Some(&format!("{sink}/v1/traces")))
        .unwrap();
    let traced = tokio::task::spawn_blocking({
        move || {
            wrk(
                &format!("{gateway_url}/v1/events/ev/queue/status"),
                None,
                Some(&format!("Authorization: Bearer {ticket}")),
            )
        }
    })
    .await
    .unwrap();

    println!("\nedge throughput (wrk -t1, same run, same machine)");
    println!(
        "{:<42} {:>12} {:>10} {:>16}",
        "endpoint", "req/s", "p99 ms", "vs baseline"
    );
    for (name, run) in [
        ("baseline: axum + one Redis GET", &base),
        ("POST /v1/events/{id}/queue (new fan)", &join),
        ("GET  /v1/events/{id}/queue/status", &status),
        ("GET  …/queue/status, OTLP export on", &traced),
    ] {
        println!(
            "{name:<42} {:>12.0} {:>10.2} {:>15.0}%",
            run.requests_per_s,
            run.p99_ms,
            100.0 * run.requests_per_s / base.requests_per_s
        );
    }
    println!(
        "OTLP span export on costs the status poll {:.0}% of its throughput",
        100.0 * (1.0 - traced.requests_per_s / status.requests_per_s)
    );
    cleanup(&mut redis, &prefix).await;

    memory(&mut redis).await;
}

/// One million fans queued through the real join script, against a bare ZADD of the same ids.
async fn memory(redis: &mut ConnectionManager) {
    let fans: u64 = env_or("BENCH_FANS", 1_000_000);
    let prefix = format!("bench{}", uuid::Uuid::new_v4().simple());
    let keys = EventKeys::new(&prefix, "mem");
    let _: () = redis
        .hset_multiple(keys.config(), &config(fans + 1).to_fields())
        .await
        .unwrap();
    let join = redis::Script::new(include_str!("../src/join.lua"));
    let cache = gateway::cache::EventCache::new(Duration::from_millis(100));
    let bare = format!("{prefix}:bare");
    let now = now_ms();
    for start in (0..fans).step_by(10_000) {
        let mut pipe = redis::pipe();
        for i in start..(start + 10_000).min(fans) {
            let fan = format!("fan-{i:07}");
            pipe.zadd(&bare, &fan, i).ignore();
            // As the gateway calls it: a fan every millisecond, one join sample a second.
            let at = now + i as i64;
            pipe.invoke_script(
                join.key(keys.queue())
                    .key(keys.seq())
                    .key(keys.active())
                    .key(keys.joins())
                    .arg(&fan)
                    .arg(at)
                    .arg(fans + 1)
                    .arg("")
                    .arg(if cache.take_sample("mem", at) {
                        "1"
                    } else {
                        "0"
                    }),
            )
            .ignore();
        }
        // Load the script once so the pipeline's EVALSHA finds it.
        if start == 0 {
            join.prepare_invoke().load_async(redis).await.unwrap();
        }
        let _: () = pipe.query_async(redis).await.unwrap();
    }
    let queued: u64 = redis.zcard(keys.queue()).await.unwrap();
    assert_eq!(queued, fans);
    let conn = redis.clone();
    let usage = |key: String| {
        let mut redis = conn.clone();
        async move {
            let bytes: Option<u64> = redis::cmd("MEMORY")
                .arg("USAGE")
                .arg(key)
                .arg("SAMPLES")
                .arg(0)
                .query_async(&mut redis)
                .await
                .unwrap();
            bytes.unwrap_or(0)
        }
    };
    let ours = usage(keys.queue()).await + usage(keys.joins()).await + usage(keys.seq()).await;
    let base = usage(bare.clone()).await;
    println!("\nRedis memory for {fans} queued fans (MEMORY USAGE … SAMPLES 0)");
    println!(
        "{:<42} {:>12.1} MB {:>10.1} B/fan",
        "bare ZADD of the same ids",
        base as f64 / 1e6,
        base as f64 / fans as f64
    );
    println!(
        "{:<42} {:>12.1} MB {:>10.1} B/fan   {:.3}x bare",
        "BoxOffice queue + join samples + sequence",
        ours as f64 / 1e6,
        ours as f64 / fans as f64,
        ours as f64 / base as f64
    );
    cleanup(redis, &prefix).await;
}
