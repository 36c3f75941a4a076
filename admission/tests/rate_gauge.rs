//! `boxoffice_admission_rate` as each replica exports it: the rate in force,
//! never a former leader's stale one. The alert rules and the dashboard read
//! `max by (event) (boxoffice_admission_rate)` over the replicas, so one
//! replica still exporting the rate it last led at would win over the rate
//! the event runs at now.
//!
//! Each replica gets its own recorder (a thread-local one, as each replica's
//! process has its own), so what each would serve at /metrics is read apart.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use admission::admitter::Admitter;
use boxoffice_contract::event::{now_ms, EventConfig};
use metrics::{
    Counter, Gauge, GaugeFn, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit,
};
use redis::AsyncCommands;

const LEASE: Duration = Duration::from_millis(1_000);
const TICK: Duration = Duration::from_millis(100);

/// One replica's gauges, by name and `event` label: the last value set.
#[derive(Default)]
struct Gauges(Mutex<HashMap<(String, String), Arc<Value>>>);

#[derive(Default)]
struct Value(Mutex<f64>);

impl GaugeFn for Value {
    fn increment(&self, value: f64) {
        *self.0.lock().unwrap() += value;
    }
    fn decrement(&self, value: f64) {
        *self.0.lock().unwrap() -= value;
    }
    fn set(&self, value: f64) {
        *self.0.lock().unwrap() = value;
    }
}

impl Recorder for Gauges {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn register_counter(&self, _: &Key, _: &Metadata<'_>) -> Counter {
        Counter::noop()
    }
    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        let event = key
            .labels()
            .find(|l| l.key() == "event")
            .map(|l| l.value().to_owned())
            .unwrap_or_default();
        let value = self
            .0
            .lock()
            .unwrap()
            .entry((key.name().to_owned(), event))
            .or_default()
            .clone();
        Gauge::from_arc(value)
    }
    fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::noop()
    }
}

impl Gauges {
    /// The replica's `boxoffice_admission_rate{event}`, if it exports one.
    fn rate(&self, event: &str) -> Option<f64> {
        let gauges = self.0.lock().unwrap();
        let value = gauges.get(&("boxoffice_admission_rate".to_owned(), event.to_owned()))?;
        let value = *value.0.lock().unwrap();
        Some(value)
    }
}

/// One replica: its admitter and its own metrics.
struct Replica {
    admitter: Admitter,
    metrics: Gauges,
}

impl Replica {
    /// One tick of every event, exported into this replica's recorder (the
    /// test runtime is single-threaded, so the thread-local recorder is the
    /// one the tick's export sees).
    async fn tick(&self, now_ms: i64) -> Vec<(String, admission::admitter::Tick)> {
        let _guard = metrics::set_default_local_recorder(&self.metrics);
        self.admitter.tick_all(now_ms).await.unwrap()
    }
}

/// What `max by (event) (boxoffice_admission_rate)` reads over the replicas.
fn max_rate(replicas: &[&Replica], event: &str) -> Option<f64> {
    replicas
        .iter()
        .filter_map(|r| r.metrics.rate(event))
        .reduce(f64::max)
}

#[tokio::test]
async fn a_former_leader_does_not_export_a_stale_rate() {
    let mut config = EventConfig::open("Rate", 1_000, 50.0);
    config.max_active = 1_000;
    config.max_queue = 1_000;
    let (mut redis, prefix, keys) = common::event(&config).await;
    let replica = |name: &str| Replica {
        admitter: Admitter::new(redis.clone(), &prefix, name, LEASE, TICK),
        metrics: Gauges::default(),
    };
    let (a, b) = (replica("a"), replica("b"));
    let t0 = now_ms();

    // a leads at 50/s; b stands by, and reads the same rate in force.
    a.tick(t0).await;
    b.tick(t0).await;
    let leader: String = redis.get(keys.lease()).await.unwrap();
    assert_eq!(leader, "a");
    assert_eq!(a.metrics.rate("ev"), Some(50.0));
    assert_eq!(max_rate(&[&a, &b], "ev"), Some(50.0));

    // a's lease lapses (a stalled, or lost Redis for a while); b takes over,
    // and the rate is lowered to 5/s (an operator's PATCH, or the adaptive
    // controller, which b now runs).
    let _: () = redis.del(keys.lease()).await.unwrap();
    b.tick(t0 + 100).await;
    let leader: String = redis.get(keys.lease()).await.unwrap();
    assert_eq!(leader, "b");
    let _: () = redis.hset(keys.config(), "rate", "5").await.unwrap();
    for i in 2..5 {
        b.tick(t0 + i * 100).await;
        a.tick(t0 + i * 100).await;
    }
    assert_eq!(b.metrics.rate("ev"), Some(5.0), "the leader's rate");
    assert!(
        matches!(a.metrics.rate("ev"), None | Some(5.0)),
        "the former leader still exports {:?}, not the rate in force (5)",
        a.metrics.rate("ev")
    );
    assert_eq!(
        max_rate(&[&a, &b], "ev"),
        Some(5.0),
        "max by (event) over the replicas"
    );

    // Closed: the rate in force is 0, on every replica.
    let _: () = redis.hset(keys.config(), "state", "closed").await.unwrap();
    b.tick(t0 + 600).await;
    a.tick(t0 + 600).await;
    assert_eq!(max_rate(&[&a, &b], "ev"), Some(0.0), "closed");

    common::cleanup(redis, &prefix).await;
}
