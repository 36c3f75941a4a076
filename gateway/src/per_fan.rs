//! Per-fan rate limit on join, status and purchase, keyed by event and fan id
//! (from the verified token where there is one, from the body on join), so a
//! fan behind a shared address is not punished for its neighbours and one fan
//! cannot hammer the line from many addresses.

use std::hash::{BuildHasher, Hash};
use std::num::NonZeroU32;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use axum::http::StatusCode;
use boxoffice_contract::Problem;
use governor::clock::{Clock, DefaultClock};
use governor::middleware::RateLimitingMiddleware;
use governor::nanos::Nanos;
use governor::state::keyed::{DashMapStateStore, ShrinkableKeyedStateStore};
use governor::state::StateStore;
use governor::{Quota, RateLimiter};
use portable_atomic::AtomicU128;

pub struct PerFan {
    /// Names a fan (an event and a fan id) by a hash keyed for this process
    /// (SipHash, as std's maps): a number rather than a string, so a check
    /// allocates nothing and the table holds no pointer to follow. A client
    /// cannot aim two fans at one name without the process's key; two fans
    /// sharing one by chance, about one pair in 2^64, would share a quota.
    names: std::hash::RandomState,
    /// By name, in a table of fixed size ([`FanTable`]).
    limiter: FanLimiter,
}

/// A rate limiter keyed by fan name over a [`FanTable`].
type FanLimiter = RateLimiter<u64, FanTable, DefaultClock>;

/// Ways of a [`FanSet`]: four fans' names and states fill one cache line.
const WAYS: usize = 4;

/// Sets of a [`FanTable`]: 262,144 fans' states in 4 MiB.
pub const FAN_SETS: usize = 1 << 16;

/// Four ways, each a fan's name (high 64 bits; 0: none) and its quota's
/// state (low 64 bits: `governor`'s theoretical arrival time, in its
/// clock's nanoseconds; 0: never checked), one atomic word each, so a
/// way's name and state change together.
#[repr(C, align(64))]
#[derive(Default)]
struct FanSet {
    ways: [AtomicU128; WAYS],
}

fn way(name: u64, tat: u64) -> u128 {
    (u128::from(name) << 64) | u128::from(tat)
}

fn name_of(way: u128) -> u64 {
    (way >> 64) as u64
}

fn tat_of(way: u128) -> u64 {
    way as u64
}

/// The per-fan limit's state, a `governor` state store of fixed size: a
/// fan's name picks a set of four ways in one cache line, and a check
/// reads the set and compare-and-swaps the fan's way, its name and state
/// together, with no lock (a 128-bit `cmpxchg16b` on x86-64, through
/// `portable-atomic`). `governor`'s map (`DashMap`) took a shard's lock and
/// three lines a check (the lock, the table's control bytes, the entry),
/// grew with every fan seen since its last sweep, and rehashed a shard
/// under its lock as it grew.
///
/// A fan new to a full set takes, by the same compare-and-swap, the way of
/// the fan whose state is oldest: the one that has waited longest since
/// its quota was last drawn on, whose state limits least. Forgetting it
/// gives that fan at most a fresh burst; a fan drawing hard on its quota
/// has the newest state and is forgotten last. A fan's state limits for
/// `1 / rate` after a lone request and at most `burst / rate` after a
/// burst (0.5 s and 5 s by default): at 20,000 requests a second to one
/// gateway, each from another fan, 10,000 to 100,000 states limit at once,
/// in 262,144 places, four a set: at 100,000, about one set in fifty holds
/// more than four and forgets one early (a fresh burst for that fan). Two
/// first requests of one fan racing for two ways of its set can leave it
/// in both, one request counted in the way no longer found; the stale way
/// is the oldest and goes first.
pub struct FanTable {
    sets: Box<[FanSet]>,
}

impl Default for FanTable {
    fn default() -> Self {
        Self {
            sets: (0..FAN_SETS).map(|_| FanSet::default()).collect(),
        }
    }
}

impl StateStore for FanTable {
    type Key = u64;

    fn measure_and_replace<T, F, E>(&self, key: &u64, f: F) -> Result<T, E>
    where
        F: Fn(Option<Nanos>) -> Result<(T, Nanos), E>,
    {
        // 0 marks an empty way: a fan so named is named 1 instead.
        let name = (*key).max(1);
        let set = &self.sets[(name % FAN_SETS as u64) as usize];
        loop {
            // The fan's way, else the way of the oldest state (an empty
            // way's is 0), taken over by the swap below.
            let ways: [u128; WAYS] = std::array::from_fn(|i| set.ways[i].load(Ordering::Acquire));
            let (index, previous) = match ways.iter().position(|&w| name_of(w) == name) {
                Some(index) => {
                    let tat = tat_of(ways[index]);
                    (index, (tat != 0).then(|| Nanos::from(tat)))
                }
                None => {
                    let oldest = (0..WAYS).min_by_key(|&i| tat_of(ways[i]));
                    (oldest.expect("a set has ways"), None)
                }
            };
            let (answer, next) = f(previous)?;
            // Never 0 (governor's step is at least 1 ns), so never "unchecked".
            let next = way(name, u64::from(next));
            // Fails if the way changed since it was read (this fan's other
            // check, or another fan taking it): read the set again.
            if set.ways[index]
                .compare_exchange(ways[index], next, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                return Ok(answer);
            }
        }
    }
}

/// Shards of a rate limiter's map of keys (the per-IP limit's client
/// addresses, in [`crate::edge`]; the per-fan limit keeps a [`FanTable`]).
/// Each new key goes into the map, and a shard that outgrows its table is
/// rehashed whole, under its write lock, while every request whose key
/// falls in that shard waits. `dashmap`'s default is four
/// shards a core (8 here): a spike's million keys make shards of 125,000
/// and a wait of several milliseconds at each doubling. With 1,024, shards
/// hold about 1,000, each rehash and each step of the sweep
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

/// How often a limiter forgets its idle keys (see [`sweep`]). A key back to
/// a full quota limits as a key never seen, so how often only sets how
/// many keys the map holds: a spike's new addresses of the last 5 s, not
/// of the last minute. A sweep walks every key, so it is that much
/// shorter, and a check finds a smaller map, more of it in the caches.
/// The sweeps' CPU over time is about the same: twelve times as many, each
/// over a twelfth of the keys. And tokio keeps an idle blocking thread
/// 10 s, so every sweep finds the last one's.
pub const SWEEP_EVERY: Duration = Duration::from_secs(5);

/// Every `every`, from `every` on, forgets the keys of `limiter` whose quota
/// is full again (a key in that state limits as a key never seen), so its
/// memory follows the clients or fans of the last `every` rather than every
/// one since the start. Ends once the limiter is dropped; outside a tokio
/// runtime, does nothing.
///
/// The sweep walks every key (tens of milliseconds for 2 million, a few
/// for 250,000), so it runs on tokio's blocking threads, where blocking
/// work belongs, rather than holding a worker that long: a gateway allowed
/// one CPU has one worker, and every request would wait for the sweep.
/// `cargo bench -p gateway --bench limiter_growth` measures the hold-up
/// both ways, on one and two workers (BENCHMARKS.md, "Limiters").
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
            // A panic in the sweep ends this one, not the next.
            let _ = tokio::task::spawn_blocking(move || {
                limiter.retain_recent();
                limiter.shrink_to_fit();
            })
            .await;
        }
    });
}

impl PerFan {
    pub fn new(per_second: u32, burst: u32) -> Self {
        let quota = Quota::per_second(NonZeroU32::new(per_second.max(1)).expect("at least one"))
            .allow_burst(NonZeroU32::new(burst.max(1)).expect("at least one"));
        Self {
            names: std::hash::RandomState::new(),
            limiter: FanLimiter::new(quota, FanTable::default(), DefaultClock::default()),
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

    /// A store whose sweep waits, on whichever thread runs it, until it is
    /// told to go on (or 2 s have passed); the first sweep says which.
    struct HeldSweep {
        started: tokio::sync::mpsc::UnboundedSender<()>,
        go: std::sync::Mutex<std::sync::mpsc::Receiver<()>>,
        went: Arc<std::sync::OnceLock<bool>>,
    }

    impl StateStore for HeldSweep {
        type Key = u32;

        fn measure_and_replace<T, F, E>(&self, _: &u32, f: F) -> Result<T, E>
        where
            F: Fn(Option<Nanos>) -> Result<(T, Nanos), E>,
        {
            f(None).map(|(answer, _)| answer)
        }
    }

    impl ShrinkableKeyedStateStore<u32> for HeldSweep {
        fn retain_recent(&self, _: Nanos) {
            let _ = self.started.send(());
            let go = self.go.lock().unwrap();
            let _ = self
                .went
                .set(go.recv_timeout(Duration::from_secs(2)).is_ok());
        }

        fn len(&self) -> usize {
            0
        }

        fn is_empty(&self) -> bool {
            true
        }
    }

    /// The sweep leaves the runtime's threads free while it walks the keys:
    /// on a runtime of one thread, a task still runs during it (here, the
    /// one that lets it finish). Run on that thread, the sweep would wait
    /// its 2 s for a task that could not run.
    #[tokio::test(flavor = "current_thread")]
    async fn the_sweep_runs_off_the_runtimes_threads() {
        let (started, mut sweeping) = tokio::sync::mpsc::unbounded_channel();
        let (go, wait) = std::sync::mpsc::channel();
        let went = Arc::new(std::sync::OnceLock::new());
        let store = HeldSweep {
            started,
            go: std::sync::Mutex::new(wait),
            went: went.clone(),
        };
        let quota = Quota::per_second(NonZeroU32::new(1).unwrap());
        let limiter = Arc::new(RateLimiter::<u32, _, _>::new(
            quota,
            store,
            DefaultClock::default(),
        ));
        sweep(&limiter, Duration::from_millis(10));
        sweeping.recv().await.expect("the sweep starts");
        go.send(()).expect("the sweep waits for it");
        for _ in 0..300 {
            if let Some(&went) = went.get() {
                assert!(
                    went,
                    "the sweep held the runtime's thread: the task could not answer it"
                );
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("the first sweep did not end");
    }

    /// Names of fans that share one set of the table.
    fn one_sets_names(count: u64) -> Vec<u64> {
        (1..=count).map(|i| 7 + i * FAN_SETS as u64).collect()
    }

    /// One request every hour, a burst of one: a fan's second request is
    /// refused while the table keeps its state.
    fn hourly() -> FanLimiter {
        let quota = Quota::with_period(Duration::from_secs(3_600)).unwrap();
        FanLimiter::new(quota, FanTable::default(), DefaultClock::default())
    }

    /// A fan new to a full set takes the place of the oldest state: the
    /// others' states are kept, the forgotten fan starts afresh.
    #[test]
    fn a_full_set_forgets_the_oldest_state_first() {
        let limiter = hourly();
        let names = one_sets_names(WAYS as u64 + 1);
        for name in &names[..WAYS] {
            assert!(limiter.check_key(name).is_ok());
            std::thread::sleep(Duration::from_millis(2));
        }
        for name in &names[..WAYS] {
            assert!(limiter.check_key(name).is_err(), "its state is kept");
        }
        // A fifth fan in the set: the first fan's state is the oldest.
        assert!(limiter.check_key(&names[WAYS]).is_ok());
        assert!(limiter.check_key(&names[WAYS]).is_err());
        for name in &names[1..WAYS] {
            assert!(limiter.check_key(name).is_err(), "still kept");
        }
        assert!(
            limiter.check_key(&names[0]).is_ok(),
            "the oldest was forgotten: a fresh quota"
        );
    }

    /// Checks of one fan from many threads at once draw on one quota: a
    /// burst of ten lets ten through, however they interleave.
    #[test]
    fn concurrent_checks_of_one_fan_share_its_quota() {
        let quota = Quota::with_period(Duration::from_secs(3_600))
            .unwrap()
            .allow_burst(NonZeroU32::new(10).unwrap());
        let limiter = FanLimiter::new(quota, FanTable::default(), DefaultClock::default());
        let passed = std::sync::atomic::AtomicU32::new(0);
        std::thread::scope(|threads| {
            for _ in 0..4 {
                threads.spawn(|| {
                    for _ in 0..1_000 {
                        if limiter.check_key(&42).is_ok() {
                            passed.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                });
            }
        });
        assert_eq!(passed.load(Ordering::Relaxed), 10);
    }

    /// The name 0 marks an empty way: a fan so named is still limited.
    #[test]
    fn a_fan_named_zero_is_limited_too() {
        let limiter = hourly();
        assert!(limiter.check_key(&0).is_ok());
        assert!(limiter.check_key(&0).is_err());
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
