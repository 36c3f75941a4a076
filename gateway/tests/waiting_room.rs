//! The waiting room on the real Redis, with no Postgres and no broker at all:
//! the edge answers join, status and sold-out from Redis alone. The admission
//! loop is driven tick by tick so timing is exact.

use std::time::Duration;

use admission::admitter::{Admitter, Tick};
use axum::body::Body;
use axum::http::{Request, StatusCode};
use boxoffice_contract::event::{now_ms, prequeue_score, seed_commitment, EventConfig, Identity};
use boxoffice_contract::keys::{events_key, EventKeys};
use boxoffice_contract::redis_link::RedisLink;
use boxoffice_contract::token::{generate_ed25519_pem, KeySet};
use redis::AsyncCommands;
use serde_json::{json, Value};
use tower::ServiceExt;

const SECRET: &[u8] = b"test-queue-secret-of-32-bytes-at-least";

struct Room {
    redis: RedisLink,
    prefix: String,
    keys: EventKeys,
    app: axum::Router,
}

fn config(rate: f64) -> EventConfig {
    let now = now_ms();
    {
        let mut c = EventConfig::open("Room", 1000, rate);
        c.prequeue_at_ms = now - 60_000;
        c.opens_at_ms = now - 1_000;
        c.access_ttl_s = 600;
        c.max_queue = 100_000;
        c.identity = Identity::Declared;
        c
    }
}

impl Room {
    async fn new(config: EventConfig) -> Self {
        let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
        let mut redis = boxoffice_contract::redis_link::connect(&url).await.unwrap();
        let prefix = format!("t{}", uuid::Uuid::new_v4().simple());
        let keys = EventKeys::new(&prefix, "ev");
        let _: () = redis
            .hset_multiple(keys.config(), &config.to_fields())
            .await
            .unwrap();
        let _: () = redis
            .hset_multiple(keys.stock(), &[("remaining", 1000), ("version", 1)])
            .await
            .unwrap();
        let _: () = redis.sadd(events_key(&prefix), "ev").await.unwrap();
        let gateway_config = {
            let mut c = gateway::Config::defaults();
            c.redis_url = url;
            c.redis_prefix = prefix.clone();
            c.order_service_url = "http://127.0.0.1:9".into();
            c.queue_ticket_ttl_s = 3600;
            c.order_token_ttl_s = 3600;
            c.upstream_timeout_ms = 1000;
            c.event_cache_ms = 0;
            c.per_ip_rate = 1_000_000;
            c.per_ip_burst = 1_000_000;
            c.per_client_in_flight = 1_000_000;
            c.per_fan_rate = 1_000_000;
            c.per_fan_burst = 1_000_000;
            c
        };
        let keyset = KeySet::from_pems("boxoffice", &generate_ed25519_pem(), &[], SECRET).unwrap();
        let app =
            gateway::router(gateway::AppState::new(redis.clone(), keyset, gateway_config).unwrap());
        Self {
            redis,
            prefix,
            keys,
            app,
        }
    }

    fn admitter(&self, replica: &str) -> Admitter {
        Admitter::new(
            self.redis.clone(),
            &self.prefix,
            replica,
            Duration::from_millis(1000),
            Duration::from_millis(100),
        )
    }

    async fn set(&self, field: &str, value: impl ToString) {
        let _: () = self
            .redis
            .clone()
            .hset(self.keys.config(), field, value.to_string())
            .await
            .unwrap();
    }

    async fn call(&self, request: Request<Body>) -> (StatusCode, Option<String>, Value) {
        let response = self.app.clone().oneshot(request).await.unwrap();
        let status = response.status();
        let retry = response
            .headers()
            .get("retry-after")
            .map(|v| v.to_str().unwrap().to_owned());
        let content_type = response.headers().get("content-type").cloned();
        let body = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .unwrap();
        let body = serde_json::from_slice(&body).unwrap_or(Value::Null);
        if status.is_success() && body.is_object() {
            assert_eq!(
                content_type.as_ref().map(|v| v.to_str().unwrap()),
                Some("application/json"),
                "{body}"
            );
        }
        (status, retry, body)
    }

    async fn join(&self, fan: &str) -> (StatusCode, Option<String>, Value) {
        self.call(
            Request::post("/v1/events/ev/queue")
                .header("content-type", "application/json")
                .body(Body::from(json!({ "fan_id": fan }).to_string()))
                .unwrap(),
        )
        .await
    }

    async fn status(&self, ticket: &str) -> (StatusCode, Option<String>, Value) {
        self.call(
            Request::get("/v1/events/ev/queue/status")
                .header("authorization", format!("Bearer {ticket}"))
                .body(Body::empty())
                .unwrap(),
        )
        .await
    }

    async fn info(&self) -> Value {
        self.call(Request::get("/v1/events/ev").body(Body::empty()).unwrap())
            .await
            .2
    }

    /// Admitted fans in admission order (the active set's score is the expiry,
    /// which grows with each tick).
    async fn admitted(&self) -> Vec<String> {
        self.redis
            .clone()
            .zrange(self.keys.active(), 0, -1)
            .await
            .unwrap()
    }

    async fn cleanup(mut self) {
        let keys: Vec<String> = self.redis.keys(format!("{}:*", self.prefix)).await.unwrap();
        let _: () = self.redis.del(keys).await.unwrap();
    }
}

fn slug(body: &Value) -> &str {
    body["type"]
        .as_str()
        .unwrap_or_default()
        .rsplit('/')
        .next()
        .unwrap()
}

#[tokio::test]
async fn prequeue_fans_go_first_in_the_published_seed_order_then_fifo() {
    let mut config = config(10.0);
    config.opens_at_ms = now_ms() + 3_600_000;
    let room = Room::new(config).await;
    let before = room.info().await;
    assert_eq!(before["state"], "prequeue");
    assert!(
        before["shuffle_seed"].is_null(),
        "the seed stays secret until opening"
    );
    let commitment = before["shuffle_commitment"].as_str().unwrap().to_owned();

    let early: Vec<String> = (0..200).map(|i| format!("early-{i}")).collect();
    for fan in &early {
        assert_eq!(room.join(fan).await.0, StatusCode::CREATED);
    }
    // Ops open the doors.
    room.set("opens_at_ms", now_ms() - 1).await;
    let late: Vec<String> = (0..200).map(|i| format!("late-{i}")).collect();
    for (i, fan) in late.iter().enumerate() {
        let (status, _, body) = room.join(fan).await;
        assert_eq!(status, StatusCode::CREATED);
        assert_eq!(
            body["position"],
            201 + i,
            "a late fan queues behind every earlier one"
        );
    }

    let after = room.info().await;
    assert_eq!(after["shuffle_commitment"], commitment.as_str());
    let seed = after["shuffle_seed"].as_str().unwrap();
    assert_eq!(
        seed_commitment(seed),
        commitment,
        "the published seed matches its commitment"
    );
    let mut expected = early.clone();
    expected.sort_by_key(|fan| (prequeue_score(seed, fan), fan.clone()));
    assert_ne!(expected, early, "the prequeue is shuffled, not FIFO");
    expected.extend(late.iter().cloned());

    // One fan per 100 ms tick, so the admission order is observable.
    let admitter = room.admitter("a");
    let start = now_ms();
    for tick in 0..=400 {
        admitter.tick_event("ev", start + tick * 100).await.unwrap();
    }
    assert_eq!(room.admitted().await, expected);
    room.cleanup().await;
}

#[tokio::test]
async fn repeat_join_keeps_the_place_and_status_reports_it() {
    let room = Room::new(config(4.0)).await;
    for fan in ["a", "b", "c"] {
        room.join(fan).await;
    }
    let (status, retry, body) = room.join("b").await;
    assert_eq!(
        (status, body["position"].as_i64()),
        (StatusCode::OK, Some(2))
    );
    let samples: Vec<String> = room
        .redis
        .clone()
        .zrange(room.keys.joins(), 0, -1)
        .await
        .unwrap();
    assert_eq!(
        samples.len(),
        1,
        "one (sequence, time) sample a second: {samples:?}"
    );
    assert!(samples[0].starts_with("1:"));
    assert!(retry.is_some());
    let (status, retry, waiting) = room.status(body["queue_ticket"].as_str().unwrap()).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        (waiting["state"].as_str(), waiting["position"].as_i64()),
        (Some("waiting"), Some(2))
    );
    assert_eq!(waiting["eta_seconds"], 1, "2 fans at 4 fans/s");
    let retry: u64 = retry.unwrap().parse().unwrap();
    assert!((1..=30).contains(&retry));
    room.cleanup().await;
}

#[tokio::test]
async fn a_full_room_answers_429_with_retry_after() {
    let mut config = config(1.0);
    config.max_queue = 3;
    let room = Room::new(config).await;
    for fan in ["a", "b", "c"] {
        assert_eq!(room.join(fan).await.0, StatusCode::CREATED);
    }
    let (status, retry, body) = room.join("d").await;
    assert_eq!(
        (status, slug(&body)),
        (StatusCode::TOO_MANY_REQUESTS, "room-full")
    );
    assert!(retry.is_some());
    assert_eq!(
        room.join("a").await.0,
        StatusCode::OK,
        "those inside can still check in"
    );
    room.cleanup().await;
}

#[tokio::test]
async fn joining_before_the_prequeue_is_409_with_the_wait() {
    let mut config = config(1.0);
    config.prequeue_at_ms = now_ms() + 90_000;
    config.opens_at_ms = now_ms() + 120_000;
    let room = Room::new(config).await;
    let (status, retry, body) = room.join("a").await;
    assert_eq!((status, slug(&body)), (StatusCode::CONFLICT, "not-open"));
    let retry: u64 = retry.unwrap().parse().unwrap();
    assert!((85..=90).contains(&retry), "{retry}");
    assert_eq!(room.info().await["state"], "scheduled");
    room.cleanup().await;
}

#[tokio::test]
async fn an_unused_admission_lapses_and_its_slot_returns() {
    let mut config = config(10.0);
    config.access_ttl_s = 1;
    config.max_active = 1;
    let room = Room::new(config).await;
    let (_, _, first) = room.join("first").await;
    let (_, _, second) = room.join("second").await;
    let admitter = room.admitter("a");
    let now = now_ms();
    admitter.tick_event("ev", now).await.unwrap();
    assert_eq!(
        admitter.tick_event("ev", now + 100).await.unwrap(),
        Tick::Led {
            admitted: 1,
            active: 1
        }
    );
    assert_eq!(
        admitter.tick_event("ev", now + 200).await.unwrap(),
        Tick::Led {
            admitted: 0,
            active: 1
        },
        "the cap holds"
    );
    let (status, _, body) = room.status(first["queue_ticket"].as_str().unwrap()).await;
    assert_eq!(
        (status, body["state"].as_str()),
        (StatusCode::OK, Some("admitted"))
    );
    assert!(body["access_token"].is_string());

    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let (status, _, body) = room.status(first["queue_ticket"].as_str().unwrap()).await;
    assert_eq!((status, slug(&body)), (StatusCode::GONE, "expired"));
    assert_eq!(
        admitter.tick_event("ev", now_ms()).await.unwrap(),
        Tick::Led {
            admitted: 1,
            active: 1
        },
        "the slot returned"
    );
    let (_, _, body) = room.status(second["queue_ticket"].as_str().unwrap()).await;
    assert_eq!(body["state"], "admitted");
    room.cleanup().await;
}

#[tokio::test]
async fn sold_out_is_answered_at_the_edge_and_stops_admission() {
    let room = Room::new(config(100.0)).await;
    let (_, _, waiting) = room.join("a").await;
    let _: () = room
        .redis
        .clone()
        .hset(room.keys.stock(), "remaining", 0)
        .await
        .unwrap();
    let (status, _, body) = room.join("b").await;
    assert_eq!((status, slug(&body)), (StatusCode::GONE, "sold-out"));
    let (status, _, body) = room.status(waiting["queue_ticket"].as_str().unwrap()).await;
    assert_eq!((status, slug(&body)), (StatusCode::GONE, "sold-out"));
    let admitter = room.admitter("a");
    let now = now_ms();
    admitter.tick_event("ev", now).await.unwrap();
    // 100 fans/s would admit 10 in this tick; sold out, none.
    assert_eq!(
        admitter.tick_event("ev", now + 100).await.unwrap(),
        Tick::Led {
            admitted: 0,
            active: 0
        }
    );
    assert_eq!(room.info().await["state"], "sold_out");
    room.cleanup().await;
}

#[tokio::test]
async fn each_event_admits_at_its_own_rate() {
    let room = Room::new(config(10.0)).await;
    let other = EventKeys::new(&room.prefix, "other");
    let mut other_config = config(30.0);
    other_config.name = "Other".into();
    let mut redis = room.redis.clone();
    let _: () = redis
        .hset_multiple(other.config(), &other_config.to_fields())
        .await
        .unwrap();
    let _: () = redis.sadd(events_key(&room.prefix), "other").await.unwrap();
    for i in 0..100 {
        let _: () = redis
            .zadd(room.keys.queue(), format!("a{i}"), i)
            .await
            .unwrap();
        let _: () = redis.zadd(other.queue(), format!("b{i}"), i).await.unwrap();
    }
    let admitter = room.admitter("a");
    let start = now_ms();
    for tick in 0..=20 {
        admitter.tick_all(start + tick * 100).await.unwrap();
    }
    let a: u64 = redis.zcard(room.keys.active()).await.unwrap();
    let b: u64 = redis.zcard(other.active()).await.unwrap();
    assert_eq!((a, b), (20, 60), "2 s at 10/s and at 30/s");
    let _: () = redis
        .del(&[
            other.config(),
            other.queue(),
            other.active(),
            other.admit(),
            other.lease(),
        ])
        .await
        .unwrap();
    room.cleanup().await;
}

#[tokio::test]
async fn the_edge_sees_a_settings_change_within_its_cache_ttl() {
    let room = Room::new(config(10.0)).await;
    let cache = gateway::cache::EventCache::new(Duration::from_millis(1_000));
    let first = cache
        .get(&room.redis, &room.keys, "ev")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(first.rate(), 10.0);
    room.set("rate", 99).await;
    let cached = cache
        .get(&room.redis, &room.keys, "ev")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(cached.rate(), 10.0, "within the ttl the copy is served");
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let fresh = cache
        .get(&room.redis, &room.keys, "ev")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(fresh.rate(), 99.0, "after the ttl the change is seen");
    room.set("paused", 1).await;
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    assert_eq!(
        cache
            .get(&room.redis, &room.keys, "ev")
            .await
            .unwrap()
            .unwrap()
            .rate(),
        0.0,
        "paused means no progress"
    );
    assert!(cache
        .get(&room.redis, &EventKeys::new(&room.prefix, "nope"), "nope")
        .await
        .unwrap()
        .is_none());
    room.cleanup().await;
}

#[tokio::test]
async fn a_proof_of_work_event_admits_only_solved_joins() {
    let mut config = config(10.0);
    config.pow_bits = 12;
    let room = Room::new(config).await;
    let (status, _, body) = room.join("lazy-bot").await;
    assert_eq!(
        (status, slug(&body)),
        (StatusCode::PRECONDITION_REQUIRED, "proof-of-work-required")
    );

    let (status, _, issued) = room
        .call(
            Request::get("/v1/events/ev/challenge")
                .body(Body::empty())
                .unwrap(),
        )
        .await;
    assert_eq!(
        (status, issued["difficulty_bits"].as_u64()),
        (StatusCode::OK, Some(12))
    );
    let challenge = issued["challenge"].as_str().unwrap().to_owned();
    let nonce = gateway::pow::solve(&challenge, "fan-1", 12);
    let join = |fan: &'static str, challenge: String, nonce: String| {
        room.call(
            Request::post("/v1/events/ev/queue")
                .header("content-type", "application/json")
                .body(Body::from(
                    json!({ "fan_id": fan, "pow": { "challenge": challenge, "nonce": nonce } })
                        .to_string(),
                ))
                .unwrap(),
        )
    };
    let (status, _, _) = join("fan-1", challenge.clone(), nonce.clone()).await;
    assert_eq!(status, StatusCode::CREATED, "a solved challenge joins");
    let (status, _, body) = join("fan-2", challenge.clone(), "0".into()).await;
    assert_eq!(
        (status, slug(&body)),
        (StatusCode::UNPROCESSABLE_ENTITY, "invalid-proof-of-work")
    );
    let (status, _, body) = join("fan-3", "ev.9999999999.x.forged".into(), nonce).await;
    assert_eq!(
        (status, slug(&body)),
        (StatusCode::UNPROCESSABLE_ENTITY, "invalid-proof-of-work")
    );
    room.cleanup().await;
}

#[tokio::test]
async fn the_fan_page_is_served_at_the_root() {
    let room = Room::new(config(1.0)).await;
    let response = room
        .app
        .clone()
        .oneshot(Request::get("/").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        response.headers()["content-type"],
        "text/html; charset=utf-8"
    );
    let page = String::from_utf8(
        axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .unwrap()
            .to_vec(),
    )
    .unwrap();
    for needle in [
        "<title>BoxOffice waiting room</title>",
        "/queue/status",
        "Idempotency-Key",
        "Retry-After",
        "/challenge",
    ] {
        assert!(page.contains(needle), "the page lacks {needle}");
    }
    room.cleanup().await;
}
