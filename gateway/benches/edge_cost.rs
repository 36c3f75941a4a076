//! The gateway's own CPU per request, counted in instructions rather than
//! timed: `scripts/edge_cost.sh` runs this under `valgrind --tool=callgrind`
//! twice, with `BENCH_REQUESTS` requests and with twice as many, counting
//! from [`measuring_starts`] to [`measuring_ends`] only (building the
//! requests and signing the fans' tickets are left out), and divides the
//! difference by the extra requests.
//! An instruction count is the same from run to run on a busy machine, which
//! a 1 % change in req/s on two noisy cores is not; it leaves out the kernel,
//! the network and Redis's own CPU (the edge benchmark has those).
//!
//! Requests go straight into the service (`oneshot`), as hyper hands them
//! over, one at a time on a single-threaded runtime. `BENCH_SERVE` picks it:
//! `gateway` (default: the protective layers with their default limits,
//! `gateway::app`), `bare` (the same routes without them, `gateway::router`)
//! `baseline` (the edge benchmark's bare axum handler doing one ZRANK or
//! one ZADD) or, for the join, `script-baseline` (a bare handler doing the
//! join script, the join's own one round trip). Each request comes from another client address behind a
//! trusted proxy; status polls carry another fan's ticket each, joins name a
//! new fan each, so the limits see a crowd.
//!
//! `BENCH_KIND` is `status` (default) or `join`; `BENCH_LOG` the log filter
//! (`info`, as deployed); `BENCH_LOG_JSON=true` the JSON lines of k8s/
//! (default: the plain text of compose). Needs the local Redis.

mod common;

use std::net::SocketAddr;

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::Request;
use boxoffice_contract::token::{now_s, Claims, TokenUse};
use redis::AsyncCommands;
use tower::ServiceExt;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(run());
}

async fn run() {
    let requests: usize = std::env::var("BENCH_REQUESTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000);
    let join = std::env::var("BENCH_KIND").is_ok_and(|k| k == "join");
    let serve = std::env::var("BENCH_SERVE").unwrap_or_else(|_| "gateway".into());
    // The deployed telemetry: log lines at `info`, plain text (or JSON),
    // the Prometheus recorder.
    boxoffice_contract::telemetry::init_with(
        &std::env::var("BENCH_LOG").unwrap_or_else(|_| "info".into()),
        std::env::var("BENCH_LOG_JSON").is_ok_and(|v| v == "true"),
    );

    let (mut redis, url, prefix, keys) = common::open_event(10_000_000).await;
    let keyset = common::keyset();

    // Every request is written before the first is sent.
    let address = |i: usize| {
        format!(
            "127.{}.{}.{}",
            1 + i / 65_536 % 254,
            i / 256 % 256,
            1 + i % 254
        )
    };
    let mut batch = Vec::with_capacity(requests);
    if join {
        for i in 0..requests {
            let request = Request::post("/v1/events/ev/queue")
                .header("content-type", "application/json")
                .header("x-forwarded-for", address(i))
                .body(Body::from(format!(r#"{{"fan_id":"cost-fan-{i}"}}"#)))
                .unwrap();
            batch.push(request);
        }
    } else {
        let fans: Vec<(u64, String)> = (0..requests)
            .map(|i| (i as u64, format!("filler-{i}")))
            .collect();
        for chunk in fans.chunks(10_000) {
            let _: () = redis.zadd_multiple(keys.queue(), chunk).await.unwrap();
        }
        for (i, (_, fan)) in fans.iter().enumerate() {
            let claims = Claims::new("boxoffice", "ev", fan, TokenUse::Queue, now_s(), 3600);
            let request = Request::get("/v1/events/ev/queue/status")
                .header("authorization", format!("Bearer {}", keyset.sign(&claims)))
                .header("x-forwarded-for", address(i))
                .body(Body::empty())
                .unwrap();
            batch.push(request);
        }
    }

    let config = common::gateway_config(url, &prefix);
    let state = gateway::AppState::new(redis.clone(), keyset, config).unwrap();
    // One keep-alive connection from the proxy: `gateway::serve` gives each
    // request its connection (peer and clock) and calls the connection's
    // own copy of the stack (`ConnectionService`); the routes without the
    // layers and the baselines, under `axum::serve`, get axum's connect
    // info (the peer) and a copy of the service each.
    let proxy = SocketAddr::from(([127, 0, 0, 1], 40_000));
    let connection = gateway::Connection {
        peer: proxy,
        clock: gateway::timeouts::Clock::new(),
    };
    /// The gateway as `gateway::serve` runs it, or a router under
    /// `axum::serve`.
    enum Served<S> {
        Layered(gateway::ConnectionService<S>),
        Plain(axum::Router),
    }
    let served = match serve.as_str() {
        "gateway" => Served::Layered(gateway::ConnectionService::new(
            gateway::app(state),
            connection,
        )),
        "bare" => Served::Plain(gateway::router(state)),
        "baseline" => Served::Plain(common::baselines(
            redis.clone(),
            keys.queue(),
            format!("{prefix}:bare-joins"),
        )),
        "script-baseline" => Served::Plain(common::script_baseline(redis.clone(), &prefix)),
        other => panic!("BENCH_SERVE={other}: gateway, bare, baseline or script-baseline"),
    };
    let mut answered = [0usize; 6];
    measuring_starts();
    for mut request in batch {
        let response = match &served {
            Served::Layered(layered) => hyper::service::Service::call(layered, request).await,
            Served::Plain(plain) => {
                request.extensions_mut().insert(ConnectInfo(proxy));
                plain.clone().oneshot(request).await
            }
        }
        .unwrap();
        let status = response.status().as_u16();
        // The body is read, as hyper would to send it.
        let _ = axum::body::to_bytes(response.into_body(), usize::MAX).await;
        answered[usize::from(status / 100)] += 1;
    }
    measuring_ends();
    // Not the answers expected: the count would be of another path.
    assert_eq!(answered[2], requests, "answers by class: {answered:?}");
    common::cleanup(&mut redis, &prefix).await;
    println!("{requests} requests answered 2xx");
}

/// Where the count starts (`--zero-before`): the requests are built, the
/// fans are in line.
#[inline(never)]
fn measuring_starts() {
    std::hint::black_box(1);
}

/// Where the count ends (`--dump-before`): before the clean-up.
#[inline(never)]
fn measuring_ends() {
    std::hint::black_box(2);
}
