//! A short-lived, per-process copy of each event's settings and stock view.
//!
//! The status poll and the join are the hottest paths; reading the event's
//! settings from Redis on each would double their Redis work for values that
//! change a few times a sale. Entries live `ttl` (100 ms by default, one
//! admission tick), so a PATCH or a sell-out reaches the edge within a tick.
//! Purchases never rely on this copy: `spend.lua` re-checks the stock in Redis.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use boxoffice_contract::event::{EventConfig, SeatView};
use boxoffice_contract::keys::EventKeys;
use boxoffice_contract::redis_link::RedisLink;

/// An event as the edge sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct EdgeEvent {
    pub config: EventConfig,
    /// Seats free and held per the order service's stock view.
    pub seats: SeatView,
}

impl EdgeEvent {
    pub fn sold_out(&self) -> bool {
        self.seats.sold_out()
    }

    /// Fans admitted per second now: 0 while paused, closed or every seat held.
    pub fn rate(&self) -> f64 {
        if self.config.paused || self.config.closed || self.seats.all_held() {
            0.0
        } else {
            self.config.admission_rate_per_s
        }
    }
}

/// Bound on remembered event ids, so a flood of made-up ids cannot grow memory.
const MAX_ENTRIES: usize = 10_000;

/// When an entry was read, and what (`None`: no such event).
type Entry = (Instant, Option<Arc<EdgeEvent>>);

pub struct EventCache {
    ttl: Duration,
    entries: RwLock<HashMap<String, Entry>>,
    /// When this process last recorded a (sequence, time) join sample, per event.
    sampled: Mutex<HashMap<String, i64>>,
}

impl EventCache {
    pub fn new(ttl: Duration) -> Self {
        Self {
            ttl,
            entries: RwLock::default(),
            sampled: Mutex::default(),
        }
    }

    /// The event, from memory if fresh, else from Redis (one round trip);
    /// `None` for an event that does not exist.
    pub async fn get(
        &self,
        redis: &RedisLink,
        keys: &EventKeys,
        event_id: &str,
    ) -> redis::RedisResult<Option<Arc<EdgeEvent>>> {
        if let Some((at, event)) = self.entries.read().expect("cache lock").get(event_id) {
            if at.elapsed() < self.ttl {
                return Ok(event.clone());
            }
        }
        let mut redis = redis.clone();
        let (fields, (remaining, held)): (HashMap<String, String>, (Option<i64>, Option<i64>)) =
            redis::pipe()
                .hgetall(keys.config())
                .hget(keys.stock(), &["remaining", "held"])
                .query_async(&mut redis)
                .await?;
        let seats = SeatView::new(remaining, held);
        let event =
            EventConfig::from_fields(&fields).map(|config| Arc::new(EdgeEvent { config, seats }));
        if !self.ttl.is_zero() {
            let mut entries = self.entries.write().expect("cache lock");
            if entries.len() >= MAX_ENTRIES {
                entries.clear();
            }
            entries.insert(event_id.to_owned(), (Instant::now(), event.clone()));
        }
        Ok(event)
    }

    /// Whether this join should record a join sample (at most one a second per process).
    pub fn take_sample(&self, event_id: &str, now_ms: i64) -> bool {
        let mut sampled = self.sampled.lock().expect("sample lock");
        match sampled.get_mut(event_id) {
            Some(last) if now_ms - *last < 1_000 => false,
            Some(last) => {
                *last = now_ms;
                true
            }
            None => {
                if sampled.len() >= MAX_ENTRIES {
                    sampled.clear();
                }
                sampled.insert(event_id.to_owned(), now_ms);
                true
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_join_sample_a_second_per_event() {
        let cache = EventCache::new(Duration::ZERO);
        assert!(cache.take_sample("a", 10_000));
        assert!(!cache.take_sample("a", 10_999));
        assert!(cache.take_sample("b", 10_999));
        assert!(cache.take_sample("a", 11_000));
    }
}
