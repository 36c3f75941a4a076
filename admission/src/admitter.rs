//! The admission loop. Each tick runs `admit.lua` once per event; the script
//! holds the lease check, the lapse sweep, the rate budget and the
//! `max_active` cap in one atomic step (see the script for its guarantees).

use std::time::Duration;

use boxoffice_contract::event::now_ms;
use boxoffice_contract::keys::{events_key, EventKeys};
use boxoffice_contract::redis_link::RedisLink;
use redis::{AsyncCommands, Script};
use tokio_util::sync::CancellationToken;

/// What every replica sees of an event after a tick: exported as metrics.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Gauges {
    pub active: u64,
    pub queue_length: u64,
    pub admitted_total: u64,
    /// The rate in force, as the leader admits by (a standby reads the same
    /// settings): 0 while paused, closed, sold out or not yet open.
    pub rate: f64,
}

/// What one tick did for one event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tick {
    /// This replica leads the event: fans admitted now, and active after.
    Led { admitted: u64, active: u64 },
    /// Another replica holds the lease.
    Follower,
}

pub struct Admitter {
    redis: RedisLink,
    prefix: String,
    replica: String,
    script: Script,
    lease: Duration,
    tick: Duration,
}

/// Every replica reads the same Redis, so all export the same readings, the
/// rate in force included: a standby reads the settings the leader admits
/// by, so a replica that led an event and lost it does not keep exporting
/// the rate it last led at (`max by (event)` over replicas would read that).
fn export(event: &str, gauges: &Gauges) {
    let label = [("event", event.to_owned())];
    metrics::gauge!("boxoffice_queue_length", &label).set(gauges.queue_length as f64);
    metrics::gauge!("boxoffice_active", &label).set(gauges.active as f64);
    metrics::gauge!("boxoffice_admission_rate", &label).set(gauges.rate);
    metrics::counter!("boxoffice_admitted_total", &label).absolute(gauges.admitted_total);
}

impl Admitter {
    pub fn new(
        redis: impl Into<RedisLink>,
        prefix: &str,
        replica: &str,
        lease: Duration,
        tick: Duration,
    ) -> Self {
        Self {
            redis: redis.into(),
            prefix: prefix.to_owned(),
            replica: replica.to_owned(),
            script: Script::new(include_str!("admit.lua")),
            lease,
            tick,
        }
    }

    /// One tick of one event at `now_ms` (a parameter so tests control the clock).
    pub async fn tick_event(&self, event_id: &str, now_ms: i64) -> redis::RedisResult<Tick> {
        Ok(self.tick_with_gauges(event_id, now_ms).await?.0)
    }

    /// One tick, and the event's gauges after it.
    pub async fn tick_with_gauges(
        &self,
        event_id: &str,
        now_ms: i64,
    ) -> redis::RedisResult<(Tick, Gauges)> {
        let keys = EventKeys::new(&self.prefix, event_id);
        let mut redis = self.redis.clone();
        // A late tick may count up to two ticks' time; more would burst after a stall.
        let longest = 2 * self.tick.as_millis() as u64;
        let (admitted, active, queue_length, admitted_total, rate_milli): (
            i64,
            u64,
            u64,
            u64,
            i64,
        ) = self
            .script
            .key(keys.config())
            .key(keys.queue())
            .key(keys.active())
            .key(keys.admit())
            .key(keys.lease())
            .key(keys.stock())
            .key(keys.admits())
            .arg(&self.replica)
            .arg(now_ms)
            .arg(self.lease.as_millis() as u64)
            .arg(longest)
            .invoke_async(&mut redis)
            .await?;
        let tick = if admitted < 0 {
            Tick::Follower
        } else {
            Tick::Led {
                admitted: admitted as u64,
                active,
            }
        };
        let gauges = Gauges {
            active,
            queue_length,
            admitted_total,
            rate: rate_milli as f64 / 1000.0,
        };
        Ok((tick, gauges))
    }

    /// One tick of every event at `now_ms`, exporting each event's gauges.
    pub async fn tick_all(&self, now_ms: i64) -> redis::RedisResult<Vec<(String, Tick)>> {
        let mut redis = self.redis.clone();
        let events: Vec<String> = redis.smembers(events_key(&self.prefix)).await?;
        let mut results = Vec::with_capacity(events.len());
        for event in events {
            let (tick, gauges) = self.tick_with_gauges(&event, now_ms).await?;
            export(&event, &gauges);
            results.push((event, tick));
        }
        Ok(results)
    }

    /// Ticks every `tick` until cancelled.
    pub async fn run(self, cancel: CancellationToken) {
        let mut interval = tokio::time::interval(self.tick);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = cancel.cancelled() => break,
                _ = interval.tick() => {}
            }
            match self.tick_all(now_ms()).await {
                Ok(results) => {
                    for (event_id, tick) in results {
                        if let Tick::Led { admitted, active } = tick {
                            if admitted > 0 {
                                tracing::debug!(%event_id, admitted, active, "admitted");
                            }
                        }
                    }
                }
                Err(error) => tracing::warn!(%error, "admission tick failed"),
            }
        }
        self.release_leases().await;
    }

    /// Gives up our leases at shutdown so a standby takes over at once.
    async fn release_leases(&self) {
        let mut redis = self.redis.clone();
        let events: Vec<String> = redis
            .smembers(events_key(&self.prefix))
            .await
            .unwrap_or_default();
        let release = Script::new(
            "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0",
        );
        for event in events {
            let keys = EventKeys::new(&self.prefix, &event);
            let _: redis::RedisResult<i32> = release
                .key(keys.lease())
                .arg(&self.replica)
                .invoke_async(&mut redis)
                .await;
        }
    }
}
