//! A short-lived, per-process copy of each event's settings and stock view.
//!
//! The status poll and the join are the hottest paths; reading the event's
//! settings from Redis on each would double their Redis work for values that
//! change a few times a sale. Entries live `ttl` (100 ms by default, one
//! admission tick), so a PATCH or a sell-out reaches the edge within a tick
//! and the one round trip that reads it again. Purchases never rely on this
//! copy: `spend.lua` re-checks the stock in Redis.
//!
//! When an entry lapses, one request reads the event again while the others
//! answer from the lapsed copy meanwhile (for at most another `ttl`): without
//! that, every request arriving in the round trip's time read it too, a herd
//! of reads each tick at a crowd's rate.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
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

/// An event as read, when, and whether a request is reading it again.
struct Entry {
    at: Instant,
    /// `None`: no such event.
    event: Option<Arc<EdgeEvent>>,
    /// Set by the one request reading the event again once the entry has
    /// lapsed; cleared when that request ends, whether it read it or not.
    rereading: Arc<AtomicBool>,
}

/// Entries by event id, hashed by `foldhash` with a key drawn at random
/// (std's SipHash cost about 100 instructions more a status poll and 250 a
/// join, in callgrind). The ids may be made up by clients (an unknown
/// event's entry says so): hence the random key, and the bound on entries.
/// The join samples' map is keyed the same way.
type Entries = HashMap<String, Entry, foldhash::quality::RandomState>;

pub struct EventCache {
    ttl: Duration,
    entries: RwLock<Entries>,
    /// Reads of an event from Redis (for the tests).
    reads: AtomicU64,
    /// When this process last recorded a (sequence, time) join sample, per event.
    sampled: Mutex<HashMap<String, i64, foldhash::quality::RandomState>>,
}

/// Clears an entry's `rereading` when its request ends, even if the read
/// failed or the request was dropped in its round trip.
struct Rereading(Arc<AtomicBool>);

impl Drop for Rereading {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

impl EventCache {
    pub fn new(ttl: Duration) -> Self {
        Self {
            ttl,
            entries: RwLock::default(),
            reads: AtomicU64::new(0),
            sampled: Mutex::default(),
        }
    }

    /// The event, from memory if fresh, else from Redis (one round trip);
    /// `None` for an event that does not exist. Once the copy has lapsed,
    /// the first request reads it again and the others answer from the
    /// lapsed copy until it has, or until it is two `ttl`s old.
    pub async fn get(
        &self,
        redis: &RedisLink,
        keys: &EventKeys,
        event_id: &str,
    ) -> redis::RedisResult<Option<Arc<EdgeEvent>>> {
        let _rereading = match self.entries.read().expect("cache lock").get(event_id) {
            Some(entry) => {
                let age = entry.at.elapsed();
                if age < self.ttl {
                    return Ok(entry.event.clone());
                }
                if age >= 2 * self.ttl {
                    // Reading it again takes long (Redis is slow or away):
                    // no older copy is given out; each request reads it.
                    None
                } else if entry.rereading.swap(true, Ordering::AcqRel) {
                    return Ok(entry.event.clone());
                } else {
                    Some(Rereading(entry.rereading.clone()))
                }
            }
            None => None,
        };
        self.reads.fetch_add(1, Ordering::Relaxed);
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
            entries.insert(
                event_id.to_owned(),
                Entry {
                    at: Instant::now(),
                    event: event.clone(),
                    rereading: Arc::default(),
                },
            );
        }
        Ok(event)
    }

    /// How many times an event was read from Redis.
    pub fn reads(&self) -> u64 {
        self.reads.load(Ordering::Relaxed)
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
    use futures_util::FutureExt;
    use redis::AsyncCommands;

    use super::*;

    /// An event under a fresh prefix on the local Redis (`REDIS_URL`),
    /// admitting `rate` fans a second.
    async fn event(rate: f64) -> (RedisLink, EventKeys) {
        let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
        let redis = boxoffice_contract::redis_link::connect(&url).await.unwrap();
        let keys = EventKeys::new(&format!("cache{}", uuid::Uuid::new_v4().simple()), "ev");
        set_rate(&redis, &keys, rate).await;
        (redis, keys)
    }

    async fn set_rate(redis: &RedisLink, keys: &EventKeys, rate: f64) {
        let mut redis = redis.clone();
        let _: () = redis
            .hset_multiple(
                keys.config(),
                &EventConfig::open("Cached", 100, rate).to_fields(),
            )
            .await
            .unwrap();
    }

    async fn rate(cache: &EventCache, redis: &RedisLink, keys: &EventKeys) -> f64 {
        let event = cache.get(redis, keys, "ev").await.unwrap();
        event.expect("the event exists").config.admission_rate_per_s
    }

    async fn forget(redis: &RedisLink, keys: &EventKeys) {
        let _: () = redis.clone().del(keys.config()).await.unwrap();
    }

    /// Once the copy lapses, the requests that come while it is read again
    /// answer from it: one read, not one each.
    #[tokio::test]
    async fn a_lapsed_event_is_read_again_once_while_a_crowd_asks() {
        let (redis, keys) = event(5.0).await;
        let cache = EventCache::new(Duration::from_millis(300));
        assert_eq!(rate(&cache, &redis, &keys).await, 5.0);
        assert_eq!(cache.reads(), 1);
        set_rate(&redis, &keys, 7.0).await;
        tokio::time::sleep(Duration::from_millis(350)).await;
        // Each asks before any read has come back (one thread, polled in turn).
        let crowd =
            futures_util::future::join_all((0..50).map(|_| rate(&cache, &redis, &keys))).await;
        assert_eq!(cache.reads(), 2, "one read for the crowd");
        assert_eq!(crowd[0], 7.0, "the first reads it again");
        assert!(
            crowd[1..].iter().all(|&r| r == 5.0),
            "the rest answer from the copy"
        );
        assert_eq!(rate(&cache, &redis, &keys).await, 7.0);
        assert_eq!(cache.reads(), 2);
        forget(&redis, &keys).await;
    }

    /// A request dropped in the middle of reading the event again (its
    /// client went away) leaves the read to the next request.
    #[tokio::test]
    async fn a_read_dropped_half_way_leaves_it_to_the_next_request() {
        let (redis, keys) = event(5.0).await;
        let cache = EventCache::new(Duration::from_millis(300));
        assert_eq!(rate(&cache, &redis, &keys).await, 5.0);
        set_rate(&redis, &keys, 7.0).await;
        tokio::time::sleep(Duration::from_millis(350)).await;
        assert!(
            rate(&cache, &redis, &keys).now_or_never().is_none(),
            "polled once, the read is in flight"
        );
        assert_eq!(cache.reads(), 2);
        assert_eq!(rate(&cache, &redis, &keys).await, 7.0);
        assert_eq!(cache.reads(), 3);
        forget(&redis, &keys).await;
    }

    /// A copy two lifetimes old is not given out while it is read again:
    /// each request waits for Redis.
    #[tokio::test]
    async fn a_copy_two_lifetimes_old_is_not_given_out() {
        let (redis, keys) = event(5.0).await;
        let cache = EventCache::new(Duration::from_millis(150));
        assert_eq!(rate(&cache, &redis, &keys).await, 5.0);
        set_rate(&redis, &keys, 7.0).await;
        tokio::time::sleep(Duration::from_millis(320)).await;
        let crowd =
            futures_util::future::join_all((0..5).map(|_| rate(&cache, &redis, &keys))).await;
        assert_eq!(crowd, vec![7.0; 5]);
        assert_eq!(cache.reads(), 6);
        forget(&redis, &keys).await;
    }

    #[test]
    fn one_join_sample_a_second_per_event() {
        let cache = EventCache::new(Duration::ZERO);
        assert!(cache.take_sample("a", 10_000));
        assert!(!cache.take_sample("a", 10_999));
        assert!(cache.take_sample("b", 10_999));
        assert!(cache.take_sample("a", 11_000));
    }
}
