//! A whole BoxOffice stack for one test: the order service (API, saga
//! runners, outbox relay), a ticket worker, the admission service and the
//! gateway, each on 127.0.0.1:0, against the real Redis, the test's own
//! Postgres database and the real Kafka broker, with the test's own Redis
//! key prefix, topic and consumer group.
#![allow(dead_code)]

pub mod browser;

use std::time::Duration;

use boxoffice_contract::auth::ServiceTokenArgs;
use boxoffice_contract::token::{generate_ed25519_pem, KeySet};
use reqwest::StatusCode;
use serde_json::{json, Value};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::PgPool;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub const ADMIN_TOKEN: &str = "test-admin-token";
pub const QUEUE_SECRET: &[u8] = b"test-queue-secret-of-32-bytes-at-least";
/// The internal plane's token: the gateway and admission send it, the order service wants it.
pub const SERVICE_TOKEN: &str = "test-service-token-of-at-least-32-bytes";
/// The fake payment provider's API key.
pub const PAYMENT_API_KEY: &str = "test-payment-api-key-of-at-least-32-bytes";

pub fn service() -> ServiceTokenArgs {
    ServiceTokenArgs::new(SERVICE_TOKEN)
}

pub fn redis_url() -> String {
    std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

pub fn brokers() -> String {
    std::env::var("KAFKA_BROKERS").unwrap_or_else(|_| "127.0.0.1:9092".into())
}

pub struct Stack {
    pub gateway: String,
    pub payment_provider: String,
    pub admission: String,
    pub order_service: String,
    pub http: reqwest::Client,
    pub pool: PgPool,
    pub keys: KeySet,
    pub prefix: String,
    pub topic: String,
    /// The Redis (or Redis Cluster, comma-separated) the services use.
    pub redis_url: String,
    cancel: CancellationToken,
    tasks: Vec<JoinHandle<anyhow::Result<()>>>,
}

async fn listener() -> (TcpListener, String) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    (listener, url)
}

impl Stack {
    pub async fn start(pool_options: PgPoolOptions, connect: PgConnectOptions) -> Self {
        Self::start_with(pool_options, connect, true).await
    }

    /// `pipeline: false` leaves out the saga runners, the outbox relay and
    /// the ticket worker: purchases stop at `reserved` (benchmarks of the
    /// request path alone use this).
    pub async fn start_with(
        pool_options: PgPoolOptions,
        connect: PgConnectOptions,
        pipeline: bool,
    ) -> Self {
        Self::start_inner(pool_options, connect, pipeline, false, |_| {}, redis_url()).await
    }

    /// The whole stack with the gateway's default edge limits (per-IP,
    /// per-fan, event cache) left on, as a sale meets them.
    pub async fn start_with_edge_limits(
        pool_options: PgPoolOptions,
        connect: PgConnectOptions,
    ) -> Self {
        Self::start_inner(pool_options, connect, true, true, |_| {}, redis_url()).await
    }

    /// The whole stack behind a proxy at 127.0.0.1 that the gateway trusts,
    /// so the `traceparent` a test sends is continued as a tracing load
    /// balancer's would be (a client's own is dropped).
    pub async fn start_behind_proxy(
        pool_options: PgPoolOptions,
        connect: PgConnectOptions,
    ) -> Self {
        Self::start_inner(
            pool_options,
            connect,
            true,
            false,
            |c| c.trusted_proxies = vec!["127.0.0.1/32".parse().unwrap()],
            redis_url(),
        )
        .await
    }

    /// The whole stack on the Redis (or the Redis Cluster, its nodes
    /// comma-separated) at `redis_url`.
    pub async fn start_on_redis(
        pool_options: PgPoolOptions,
        connect: PgConnectOptions,
        redis_url: String,
    ) -> Self {
        Self::start_inner(pool_options, connect, true, false, |_| {}, redis_url).await
    }

    /// The request path alone (no saga, relay or worker), with the gateway's
    /// settings changed by `gateway` (identity providers, say).
    pub async fn start_with_gateway(
        pool_options: PgPoolOptions,
        connect: PgConnectOptions,
        gateway: impl FnOnce(&mut gateway::Config),
    ) -> Self {
        Self::start_inner(pool_options, connect, false, false, gateway, redis_url()).await
    }

    async fn start_inner(
        pool_options: PgPoolOptions,
        connect: PgConnectOptions,
        pipeline: bool,
        edge_limits: bool,
        gateway_settings: impl FnOnce(&mut gateway::Config),
        redis_url: String,
    ) -> Self {
        boxoffice_contract::telemetry::init(false);
        let pool = pool_options
            .max_connections(20)
            .connect_with(connect)
            .await
            .unwrap();
        let id = uuid::Uuid::new_v4().simple().to_string();
        let prefix = format!("t{id}");
        let topic = format!("order-events-{id}");
        let cancel = CancellationToken::new();
        let redis = boxoffice_contract::redis_link::connect(&redis_url)
            .await
            .unwrap();
        order_service::kafka::ensure_topics(&brokers(), &[&topic], 2)
            .await
            .unwrap();
        let mut tasks = Vec::new();

        let ticket_store = std::env::temp_dir()
            .join(format!("boxoffice-tickets-{id}"))
            .display()
            .to_string();
        // The fake payment provider, healthy (tests that want faults set its knobs).
        let (provider_listener, payment_provider) = listener().await;
        let stop = cancel.clone();
        tasks.push(tokio::spawn(order_service::payments::provider::serve(
            provider_listener,
            order_service::payments::provider::Provider::default().with_api_key(PAYMENT_API_KEY),
            async move { stop.cancelled().await },
        )));

        let (orders_listener, order_service) = listener().await;
        let serve_config = {
            let mut c = order_service::ServeConfig::defaults();
            c.db_connections = 20;
            c.redis_url = redis_url.clone();
            c.redis_prefix = prefix.clone();
            c.kafka_brokers = brokers();
            c.topic = topic.clone();
            c.worker_group = format!("ticket-issuer-{id}");
            c.partitions = 2;
            c.replication = order_service::kafka::Replication::SINGLE_BROKER;
            c.saga_runners = if pipeline { 4 } else { 0 };
            c.relay = pipeline;
            c.payment.payment_url = payment_provider.clone();
            c.payment.payment_api_key = PAYMENT_API_KEY.into();
            c.service = service();
            c.ticket_store = ticket_store.clone();
            c
        };
        let state =
            order_service::AppState::new(pool.clone(), redis.clone(), serve_config).unwrap();
        let stop = cancel.clone();
        tasks.push(tokio::spawn(order_service::serve(
            orders_listener,
            state,
            async move { stop.cancelled().await },
        )));

        let worker_config = {
            let mut c = order_service::WorkerConfig::defaults();
            c.kafka_brokers = brokers();
            c.topic = topic.clone();
            c.group = format!("ticket-issuer-{id}");
            c.replication = order_service::kafka::Replication::SINGLE_BROKER;
            c.commit_interval_ms = 200;
            c.ticket_store = ticket_store.clone();
            c
        };
        if pipeline {
            let (pool, cancel) = (pool.clone(), cancel.clone());
            tasks.push(tokio::spawn(async move {
                order_service::worker::run(worker_config, pool, cancel)
                    .await
                    .map(drop)
            }));
        }

        let (admission_listener, admission) = listener().await;
        let admission_config = {
            let mut c = admission::Config::defaults(ADMIN_TOKEN);
            c.redis_url = redis_url.clone();
            c.redis_prefix = prefix.clone();
            c.order_service_url = order_service.clone();
            c.service = service();
            c.tick_ms = 50;
            c.sample_ms = 250;
            c
        };
        let state = admission::AppState::new(redis.clone(), admission_config).unwrap();
        let stop = cancel.clone();
        tasks.push(tokio::spawn(admission::serve(
            admission_listener,
            state,
            async move { stop.cancelled().await },
        )));

        let keys =
            KeySet::from_pems("boxoffice", &generate_ed25519_pem(), &[], QUEUE_SECRET).unwrap();
        let (gateway_listener, gateway) = listener().await;
        let gateway_config = {
            let mut c = gateway::Config::defaults();
            c.redis_url = redis_url.clone();
            c.redis_prefix = prefix.clone();
            c.order_service_url = order_service.clone();
            c.service = service();
            c.queue_ticket_ttl_s = 3_600;
            c.order_token_ttl_s = 86_400;
            c.upstream_timeout_ms = 5_000;
            if !edge_limits {
                c.event_cache_ms = 0;
                c.per_ip_rate = 1_000_000;
                c.per_ip_burst = 1_000_000;
                c.per_fan_rate = 1_000_000;
                c.per_fan_burst = 1_000_000;
                c.per_client_in_flight = 1_000_000;
            }
            gateway_settings(&mut c);
            c
        };
        let state = gateway::AppState::new(redis, keys.clone(), gateway_config).unwrap();
        let stop = cancel.clone();
        tasks.push(tokio::spawn(gateway::serve(
            gateway_listener,
            state,
            async move { stop.cancelled().await },
        )));

        Self {
            gateway,
            payment_provider,
            admission,
            order_service,
            http: reqwest::Client::new(),
            pool,
            keys,
            prefix,
            topic,
            redis_url,
            cancel,
            tasks,
        }
    }

    /// Creates an event open now with the settings in `extra` on top of
    /// the usual ones (capacity 10, rate 50/s, per-fan limit 2).
    pub async fn create_event_with(&self, event_id: &str, extra: Value) {
        let mut body = json!({
            "name": format!("Test {event_id}"), "capacity": 10,
            "opens_at": chrono::Utc::now() - chrono::Duration::seconds(1),
            "admission_rate_per_s": 50.0, "max_active": 1000, "access_ttl_s": 120,
            "per_fan_limit": 2, "max_queue": 10_000, "price_cents": 4_500,
            // The tests name their fans; an event names them itself by default.
            "identity": "declared",
        });
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        let response = self
            .http
            .put(format!("{}/admin/v1/events/{event_id}", self.admission))
            .bearer_auth(ADMIN_TOKEN)
            .json(&body)
            .send()
            .await
            .unwrap();
        assert!(
            response.status().is_success(),
            "{:?}",
            response.text().await
        );
    }

    /// Creates an event that is open now.
    pub async fn create_event(
        &self,
        event_id: &str,
        capacity: i64,
        rate: f64,
        per_fan_limit: u32,
    ) -> Value {
        let opens_at = chrono::Utc::now() - chrono::Duration::seconds(1);
        let body = json!({
            "name": format!("Test {event_id}"), "capacity": capacity, "opens_at": opens_at,
            "admission_rate_per_s": rate, "max_active": 1000, "access_ttl_s": 120,
            "per_fan_limit": per_fan_limit, "max_queue": 10_000, "price_cents": 4_500,
            "identity": "declared",
        });
        let response = self
            .http
            .put(format!("{}/admin/v1/events/{event_id}", self.admission))
            .bearer_auth(ADMIN_TOKEN)
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(
            response.status(),
            StatusCode::CREATED,
            "{:?}",
            response.text().await
        );
        response.json().await.unwrap()
    }

    /// A purchase from a new open event to its issued tickets, sent with
    /// `traceparent`: the order id and the `traceparent` the fan was answered.
    pub async fn purchase(&self, event_id: &str, traceparent: &str) -> (String, String) {
        let (order_id, answered, _) = self.purchase_with_id(event_id, traceparent).await;
        (order_id, answered)
    }

    /// [`Stack::purchase`], with the `x-request-id` of the purchase's answer
    /// (the gateway's own: the purchase sends none).
    pub async fn purchase_with_id(
        &self,
        event_id: &str,
        traceparent: &str,
    ) -> (String, String, String) {
        self.create_event(event_id, 10, 100.0, 4).await;
        let (status, joined) = self.join(event_id, "fan-1").await;
        assert_eq!(status, StatusCode::CREATED, "{joined}");
        let access = self
            .wait_admitted(event_id, joined["queue_ticket"].as_str().unwrap())
            .await;
        let response = self
            .http
            .post(format!("{}/v1/events/{event_id}/orders", self.gateway))
            .bearer_auth(&access)
            .header("idempotency-key", "k-1")
            .header("traceparent", traceparent)
            .json(&json!({ "quantity": 2 }))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::ACCEPTED);
        let answered = response.headers()["traceparent"]
            .to_str()
            .unwrap()
            .to_owned();
        let request_id = response.headers()["x-request-id"]
            .to_str()
            .unwrap()
            .to_owned();
        let body: Value = response.json().await.unwrap();
        let order_id = body["order_id"].as_str().unwrap().to_owned();
        self.wait_ticketed(&order_id, body["order_token"].as_str().unwrap())
            .await;
        (order_id, answered, request_id)
    }

    /// GET `url` (no token) and its JSON body, whatever the status.
    pub async fn get_json(&self, url: String) -> Value {
        self.http
            .get(url)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    /// GET `path` of the admin API with the admin token: its JSON body.
    pub async fn admin_get(&self, path: &str) -> Value {
        self.http
            .get(format!("{}{path}", self.admission))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    /// The public view of an event (`GET /v1/events/{id}`).
    pub async fn public_event(&self, event_id: &str) -> Value {
        self.get_json(format!("{}/v1/events/{event_id}", self.gateway))
            .await
    }

    pub async fn join(&self, event_id: &str, fan_id: &str) -> (StatusCode, Value) {
        let response = self
            .http
            .post(format!("{}/v1/events/{event_id}/queue", self.gateway))
            .json(&json!({ "fan_id": fan_id }))
            .send()
            .await
            .unwrap();
        (response.status(), response.json().await.unwrap())
    }

    /// Polls the status until admitted (ignoring Retry-After: tests are impatient); returns the access token.
    pub async fn wait_admitted(&self, event_id: &str, ticket: &str) -> String {
        for _ in 0..300 {
            let response = self
                .http
                .get(format!(
                    "{}/v1/events/{event_id}/queue/status",
                    self.gateway
                ))
                .bearer_auth(ticket)
                .send()
                .await
                .unwrap();
            assert_eq!(response.status(), StatusCode::OK);
            let body: Value = response.json().await.unwrap();
            if body["state"] == "admitted" {
                return body["access_token"].as_str().unwrap().to_owned();
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("not admitted within 30 s");
    }

    pub async fn buy(
        &self,
        event_id: &str,
        access_token: &str,
        quantity: i64,
        key: Option<&str>,
    ) -> (StatusCode, Value) {
        let mut request = self
            .http
            .post(format!("{}/v1/events/{event_id}/orders", self.gateway))
            .bearer_auth(access_token)
            .json(&json!({ "quantity": quantity }));
        if let Some(key) = key {
            request = request.header("idempotency-key", key);
        }
        let response = request.send().await.unwrap();
        (response.status(), response.json().await.unwrap())
    }

    /// Sets the fake payment provider's fault knobs (unnamed ones back to none).
    pub async fn knobs(&self, knobs: Value) {
        let response = self
            .http
            .put(format!("{}/v1/knobs", self.payment_provider))
            .bearer_auth(PAYMENT_API_KEY)
            .json(&knobs)
            .send()
            .await
            .unwrap();
        assert!(
            response.status().is_success(),
            "{:?}",
            response.text().await
        );
    }

    pub async fn order(&self, order_id: &str, token: &str) -> (StatusCode, Value) {
        let response = self
            .http
            .get(format!("{}/v1/orders/{order_id}", self.gateway))
            .bearer_auth(token)
            .send()
            .await
            .unwrap();
        (response.status(), response.json().await.unwrap())
    }

    /// Waits (up to 90 s: group joins on the broker are slow) until the order
    /// is confirmed with all its tickets.
    pub async fn wait_ticketed(&self, order_id: &str, token: &str) -> Value {
        for _ in 0..900 {
            let (status, body) = self.order(order_id, token).await;
            assert_eq!(status, StatusCode::OK, "{body}");
            if body["status"] == "confirmed" && body["tickets_issued"] == body["quantity"] {
                return body;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("order {order_id} not ticketed within 90 s");
    }

    /// The URL of this test's own database (for a client that connects itself).
    pub async fn database_url(&self) -> String {
        let name: String = sqlx::query_scalar("SELECT current_database()")
            .fetch_one(&self.pool)
            .await
            .unwrap();
        let base = std::env::var("DATABASE_URL").expect("DATABASE_URL");
        let (server, _) = base.rsplit_once('/').expect("a database in DATABASE_URL");
        format!("{server}/{name}")
    }

    /// Runs the load test against this stack as its binary would, on a
    /// runtime of its own: the test's runtime has one thread, which the
    /// stack needs for itself (a shared thread would delay the admission
    /// ticks the run measures).
    pub async fn load_test(&self, args: &[&str]) -> loadtest::run::Outcome {
        use clap::Parser;
        let url = self.database_url().await;
        let mut all = vec![
            "loadtest",
            "--database-url",
            &url,
            "--host",
            &self.gateway,
            "--admin-url",
            &self.admission,
            "--admin-token",
            ADMIN_TOKEN,
            "--payment-url",
            &self.payment_provider,
            "--payment-api-key",
            PAYMENT_API_KEY,
            "--progress-s=0",
            "--quiet",
            "--no-print-metrics",
        ];
        all.extend_from_slice(args);
        let cli = loadtest::Cli::try_parse_from(all).unwrap();
        tokio::task::spawn_blocking(move || {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap()
                .block_on(loadtest::run::run(
                    cli.options,
                    cli.goose,
                    loadtest::run::Targets { pool: None },
                ))
        })
        .await
        .unwrap()
        .unwrap()
    }

    pub async fn stop(self) {
        self.cancel.cancel();
        for task in self.tasks {
            task.await.unwrap().unwrap();
        }
        if self.redis_url.contains(',') {
            return; // a test's own cluster, shut down with the test
        }
        let mut redis =
            redis::aio::ConnectionManager::new(redis::Client::open(self.redis_url).unwrap())
                .await
                .unwrap();
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{}:*", self.prefix))
            .query_async(&mut redis)
            .await
            .unwrap();
        if !keys.is_empty() {
            let _: () = redis::cmd("DEL")
                .arg(keys)
                .query_async(&mut redis)
                .await
                .unwrap();
        }
    }
}
