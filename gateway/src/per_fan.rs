//! Per-fan rate limit on join, status and purchase, keyed by event and fan id
//! (from the verified token where there is one, from the body on join), so a
//! fan behind a shared address is not punished for its neighbours and one fan
//! cannot hammer the line from many addresses.

use std::hash::{BuildHasher, Hash};
use std::num::NonZeroU32;
use std::sync::{Arc, Weak};
use std::time::Duration;

use axum::http::StatusCode;
use boxoffice_contract::Problem;
use governor::clock::{Clock, DefaultClock};
use governor::middleware::RateLimitingMiddleware;
use governor::state::keyed::{DashMapStateStore, ShrinkableKeyedStateStore};
use governor::{Quota, RateLimiter};

pub struct PerFan {
    /// Names a fan (an event and a fan id) by a hash keyed for this process
    /// (SipHash, as std's maps): a number rather than a string, so a check
    /// allocates nothing and the map holds no pointer to follow. A client
    /// cannot aim two fans at one name without the process's key; two fans
    /// sharing one by chance, about one pair in 2^64, would share a quota.
    names: std::hash::RandomState,
    /// By name; the names are already well spread, so the map hashes them
    /// with `foldhash`.
    limiter:
        Arc<RateLimiter<u64, DashMapStateStore<u64, foldhash::fast::RandomState>, DefaultClock>>,
}

/// Shards of a rate limiter's map of keys (here fans; client addresses in
/// [`crate::edge`]). Each new key goes into the map, and a shard that
/// outgrows its table is rehashed whole, under its write lock, while every
/// request whose key falls in that shard waits. `dashmap`'s default is four
/// shards a core (8 here): a spike's million keys make shards of 125,000
/// and a wait of several milliseconds at each doubling. With 1,024, shards
/// hold about 1,000, each rehash and each step of the minute's sweep
/// (`retain_recent`, `shrink_to_fit`, shard by shard) is that much smaller.
/// An empty shard costs 128 bytes. `cargo bench -p gateway --bench
/// limiter_growth` measures the waits: with 2 million new keys, the longest
/// 11-15 ms with the default shards and 1.5-4.5 ms with these (32, 64 and
/// 256 shards waited longer there, or more often).
pub const LIMITER_SHARDS: usize = 1024;

/// An empty keyed limiter state in [`LIMITER_SHARDS`] shards.
pub fn keyed_state<K, S>() -> DashMapStateStore<K, S>
where
    K: std::hash::Hash + Eq + Clone,
    S: BuildHasher + Clone + Default,
{
    dashmap::DashMap::with_hasher_and_shard_amount(S::default(), LIMITER_SHARDS)
}

/// How often a limiter forgets its idle keys (see [`sweep`]).
pub const SWEEP_EVERY: Duration = Duration::from_secs(60);

/// Every `every`, from `every` on, forgets the keys of `limiter` whose quota
/// is full again (a key in that state limits as a key never seen), so its
/// memory follows the clients or fans of the last minute rather than every
/// one since the start. Ends once the limiter is dropped; outside a tokio
/// runtime, does nothing.
pub fn sweep<K, S, C, M>(limiter: &Arc<RateLimiter<K, S, C, M>>, every: Duration)
where
    K: Hash + Send + Sync + 'static,
    S: ShrinkableKeyedStateStore<K> + Send + Sync + 'static,
    C: Clock + Send + Sync + 'static,
    M: RateLimitingMiddleware<C::Instant> + Send + Sync + 'static,
{
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let limiter: Weak<RateLimiter<K, S, C, M>> = Arc::downgrade(limiter);
    runtime.spawn(async move {
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        loop {
            tick.tick().await;
            let Some(limiter) = limiter.upgrade() else {
                return;
            };
            limiter.retain_recent();
            limiter.shrink_to_fit();
        }
    });
}

impl PerFan {
    pub fn new(per_second: u32, burst: u32) -> Self {
        let quota = Quota::per_second(NonZeroU32::new(per_second.max(1)).expect("at least one"))
            .allow_burst(NonZeroU32::new(burst.max(1)).expect("at least one"));
        Self {
            names: std::hash::RandomState::new(),
            limiter: Arc::new(RateLimiter::new(
                quota,
                keyed_state(),
                DefaultClock::default(),
            )),
        }
    }

    /// Takes one request from the fan's quota, or says how long to wait.
    pub fn check(&self, event_id: &str, fan_id: &str) -> Result<(), Problem> {
        let name = self.names.hash_one((event_id, fan_id));
        self.limiter.check_key(&name).map_err(|not_until| {
            let wait = not_until.wait_time_from(DefaultClock::default().now());
            Problem::new(
                StatusCode::TOO_MANY_REQUESTS,
                "rate-limited",
                "too many requests for this fan; slow down",
            )
            .retry_after(wait.as_secs_f64().ceil() as u64)
        })
    }

    /// Forgets idle fans every `every` while this limit is in use (see [`sweep`]).
    pub fn sweep_every(&self, every: Duration) {
        sweep(&self.limiter, every);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The sweep forgets the keys whose quota is full again, keeps those
    /// still counting, and ends with its limiter.
    #[tokio::test(start_paused = true)]
    async fn the_sweep_forgets_idle_keys_and_ends_with_its_limiter() {
        // One request each 500 ms: a key's state is dropped once it is
        // older than the quota's whole period (governor keeps it another
        // period, so from a second after its check).
        let quota = Quota::with_period(Duration::from_millis(500)).unwrap();
        let limiter = Arc::new(RateLimiter::<u32, _, _>::new(
            quota,
            keyed_state::<u32, std::hash::RandomState>(),
            DefaultClock::default(),
        ));
        for key in 0..100 {
            assert!(limiter.check_key(&key).is_ok());
        }
        sweep(&limiter, Duration::from_secs(60));
        // Governor's clock is the real one; tokio's is paused.
        std::thread::sleep(Duration::from_millis(1_100));
        assert!(limiter.check_key(&7).is_ok(), "key 7 again, its quota full");
        tokio::time::sleep(Duration::from_secs(59)).await;
        assert_eq!(limiter.len(), 100, "no sweep before the first minute");
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(limiter.len(), 1, "only key 7, checked just now, is kept");
        let metrics = tokio::runtime::Handle::current().metrics();
        assert_eq!(metrics.num_alive_tasks(), 1, "the sweep runs");
        drop(limiter);
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert_eq!(metrics.num_alive_tasks(), 0, "and ends with its limiter");
    }

    #[test]
    fn each_fan_has_its_own_quota() {
        let limit = PerFan::new(1, 2);
        assert!(limit.check("ev", "a").is_ok());
        assert!(limit.check("ev", "a").is_ok());
        let refused = limit.check("ev", "a").unwrap_err();
        assert_eq!((refused.status, refused.slug()), (429, "rate-limited"));
        assert!(refused.retry_after.unwrap() >= 1);
        assert!(
            limit.check("ev", "b").is_ok(),
            "another fan is not affected"
        );
        assert!(
            limit.check("other", "a").is_ok(),
            "nor the same fan at another event"
        );
        assert!(
            limit.check("e", "va").is_ok(),
            "nor another event and fan whose ids run together the same"
        );
    }
}
