//! Per-fan rate limit on join, status and purchase, keyed by event and fan id
//! (from the verified token where there is one, from the body on join), so a
//! fan behind a shared address is not punished for its neighbours and one fan
//! cannot hammer the line from many addresses.

use std::hash::BuildHasher;
use std::num::NonZeroU32;
use std::time::Duration;

use axum::http::StatusCode;
use boxoffice_contract::Problem;
use governor::clock::{Clock, DefaultClock};
use governor::state::keyed::DashMapStateStore;
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
    limiter: RateLimiter<u64, DashMapStateStore<u64, foldhash::fast::RandomState>, DefaultClock>,
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

impl PerFan {
    pub fn new(per_second: u32, burst: u32) -> Self {
        let quota = Quota::per_second(NonZeroU32::new(per_second.max(1)).expect("at least one"))
            .allow_burst(NonZeroU32::new(burst.max(1)).expect("at least one"));
        Self {
            names: std::hash::RandomState::new(),
            limiter: RateLimiter::new(quota, keyed_state(), DefaultClock::default()),
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

    /// Forgets fans whose quota is full again, so memory follows the active fans.
    pub fn forget_idle(&self) {
        self.limiter.retain_recent();
        self.limiter.shrink_to_fit();
    }

    /// Forgets idle fans every `every` until the process ends.
    pub fn spawn_sweeper(self: std::sync::Arc<Self>, every: Duration) {
        tokio::spawn(async move {
            let mut ticker = tokio::time::interval(every);
            loop {
                ticker.tick().await;
                self.forget_idle();
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
