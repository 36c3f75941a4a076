//! Adaptive admission against a real order service on a real Postgres: the
//! rate halves while the outbox backs up and climbs back once it drains; it
//! halves too while an order waits unsettled (a payment outage) and when the
//! order service does not answer.

use admission::adaptive::{Controller, Verdict};
use boxoffice_contract::auth::ServiceTokenArgs;
use boxoffice_contract::event::{Adaptive, EventConfig};
use boxoffice_contract::keys::{events_key, EventKeys};
use redis::AsyncCommands;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

const SERVICE_TOKEN: &str = "test-service-token-of-at-least-32-bytes";

#[sqlx::test(migrator = "order_service::MIGRATOR")]
async fn the_rate_halves_under_backlog_and_climbs_when_it_drains(pool: PgPool) {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let mut redis = redis::aio::ConnectionManager::new(redis::Client::open(url.clone()).unwrap())
        .await
        .unwrap();
    let prefix = format!("t{}", uuid::Uuid::new_v4().simple());

    // The order service, with no relay, so outbox rows stay unpublished until we say.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let order_service_url = format!("http://{}", listener.local_addr().unwrap());
    let config = {
        let mut c = order_service::ServeConfig::defaults();
        c.redis_prefix = prefix.clone();
        c.redis_url = url;
        c.topic = format!("adaptive-{prefix}");
        c.worker_group = format!("group-{prefix}");
        c.saga_runners = 0;
        c.relay = false;
        c.service = ServiceTokenArgs::new(SERVICE_TOKEN);
        c.ticket_store = std::env::temp_dir()
            .join(format!("boxoffice-tickets-{prefix}"))
            .display()
            .to_string();
        if let Ok(brokers) = std::env::var("KAFKA_BROKERS") {
            c.kafka_brokers = brokers;
        }
        c
    };
    let state = order_service::AppState::new(pool.clone(), redis.clone(), config).unwrap();
    let cancel = CancellationToken::new();
    let stop = cancel.clone();
    let server = tokio::spawn(order_service::serve(listener, state, async move {
        stop.cancelled().await
    }));

    let keys = EventKeys::new(&prefix, "ev");
    let event = {
        let mut c = EventConfig::open("Adaptive", 100, 40.0);
        c.max_active = 100;
        c.access_ttl_s = 60;
        c.per_fan_limit = 2;
        c.max_queue = 100;
        c.shuffle_seed = "seed".into();
        c.adaptive = Some(Adaptive {
            floor: 5.0,
            ceiling: 45.0,
            max_order_latency_ms: 60_000.0,
            max_outbox_backlog: 10,
            max_consumer_lag: 1_000_000,
        });
        c
    };
    let _: () = redis
        .hset_multiple(keys.config(), &event.to_fields())
        .await
        .unwrap();
    let _: () = redis.sadd(events_key(&prefix), "ev").await.unwrap();
    let _: () = redis.set(keys.lease(), "a").await.unwrap();

    sqlx::query(
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
         SELECT 'order', g::text, 'test', '{}'::jsonb FROM generate_series(1, 20) g",
    )
    .execute(&pool)
    .await
    .unwrap();

    let controller = |replica: &str| Controller {
        redis: redis.clone().into(),
        prefix: prefix.clone(),
        replica: replica.into(),
        http: reqwest::Client::builder()
            .default_headers(ServiceTokenArgs::new(SERVICE_TOKEN).header().unwrap())
            .build()
            .unwrap(),
        order_service_url: order_service_url.clone(),
    };
    assert!(
        controller("b").adjust().await.unwrap().is_empty(),
        "only the leader adapts"
    );
    let leader = controller("a");
    let rate = |changes: Vec<(String, f64, f64, Verdict)>| changes.first().map(|c| (c.2, c.3));
    assert_eq!(
        rate(leader.adjust().await.unwrap()),
        Some((20.0, Verdict::OutboxBacklog))
    );
    assert_eq!(
        rate(leader.adjust().await.unwrap()),
        Some((10.0, Verdict::OutboxBacklog))
    );
    assert_eq!(
        rate(leader.adjust().await.unwrap()),
        Some((5.0, Verdict::OutboxBacklog)),
        "down to the floor"
    );
    assert_eq!(rate(leader.adjust().await.unwrap()), None, "and no lower");

    sqlx::query("UPDATE outbox SET published_at = now()")
        .execute(&pool)
        .await
        .unwrap();
    assert_eq!(
        rate(leader.adjust().await.unwrap()),
        Some((7.0, Verdict::Healthy)),
        "+5 % of the 5..45 band"
    );
    let stored: String = redis.hget(keys.config(), "rate").await.unwrap();
    assert_eq!(stored, "7", "the next tick admits at the new rate");

    // A payment outage: nothing confirms, so no latency figure, but an order
    // waits unsettled longer than the latency bound.
    sqlx::raw_sql(
        "INSERT INTO events (event_id, name, price_cents) VALUES ('ev', 'Adaptive', 100);
         INSERT INTO orders (order_id, event_id, fan_id, quantity, amount_cents, status, created_at)
         VALUES (gen_random_uuid(), 'ev', 'fan', 1, 100, 'reserved', now() - interval '2 minutes')",
    )
    .execute(&pool)
    .await
    .unwrap();
    assert_eq!(
        rate(leader.adjust().await.unwrap()),
        Some((5.0, Verdict::SlowOrders)),
        "an order stuck unsettled is a slow order"
    );
    sqlx::query("DELETE FROM orders")
        .execute(&pool)
        .await
        .unwrap();
    assert_eq!(
        rate(leader.adjust().await.unwrap()),
        Some((7.0, Verdict::Healthy))
    );

    // An order service that does not answer is not a healthy one.
    cancel.cancel();
    server.await.unwrap().unwrap();
    assert_eq!(
        rate(leader.adjust().await.unwrap()),
        Some((5.0, Verdict::Unreachable))
    );
    let all: Vec<String> = redis.keys(format!("{prefix}:*")).await.unwrap();
    let _: () = redis.del(all).await.unwrap();
}
