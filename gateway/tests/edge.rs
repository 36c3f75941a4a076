//! The protective layers over real sockets: per-IP rate limit, load shedding,
//! the request deadline, the body limit and request ids.

use std::time::{Duration, Instant};

use boxoffice_contract::token::{generate_ed25519_pem, now_s, Claims, KeySet, TokenUse};
use reqwest::StatusCode;
use serde_json::Value;

#[path = "common/own_redis.rs"]
mod own_redis;
use own_redis::OwnRedis;

const SECRET: &[u8] = b"test-queue-secret-of-32-bytes-at-least";

struct Edge {
    url: String,
    keys: KeySet,
    http: reqwest::Client,
    prefix: String,
}

/// A gateway whose order service accepts connections and never answers.
async fn edge(tune: impl FnOnce(&mut gateway::Config)) -> Edge {
    let black_hole = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = format!("http://{}", black_hole.local_addr().unwrap());
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = black_hole.accept().await {
            held.push(socket);
        }
    });
    let mut config = {
        let mut c = gateway::Config::defaults();
        c.redis_url =
            std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
        c.redis_prefix = format!("t{}", uuid::Uuid::new_v4().simple());
        c.order_service_url = upstream;
        c.queue_ticket_ttl_s = 3600;
        c.order_token_ttl_s = 3600;
        c.per_ip_rate = 1_000;
        c.per_ip_burst = 1_000;
        c.per_fan_rate = 1_000_000;
        c.per_fan_burst = 1_000_000;
        c.max_in_flight = 64;
        c.upstream_timeout_ms = 30_000;
        c
    };
    tune(&mut config);
    let redis =
        redis::aio::ConnectionManager::new(redis::Client::open(config.redis_url.clone()).unwrap())
            .await
            .unwrap();
    let prefix = config.redis_prefix.clone();
    let keys = KeySet::from_pems("boxoffice", &generate_ed25519_pem(), &[], SECRET).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let state = gateway::AppState::new(redis, keys.clone(), config).unwrap();
    tokio::spawn(gateway::serve(listener, state, std::future::pending()));
    Edge {
        url,
        keys,
        http: reqwest::Client::new(),
        prefix,
    }
}

impl Edge {
    /// An event open now that admits nobody, written straight into Redis.
    async fn open_event(&self, event_id: &str) {
        let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
        let mut redis = redis::aio::ConnectionManager::new(redis::Client::open(url).unwrap())
            .await
            .unwrap();
        let mut event = boxoffice_contract::event::EventConfig::open("Edge", 100, 0.001);
        event.identity = boxoffice_contract::event::Identity::Declared;
        let _: () = redis::AsyncCommands::hset_multiple(
            &mut redis,
            boxoffice_contract::keys::EventKeys::new(&self.prefix, event_id).config(),
            &event.to_fields(),
        )
        .await
        .unwrap();
    }

    /// A request that waits on the order service (which never answers).
    fn hanging(&self) -> reqwest::RequestBuilder {
        let order_id = uuid::Uuid::now_v7();
        let mut claims = Claims::new("boxoffice", "ev", "fan", TokenUse::Order, now_s(), 600);
        claims.order_id = Some(order_id);
        self.http
            .get(format!("{}/v1/orders/{order_id}", self.url))
            .bearer_auth(self.keys.sign(&claims))
    }
}

async fn problem(response: reqwest::Response) -> (StatusCode, Option<String>, String) {
    let status = response.status();
    let retry = response
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_owned());
    assert_eq!(
        response.headers()["content-type"],
        "application/problem+json"
    );
    let body: Value = response.json().await.unwrap();
    (
        status,
        retry,
        body["type"]
            .as_str()
            .unwrap()
            .rsplit('/')
            .next()
            .unwrap()
            .to_owned(),
    )
}

#[tokio::test]
async fn an_address_past_its_quota_gets_429_with_retry_after() {
    let edge = edge(|c| {
        c.per_ip_rate = 1;
        c.per_ip_burst = 3;
    })
    .await;
    let jwks = || {
        edge.http
            .get(format!("{}/.well-known/jwks.json", edge.url))
            .send()
    };
    for _ in 0..3 {
        assert_eq!(jwks().await.unwrap().status(), StatusCode::OK);
    }
    let (status, retry, slug) = problem(jwks().await.unwrap()).await;
    assert_eq!(
        (status, slug.as_str()),
        (StatusCode::TOO_MANY_REQUESTS, "rate-limited")
    );
    assert!(retry.unwrap().parse::<u64>().unwrap() >= 1);
    // The probes and metrics stay outside the fans' limits.
    for probe in ["/healthz", "/readyz", "/metrics"] {
        let status = edge
            .http
            .get(format!("{}{probe}", edge.url))
            .send()
            .await
            .unwrap()
            .status();
        assert_eq!(
            status,
            StatusCode::OK,
            "{probe} while the address is limited"
        );
    }
}

/// Behind a trusted proxy each client has its own quota (the rightmost
/// untrusted `X-Forwarded-For` hop); from anyone else the header is ignored,
/// so rotating it does not escape the limit.
#[tokio::test]
async fn clients_behind_a_trusted_proxy_are_limited_one_by_one() {
    let behind = edge(|c| {
        c.per_ip_rate = 1;
        c.per_ip_burst = 2;
        c.trusted_proxies = vec!["127.0.0.0/8".parse().unwrap()];
    })
    .await;
    let from = |edge: &Edge, client: &str| {
        edge.http
            .get(format!("{}/.well-known/jwks.json", edge.url))
            .header("x-forwarded-for", format!("{client}, 127.0.0.9"))
            .send()
    };
    for _ in 0..2 {
        assert_eq!(
            from(&behind, "203.0.113.7").await.unwrap().status(),
            StatusCode::OK
        );
    }
    assert_eq!(
        from(&behind, "203.0.113.7").await.unwrap().status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        from(&behind, "203.0.113.8").await.unwrap().status(),
        StatusCode::OK,
        "another client behind the same proxy has its own quota"
    );

    let direct = edge(|c| {
        c.per_ip_rate = 1;
        c.per_ip_burst = 2;
    })
    .await;
    let statuses: Vec<StatusCode> = futures_util::future::join_all((0..4).map(|i| {
        let direct = &direct;
        async move {
            from(direct, &format!("198.51.100.{i}"))
                .await
                .unwrap()
                .status()
        }
    }))
    .await;
    assert_eq!(
        statuses
            .iter()
            .filter(|s| **s == StatusCode::TOO_MANY_REQUESTS)
            .count(),
        2,
        "a spoofed header from an untrusted peer changes nothing: {statuses:?}"
    );
}

#[tokio::test]
async fn when_saturated_the_gateway_sheds_at_once_instead_of_queueing() {
    let edge = edge(|c| c.max_in_flight = 1).await;
    let stuck = tokio::spawn(edge.hanging().send());
    tokio::time::sleep(Duration::from_millis(200)).await;
    let started = Instant::now();
    let (status, retry, slug) = problem(
        edge.http
            .get(format!("{}/.well-known/jwks.json", edge.url))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(
        (status, slug.as_str()),
        (StatusCode::SERVICE_UNAVAILABLE, "overloaded")
    );
    assert_eq!(retry.as_deref(), Some("1"));
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "shed, not queued: {:?}",
        started.elapsed()
    );
    stuck.abort();
}

#[tokio::test]
async fn a_request_past_its_deadline_is_answered_503() {
    let edge = edge(|c| c.request_timeout_ms = 300).await;
    let started = Instant::now();
    let (status, retry, slug) = problem(edge.hanging().send().await.unwrap()).await;
    assert_eq!(
        (status, slug.as_str()),
        (StatusCode::SERVICE_UNAVAILABLE, "overloaded")
    );
    assert!(retry.is_some());
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn oversized_bodies_get_413_and_requests_carry_an_id() {
    let edge = edge(|_| {}).await;
    let body = format!("{{\"fan_id\":\"{}\"}}", "x".repeat(20_000));
    let response = edge
        .http
        .post(format!("{}/v1/events/ev/queue", edge.url))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    let made = response.headers()["x-request-id"]
        .to_str()
        .unwrap()
        .to_owned();
    let (status, _, slug) = problem(response).await;
    assert_eq!(
        (status, slug.as_str()),
        (StatusCode::PAYLOAD_TOO_LARGE, "payload-too-large")
    );
    let response = edge
        .http
        .get(format!("{}/.well-known/jwks.json", edge.url))
        .header("x-request-id", "abc-123")
        .send()
        .await
        .unwrap();
    assert_eq!(
        response.headers()["x-request-id"],
        "abc-123",
        "a caller's id is kept"
    );
    // Without one, each request is given its own.
    let again = edge
        .http
        .get(format!("{}/.well-known/jwks.json", edge.url))
        .send()
        .await
        .unwrap();
    let again = again.headers()["x-request-id"].to_str().unwrap();
    for id in [&made, again] {
        assert!(uuid::Uuid::parse_str(id).is_ok(), "{id}");
    }
    assert_ne!(made, again);
}

/// An order service whose health the test switches, counting the calls it gets.
struct FlakyUpstream {
    url: String,
    healthy: std::sync::Arc<std::sync::atomic::AtomicBool>,
    calls: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

async fn flaky_upstream() -> FlakyUpstream {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Arc;
    let healthy = Arc::new(AtomicBool::new(false));
    let calls = Arc::new(AtomicUsize::new(0));
    let (h, c) = (healthy.clone(), calls.clone());
    let app = axum::Router::new().fallback(move || {
        let (h, c) = (h.clone(), c.clone());
        async move {
            c.fetch_add(1, Ordering::SeqCst);
            if h.load(Ordering::SeqCst) {
                boxoffice_contract::Problem::not_found("unknown-order", "no such order")
            } else {
                boxoffice_contract::Problem::unavailable("down", "down", 1)
            }
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    FlakyUpstream {
        url,
        healthy,
        calls,
    }
}

#[tokio::test]
async fn the_breaker_opens_on_an_outage_answers_fast_then_closes_after_recovery() {
    use std::sync::atomic::Ordering;
    let upstream = flaky_upstream().await;
    let url = upstream.url.clone();
    let edge = edge(move |c| {
        c.order_service_url = url;
        c.breaker_window_s = 1;
        c.breaker_min_requests = 5;
        c.breaker_open_ms = 1_000;
    })
    .await;

    // The success rate is a moving average over the window: keep failing until it opens.
    let mut opened = false;
    for _ in 0..100 {
        let response = edge.hanging().send().await.unwrap();
        let body: Value = response.json().await.unwrap();
        assert_eq!(body["status"], 503);
        if body["detail"].as_str().unwrap().contains("circuit open") {
            opened = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(40)).await;
    }
    assert!(opened, "the breaker never opened");
    let through = upstream.calls.load(Ordering::SeqCst);
    assert!(
        through >= 5,
        "it judged on at least the minimum volume: {through}"
    );
    for _ in 0..20 {
        let started = Instant::now();
        let (status, retry, slug) = problem(edge.hanging().send().await.unwrap()).await;
        assert_eq!(
            (status, slug.as_str()),
            (StatusCode::SERVICE_UNAVAILABLE, "upstream-unavailable")
        );
        assert!(retry.is_some());
        assert!(
            started.elapsed() < Duration::from_millis(500),
            "rejected fast: {:?}",
            started.elapsed()
        );
    }
    assert_eq!(
        upstream.calls.load(Ordering::SeqCst),
        through,
        "open: no call goes through"
    );

    // The service recovers; after the open period one call tests it, and the breaker closes.
    upstream.healthy.store(true, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(2_200)).await;
    for _ in 0..5 {
        let (status, _, slug) = problem(edge.hanging().send().await.unwrap()).await;
        assert_eq!(
            (status, slug.as_str()),
            (StatusCode::NOT_FOUND, "unknown-order"),
            "calls flow again"
        );
    }
    assert_eq!(upstream.calls.load(Ordering::SeqCst), through + 5);
}

#[tokio::test]
async fn the_bulkhead_bounds_calls_to_the_order_service() {
    let edge = edge(|c| c.upstream_max_in_flight = 1).await;
    let stuck = tokio::spawn(edge.hanging().send());
    tokio::time::sleep(Duration::from_millis(200)).await;
    let started = Instant::now();
    let (status, retry, slug) = problem(edge.hanging().send().await.unwrap()).await;
    assert_eq!(
        (status, slug.as_str()),
        (StatusCode::SERVICE_UNAVAILABLE, "upstream-unavailable")
    );
    assert!(retry.is_some());
    assert!(started.elapsed() < Duration::from_millis(500));
    // The waiting room is unaffected by the stuck order service.
    assert_eq!(
        edge.http
            .get(format!("{}/healthz", edge.url))
            .send()
            .await
            .unwrap()
            .status(),
        StatusCode::OK
    );
    stuck.abort();
}

#[tokio::test]
async fn one_fan_past_its_quota_gets_429_while_others_pass() {
    let edge = edge(|c| {
        c.per_fan_rate = 1;
        c.per_fan_burst = 2;
    })
    .await;
    // An open event (the quota is counted once the event is read: who a
    // fan is depends on the event's identity mode).
    edge.open_event("ev").await;
    let join = |fan: &str| {
        edge.http
            .post(format!("{}/v1/events/ev/queue", edge.url))
            .json(&serde_json::json!({ "fan_id": fan }))
            .send()
    };
    for _ in 0..2 {
        assert!(join("greedy").await.unwrap().status().is_success());
    }
    let (status, retry, slug) = problem(join("greedy").await.unwrap()).await;
    assert_eq!(
        (status, slug.as_str()),
        (StatusCode::TOO_MANY_REQUESTS, "rate-limited")
    );
    assert!(retry.is_some());
    assert_eq!(
        join("patient").await.unwrap().status(),
        StatusCode::CREATED,
        "another fan is not limited"
    );

    // The status poll counts against the fan named by the verified ticket.
    let ticket = edge.keys.sign(&Claims::new(
        "boxoffice",
        "ev",
        "poller",
        TokenUse::Queue,
        now_s(),
        600,
    ));
    let poll = || {
        edge.http
            .get(format!("{}/v1/events/ev/queue/status", edge.url))
            .bearer_auth(&ticket)
            .send()
    };
    for _ in 0..2 {
        poll().await.unwrap();
    }
    let (status, _, slug) = problem(poll().await.unwrap()).await;
    assert_eq!(
        (status, slug.as_str()),
        (StatusCode::TOO_MANY_REQUESTS, "rate-limited")
    );
}

/// Slow clients: a thousand sockets trickling a request body one byte every
/// two seconds and a thousand trickling their headers cannot take the
/// gateway from a normal fan (answered at once from another address) or
/// from the orchestrator (`/healthz` 200, even from the attacking address).
/// A body that does not arrive in time is refused, and a connection whose
/// headers do not arrive in time is closed.
#[tokio::test]
async fn trickling_clients_hold_no_place_a_fan_needs() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let edge = edge(|c| {
        c.max_in_flight = 64;
        c.per_client_in_flight = 8;
        c.header_timeout_ms = 1_000;
        c.body_timeout_ms = 1_000;
        // This test's thousands of sockets come from one address; the cap
        // on them has its own test below.
        c.max_connections_per_ip = 10_000;
        c.per_ip_rate = 1_000_000;
        c.per_ip_burst = 1_000_000;
    })
    .await;
    edge.open_event("ev").await;
    let address = edge.url.trim_start_matches("http://").to_owned();

    const SOCKETS: usize = 1_000;
    let mut bodies = Vec::new();
    let mut headers = Vec::new();
    for _ in 0..SOCKETS {
        let mut body = tokio::net::TcpStream::connect(&address).await.unwrap();
        body.write_all(
            b"POST /v1/events/ev/queue HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{",
        )
        .await
        .unwrap();
        bodies.push(body);
        let mut header = tokio::net::TcpStream::connect(&address).await.unwrap();
        header.write_all(b"POST /v1/ev").await.unwrap();
        headers.push(header);
    }
    let trickle = tokio::spawn(async move {
        for _ in 0..3 {
            tokio::time::sleep(Duration::from_millis(700)).await;
            for socket in bodies.iter_mut().chain(headers.iter_mut()) {
                let _ = socket.write_all(b" ").await;
            }
        }
        (bodies, headers)
    });

    // A fan on another address is answered at once, and the probes are up.
    let fan = reqwest::Client::builder()
        .local_address(std::net::IpAddr::from([127, 0, 0, 2]))
        .build()
        .unwrap();
    let started = Instant::now();
    let joined = fan
        .post(format!("{}/v1/events/ev/queue", edge.url))
        .json(&serde_json::json!({ "fan_id": "patient" }))
        .send()
        .await
        .unwrap();
    assert_eq!(joined.status(), StatusCode::CREATED);
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    let health = edge
        .http
        .get(format!("{}/healthz", edge.url))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), StatusCode::OK);

    // Past the timeouts: trickled bodies were refused, trickled headers cut off.
    let (mut bodies, mut headers) = trickle.await.unwrap();
    let mut answer = [0u8; 64];
    let read = tokio::time::timeout(Duration::from_secs(5), bodies[0].read(&mut answer))
        .await
        .expect("the trickled body got an answer")
        .unwrap();
    let status_line = String::from_utf8_lossy(&answer[..read]).into_owned();
    assert!(status_line.starts_with("HTTP/1.1 4"), "{status_line:?}");
    let closed = tokio::time::timeout(Duration::from_secs(5), async {
        let mut rest = Vec::new();
        headers[0].read_to_end(&mut rest).await.map(|_| rest)
    })
    .await
    .expect("the trickling connection was closed");
    assert!(closed.is_ok(), "{closed:?}");
}

/// One host cannot take the gateway's sockets: past its connections, a new
/// one from the same address is closed as it is accepted, while another
/// address is served; a connection given back makes room again.
#[tokio::test]
async fn one_address_holds_at_most_its_connections() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let edge = edge(|c| c.max_connections_per_ip = 4).await;
    edge.open_event("ev").await;
    let address = edge.url.trim_start_matches("http://").to_owned();
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(tokio::net::TcpStream::connect(&address).await.unwrap());
    }
    // Accepted in order: a request on the last one is answered.
    let probe = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n";
    held[3].write_all(probe).await.unwrap();
    let mut answer = [0u8; 12];
    held[3].read_exact(&mut answer).await.unwrap();
    assert_eq!(&answer, b"HTTP/1.1 200");

    let mut fifth = tokio::net::TcpStream::connect(&address).await.unwrap();
    let _ = fifth.write_all(probe).await;
    let mut rest = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), fifth.read_to_end(&mut rest))
        .await
        .expect("the fifth connection was closed, not left waiting");
    assert!(
        read.is_err() || rest.is_empty(),
        "a fifth connection from the same address was served: {:?}",
        String::from_utf8_lossy(&rest)
    );

    // Another address is served meanwhile.
    let other = reqwest::Client::builder()
        .local_address(std::net::IpAddr::from([127, 0, 0, 2]))
        .build()
        .unwrap();
    let health = other
        .get(format!("{}/healthz", edge.url))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), StatusCode::OK);

    // A connection closed is a place given back.
    drop(held.pop());
    let mut again = None;
    for _ in 0..50 {
        let mut socket = tokio::net::TcpStream::connect(&address).await.unwrap();
        socket.write_all(probe).await.unwrap();
        let mut answer = [0u8; 12];
        if tokio::time::timeout(Duration::from_secs(1), socket.read_exact(&mut answer))
            .await
            .is_ok_and(|r| r.is_ok())
        {
            again = Some(answer);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(again.as_ref().map(|a| &a[..]), Some(&b"HTTP/1.1 200"[..]));
}

/// `/readyz` is on the public port and never rate limited (probes must get
/// through), so a flood of it must not become a flood of Redis round trips:
/// one check per 500 ms at most, against a Redis of this test's own whose
/// command count is read back; and it still says when Redis is gone.
#[tokio::test]
async fn a_flood_of_readiness_probes_costs_redis_one_ping_per_half_second() {
    let mut server = OwnRedis::start().await;
    let url = server.url.clone();
    let mut admin = redis::Client::open(url.as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let edge = edge(|c| c.redis_url = url.clone()).await;
    let pings = |info: String| -> u64 {
        info.lines()
            .find_map(|l| l.strip_prefix("cmdstat_ping:calls="))
            .map_or(0, |rest| rest.split(',').next().unwrap().parse().unwrap())
    };
    let started = Instant::now();
    let mut probes = Vec::new();
    for _ in 0..40 {
        let (http, url) = (edge.http.clone(), format!("{}/readyz", edge.url));
        probes.push(tokio::spawn(async move {
            let mut statuses = Vec::new();
            for _ in 0..25 {
                statuses.push(http.get(&url).send().await.unwrap().status());
            }
            statuses
        }));
    }
    for probe in probes {
        for status in probe.await.unwrap() {
            assert_eq!(status, StatusCode::OK);
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut admin)
        .await
        .unwrap();
    let calls = pings(info);
    let bound = (elapsed / 0.5).ceil() as u64 + 1;
    eprintln!("1000 probes in {elapsed:.2} s cost {calls} PINGs (at most {bound})");
    assert!(
        calls >= 1 && calls <= bound,
        "{calls} PINGs for 1000 probes in {elapsed:.2} s"
    );

    server.kill();
    tokio::time::sleep(Duration::from_millis(600)).await;
    let status = edge
        .http
        .get(format!("{}/readyz", edge.url))
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "Redis is gone");
}
