//! Property test over what fans send: arbitrary bodies, content types and
//! bearer values on join and status never get a 5xx, always a problem
//! document or a success, against the real Redis.

use axum::body::Body;
use axum::http::Request;
use boxoffice_contract::event::{now_ms, EventConfig, Identity};
use boxoffice_contract::keys::EventKeys;
use boxoffice_contract::token::{generate_ed25519_pem, KeySet};
use proptest::prelude::*;
use redis::AsyncCommands;
use tower::ServiceExt;

struct Harness {
    runtime: tokio::runtime::Runtime,
    app: axum::Router,
    prefix: String,
    redis: redis::aio::ConnectionManager,
}

fn harness() -> Harness {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (app, prefix, redis) = runtime.block_on(async {
        let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
        let mut redis =
            redis::aio::ConnectionManager::new(redis::Client::open(url.clone()).unwrap())
                .await
                .unwrap();
        let prefix = format!("t{}", uuid::Uuid::new_v4().simple());
        let config = {
            let mut c = EventConfig::open("Fuzz", 10, 1.0);
            c.opens_at_ms = now_ms() - 1_000;
            c.max_active = 10;
            c.access_ttl_s = 60;
            c.per_fan_limit = 2;
            c.max_queue = 1_000_000;
            c.shuffle_seed = "seed".into();
            // The bodies carry fan ids: fuzz the mode that reads them.
            c.identity = Identity::Declared;
            c
        };
        let _: () = redis
            .hset_multiple(EventKeys::new(&prefix, "ev").config(), &config.to_fields())
            .await
            .unwrap();
        let gateway_config = {
            let mut c = gateway::Config::defaults();
            c.redis_url = url;
            c.redis_prefix = prefix.clone();
            c.order_service_url = "http://127.0.0.1:9".into();
            c.queue_ticket_ttl_s = 60;
            c.order_token_ttl_s = 60;
            c.per_ip_rate = 1_000_000;
            c.per_ip_burst = 1_000_000;
            c.per_client_in_flight = 1_000_000;
            c.per_fan_rate = 1_000_000;
            c.per_fan_burst = 1_000_000;
            c.max_in_flight = 64;
            c.request_timeout_ms = 5_000;
            c.upstream_max_in_flight = 16;
            c.upstream_timeout_ms = 1_000;
            c
        };
        let keys = KeySet::from_pems(
            "boxoffice",
            &generate_ed25519_pem(),
            &[],
            b"fuzz-queue-secret-of-32-bytes-at-least",
        )
        .unwrap();
        (
            gateway::router(gateway::AppState::new(redis.clone(), keys, gateway_config).unwrap()),
            prefix,
            redis,
        )
    });
    Harness {
        runtime,
        app,
        prefix,
        redis,
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        let (prefix, mut redis) = (self.prefix.clone(), self.redis.clone());
        self.runtime.block_on(async move {
            let keys: Vec<String> = redis.keys(format!("{prefix}:*")).await.unwrap();
            let _: () = redis.del(keys).await.unwrap();
        });
    }
}

fn send(h: &Harness, request: Request<Body>) -> (u16, Option<String>) {
    h.runtime.block_on(async {
        let response = h.app.clone().oneshot(request).await.unwrap();
        let kind = response
            .headers()
            .get("content-type")
            .map(|v| v.to_str().unwrap().to_owned());
        (response.status().as_u16(), kind)
    })
}

fn json_like() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..300),
        r#"\{"fan_id":.{0,80}\}"#.prop_map(String::into_bytes),
        r#"\{"fan_id":"[ -~]{0,100}"\}"#.prop_map(String::into_bytes),
        r#"\{"fan_id":[0-9eE.+-]{1,30}\}"#.prop_map(String::into_bytes),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn join_answers_every_body_without_a_server_error(
        body in json_like(),
        content_type in prop_oneof![Just("application/json"), Just("text/plain"), Just("application/json; charset=utf-8"), Just("")],
    ) {
        let h = harness();
        let mut request = Request::post("/v1/events/ev/queue");
        if !content_type.is_empty() {
            request = request.header("content-type", content_type);
        }
        let (status, kind) = send(&h, request.body(Body::from(body)).unwrap());
        prop_assert!(status < 500, "{status}");
        if status >= 400 {
            prop_assert_eq!(kind.as_deref(), Some("application/problem+json"));
        }
    }

    #[test]
    fn status_answers_every_bearer_without_a_server_error(token in "[ -~]{0,300}") {
        let h = harness();
        let request = Request::get("/v1/events/ev/queue/status");
        let request = match axum::http::HeaderValue::from_str(&format!("Bearer {token}")) {
            Ok(value) => request.header("authorization", value),
            Err(_) => request,
        };
        let (status, kind) = send(&h, request.body(Body::empty()).unwrap());
        prop_assert_eq!(status, 401);
        prop_assert_eq!(kind.as_deref(), Some("application/problem+json"));
    }
}
