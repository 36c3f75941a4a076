//! `admit.lua` against the real Redis, with a clock the test controls.
//! Each test works under its own key prefix.

use std::time::Duration;

use admission::admitter::{Admitter, Tick};
use boxoffice_contract::event::EventConfig;
use boxoffice_contract::keys::EventKeys;
use redis::aio::ConnectionManager;
use redis::AsyncCommands;

const TICK: Duration = Duration::from_millis(100);
const T0: i64 = 1_900_000_000_000;

async fn redis() -> ConnectionManager {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    ConnectionManager::new(redis::Client::open(url).unwrap())
        .await
        .unwrap()
}

struct Room {
    redis: ConnectionManager,
    prefix: String,
    keys: EventKeys,
}

impl Room {
    /// An open event with `fans` queued in order fan-0, fan-1, …
    async fn new(rate: f64, max_active: u64, fans: usize) -> Self {
        let prefix = format!("t{}", uuid::Uuid::new_v4().simple());
        let keys = EventKeys::new(&prefix, "ev");
        let mut redis = redis().await;
        let config = {
            let mut c = EventConfig::open("Test", 1000, rate);
            c.prequeue_at_ms = T0 - 10_000;
            c.opens_at_ms = T0 - 10_000;
            c.max_active = max_active;
            c.access_ttl_s = 60;
            c.max_queue = 1_000_000;
            c.price_cents = 100;
            c.shuffle_seed = "seed".into();
            c
        };
        let _: () = redis
            .hset_multiple(keys.config(), &config.to_fields())
            .await
            .unwrap();
        let _: () = redis
            .hset_multiple(keys.stock(), &[("remaining", 1000), ("version", 1)])
            .await
            .unwrap();
        for i in 0..fans {
            let _: () = redis
                .zadd(keys.queue(), format!("fan-{i}"), i)
                .await
                .unwrap();
        }
        Self {
            redis,
            prefix,
            keys,
        }
    }

    fn admitter(&self, replica: &str) -> Admitter {
        Admitter::new(
            self.redis.clone(),
            &self.prefix,
            replica,
            Duration::from_millis(1_000),
            TICK,
        )
    }

    async fn set(&self, field: &str, value: &str) {
        let _: () = self
            .redis
            .clone()
            .hset(self.keys.config(), field, value)
            .await
            .unwrap();
    }

    async fn active(&self) -> Vec<String> {
        let mut redis = self.redis.clone();
        let active: Vec<(String, f64)> = redis
            .zrange_withscores(self.keys.active(), 0, -1)
            .await
            .unwrap();
        active.into_iter().map(|(fan, _)| fan).collect()
    }

    async fn cleanup(mut self) {
        let keys: Vec<String> = self.redis.keys(format!("{}:*", self.prefix)).await.unwrap();
        if !keys.is_empty() {
            let _: () = self.redis.del(keys).await.unwrap();
        }
    }
}

/// Ticks every 100 ms of test time from T0 for `ticks` ticks; returns the total admitted.
async fn run(admitter: &Admitter, from: i64, ticks: i64) -> u64 {
    let mut total = 0;
    for i in 0..=ticks {
        if let Tick::Led { admitted, .. } = admitter.tick_event("ev", from + i * 100).await.unwrap()
        {
            total += admitted;
        }
    }
    total
}

#[tokio::test]
async fn admits_rate_times_time_and_carries_fractions() {
    let room = Room::new(2.5, 1_000, 100).await;
    // 2.5 fans/s over 2 s of 100 ms ticks: 0.25 per tick, carried until whole.
    assert_eq!(run(&room.admitter("a"), T0, 20).await, 5);
    room.cleanup().await;
}

#[tokio::test]
async fn admits_in_join_order() {
    let room = Room::new(50.0, 1_000, 30).await;
    run(&room.admitter("a"), T0, 4).await;
    let active = room.active().await;
    assert_eq!(active.len(), 20);
    let mut expected: Vec<String> = (0..20).map(|i| format!("fan-{i}")).collect();
    expected.sort();
    let mut got = active.clone();
    got.sort();
    assert_eq!(got, expected);
    room.cleanup().await;
}

#[tokio::test]
async fn a_stalled_tick_admits_at_most_two_ticks_worth() {
    let room = Room::new(10.0, 1_000, 100).await;
    let admitter = room.admitter("a");
    admitter.tick_event("ev", T0).await.unwrap();
    // Ten seconds of silence (a leader change, a GC pause) must not release 100 fans at once.
    let tick = admitter.tick_event("ev", T0 + 10_000).await.unwrap();
    assert_eq!(
        tick,
        Tick::Led {
            admitted: 2,
            active: 2
        }
    );
    room.cleanup().await;
}

#[tokio::test]
async fn never_more_than_max_active_and_lapsed_slots_return() {
    let room = Room::new(100.0, 3, 50).await;
    let admitter = room.admitter("a");
    assert_eq!(run(&admitter, T0, 10).await, 3);
    assert_eq!(room.active().await.len(), 3);
    // access_ttl_s is 60: past it, the three lapse and three more come in.
    let later = T0 + 61_000;
    let tick = admitter.tick_event("ev", later).await.unwrap();
    assert_eq!(
        tick,
        Tick::Led {
            admitted: 3,
            active: 3
        },
        "the lapsed slots are refilled at once"
    );
    assert_eq!(run(&admitter, later + 100, 5).await, 0);
    assert_eq!(room.active().await, ["fan-3", "fan-4", "fan-5"]);
    room.cleanup().await;
}

#[tokio::test]
async fn only_the_lease_holder_admits() {
    let room = Room::new(10.0, 1_000, 100).await;
    let (leader, standby) = (room.admitter("a"), room.admitter("b"));
    assert!(matches!(
        leader.tick_event("ev", T0).await.unwrap(),
        Tick::Led { .. }
    ));
    for i in 1..=10 {
        leader.tick_event("ev", T0 + i * 100).await.unwrap();
        assert_eq!(
            standby.tick_event("ev", T0 + i * 100).await.unwrap(),
            Tick::Follower
        );
    }
    assert_eq!(room.active().await.len(), 10, "two replicas, one rate");
    room.cleanup().await;
}

#[tokio::test]
async fn nothing_is_admitted_when_paused_closed_sold_out_or_not_yet_open() {
    let room = Room::new(100.0, 1_000, 100).await;
    let admitter = room.admitter("a");
    room.set("paused", "1").await;
    assert_eq!(run(&admitter, T0, 5).await, 0);
    room.set("paused", "0").await;
    room.set("state", "closed").await;
    assert_eq!(run(&admitter, T0 + 1_000, 5).await, 0);
    room.set("state", "").await;
    room.set("opens_at_ms", &(T0 + 60_000).to_string()).await;
    assert_eq!(run(&admitter, T0 + 2_000, 5).await, 0);
    room.set("opens_at_ms", &T0.to_string()).await;
    let _: () = room
        .redis
        .clone()
        .hset(room.keys.stock(), "remaining", 0)
        .await
        .unwrap();
    assert_eq!(run(&admitter, T0 + 3_000, 5).await, 0);
    let _: () = room
        .redis
        .clone()
        .hset(room.keys.stock(), "remaining", 5)
        .await
        .unwrap();
    assert!(
        run(&admitter, T0 + 4_000, 5).await > 0,
        "admits again once open with seats"
    );
    room.cleanup().await;
}

#[tokio::test]
async fn twenty_per_second_for_five_seconds_is_one_hundred_and_never_over_the_cap() {
    let room = Room::new(20.0, 60, 1_000).await;
    let admitter = room.admitter("a");
    let mut total = 0;
    for i in 0..=50 {
        match admitter.tick_event("ev", T0 + i * 100).await.unwrap() {
            Tick::Led { admitted, active } => {
                total += admitted;
                assert!(active <= 60, "active {active} over max_active");
            }
            Tick::Follower => panic!("sole replica must lead"),
        }
    }
    // 20/s × 5 s, but max_active 60 caps it (nobody buys or lapses here).
    assert_eq!(total, 60);
    room.cleanup().await;
    let room = Room::new(20.0, 1_000, 1_000).await;
    assert_eq!(run(&room.admitter("a"), T0, 50).await, 100);
    room.cleanup().await;
}
