//! What a request waits for while the rate limiters' maps grow: one thread
//! puts a spike's new keys (client addresses) into a keyed limiter, as the
//! per-IP limit does for every new client address (the per-fan limit keeps
//! a table of fixed size, `gateway::per_fan::FanTable`), then runs the
//! sweep (`retain_recent`, `shrink_to_fit`); another thread checks
//! keys already known, as the rest of the crowd's requests do, and records
//! how long each check took. With `dashmap`'s default shards against the
//! gateway's ([`gateway::per_fan::LIMITER_SHARDS`]), in the same run.
//!
//! Then what one check costs, on one thread: a new key's and a known key's,
//! in the per-IP limit's map as the gateway makes it, against the per-fan
//! limit's fixed table with the address hashed to a name as the per-fan
//! limit hashes a fan (what a per-IP limit over that table would do). The
//! same keys in the same order for both, made before the clock starts (the
//! table holds 262,144 fans: past that, a known key is mostly one it has
//! forgotten, and costs it what a new one does).
//!
//! Last, what the sweep holds up on the runtime: 64 tasks, each waking
//! every millisecond and then working `BENCH_PROBE_WORK_US` (default 20)
//! µs, as requests would, on runtimes of `BENCH_WORKERS` (default `1,2`)
//! workers, with no sweep (the probes' own floor), with the sweep of
//! BENCH_KEYS idle keys on a worker, as the gateway ran it, and with it on
//! tokio's blocking threads through [`gateway::per_fan::sweep`], as it runs
//! it now: how late the latest wake came, and how long the sweep took (on
//! the blocking threads, from asking for it until the map is seen empty,
//! looked at every millisecond: up to 2 ms more than the sweep). A
//! runtime of one worker is what tokio starts for a gateway allowed one
//! CPU; here its blocking thread may still run on the machine's other
//! core, unless the bench runs under `taskset -c 0`.
//!
//! `cargo bench -p gateway --bench limiter_growth`; BENCH_KEYS (default
//! 2000000) new keys.

#[path = "common/env.rs"]
mod env;

use std::hash::BuildHasher;
use std::net::{IpAddr, Ipv4Addr};
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use env::env_or;
use gateway::per_fan::FanTable;
use governor::clock::DefaultClock;
use governor::state::keyed::DefaultKeyedStateStore;
use governor::{Quota, RateLimiter};

type Limiter = RateLimiter<IpAddr, DefaultKeyedStateStore<IpAddr>, DefaultClock>;

/// An address in 127.0.0.0/8 for each `i` (a bijection on the low 24 bits).
fn address(i: u32) -> IpAddr {
    let mixed = i.wrapping_mul(0x9E37_79B1) & 0x00ff_ffff;
    IpAddr::V4(Ipv4Addr::from(0x7f00_0000 | mixed))
}

/// The known keys' checks while `keys` new ones come in and then the sweep:
/// (checks, the longest, checks over 1 ms, over 0.1 ms; the sweep's time).
fn run(limiter: Limiter, keys: u32) -> (usize, Duration, usize, usize, Duration) {
    let limiter = Arc::new(limiter);
    let known = 10_000;
    for i in 0..known {
        let _ = limiter.check_key(&address(i));
    }
    let done = Arc::new(AtomicBool::new(false));
    let checker = std::thread::spawn({
        let (limiter, done) = (limiter.clone(), done.clone());
        move || {
            let mut waits = Vec::new();
            let mut i = 0;
            while !done.load(Ordering::Relaxed) {
                let started = Instant::now();
                let _ = limiter.check_key(&address(i % known));
                waits.push(started.elapsed());
                i += 1;
            }
            waits
        }
    });
    for i in known..known + keys {
        let _ = limiter.check_key(&address(i));
    }
    let started = Instant::now();
    limiter.retain_recent();
    limiter.shrink_to_fit();
    let sweep = started.elapsed();
    done.store(true, Ordering::Relaxed);
    let waits = checker.join().unwrap();
    let longest = waits.iter().max().copied().unwrap_or_default();
    let over = |limit: Duration| waits.iter().filter(|w| **w > limit).count();
    (
        waits.len(),
        longest,
        over(Duration::from_millis(1)),
        over(Duration::from_micros(100)),
        sweep,
    )
}

/// Nanoseconds a check, over `keys`: each new, then each again (known), in
/// the order given; `check` takes one key's quota.
fn cost_of_checks(keys: &[IpAddr], check: impl Fn(&IpAddr)) -> (f64, f64) {
    let per_check = |started: Instant| started.elapsed().as_nanos() as f64 / keys.len() as f64;
    let started = Instant::now();
    keys.iter().for_each(&check);
    let new = per_check(started);
    let started = Instant::now();
    keys.iter().for_each(&check);
    (new, per_check(started))
}

/// One check's cost in the per-IP map and in the fixed table, `rounds`
/// times each, alternating, each on a limiter of its own.
fn check_costs(quota: Quota, keys: u32, rounds: usize) {
    let addresses: Vec<IpAddr> = (0..keys).map(address).collect();
    let names = std::hash::RandomState::new();
    let mut map = Vec::new();
    let mut table = Vec::new();
    for _ in 0..rounds {
        let limiter: Limiter = RateLimiter::new(
            quota,
            gateway::per_fan::keyed_state(),
            DefaultClock::default(),
        );
        map.push(cost_of_checks(&addresses, |ip| {
            let _ = limiter.check_key(ip);
        }));
        drop(limiter);
        let limiter = RateLimiter::<u64, FanTable, DefaultClock>::new(
            quota,
            FanTable::default(),
            DefaultClock::default(),
        );
        table.push(cost_of_checks(&addresses, |ip| {
            let _ = limiter.check_key(&names.hash_one(ip));
        }));
    }
    let median = |costs: &[(f64, f64)], pick: fn(&(f64, f64)) -> f64| {
        let mut values: Vec<f64> = costs.iter().map(pick).collect();
        values.sort_by(f64::total_cmp);
        values[values.len() / 2]
    };
    let rounds_of = |costs: &[(f64, f64)], pick: fn(&(f64, f64)) -> f64| {
        costs
            .iter()
            .map(|c| format!("{:.0}", pick(c)))
            .collect::<Vec<_>>()
            .join(" ")
    };
    println!(
        "\none check's cost, ns, {keys} keys new then known (1 thread; median of {rounds} rounds, each round's in brackets)"
    );
    println!("{:<50} {:>22} {:>22}", "limiter", "new key", "known key");
    let new = |c: &(f64, f64)| c.0;
    let known = |c: &(f64, f64)| c.1;
    for (name, costs) in [
        ("per-IP map (the gateway's, IpAddr keys)", &map),
        ("fixed table (the per-fan limit's), hashed address", &table),
    ] {
        println!(
            "{name:<50} {:>6.0} ({:>13}) {:>6.0} ({:>13})",
            median(costs, new),
            rounds_of(costs, new),
            median(costs, known),
            rounds_of(costs, known)
        );
    }
    println!(
        "the map over the table: {:.0} ns more a new key, {:.0} ns more a known key",
        median(&map, new) - median(&table, new),
        median(&map, known) - median(&table, known)
    );
}

/// Where the sweep runs in [`sweep_hold_up`].
#[derive(Clone, Copy, Debug)]
enum SweptOn {
    /// Nowhere: the probes' own floor.
    NoSweep,
    /// In a task, on a worker.
    Worker,
    /// By `gateway::per_fan::sweep`.
    BlockingThreads,
}

/// The probing tasks' latest wake over a window holding one sweep of
/// `keys` idle keys run where `on` says, on a runtime of `workers`; how
/// many wakes there were; and how long the sweep took.
fn sweep_hold_up(
    keys: u32,
    workers: usize,
    work: Duration,
    on: SweptOn,
) -> (Duration, u64, Duration) {
    const TASKS: usize = 64;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        // Idle 1 ms after its check: every key is swept.
        let quota = Quota::with_period(Duration::from_millis(1)).unwrap();
        let limiter: Arc<Limiter> = Arc::new(RateLimiter::new(
            quota,
            gateway::per_fan::keyed_state(),
            DefaultClock::default(),
        ));
        for i in 0..keys {
            let _ = limiter.check_key(&address(i));
        }
        let done = Arc::new(AtomicBool::new(false));
        let probes: Vec<_> = (0..TASKS)
            .map(|_| {
                let done = done.clone();
                tokio::spawn(async move {
                    let (mut latest, mut wakes) = (Duration::ZERO, 0u64);
                    while !done.load(Ordering::Relaxed) {
                        let asleep = Instant::now();
                        tokio::time::sleep(Duration::from_millis(1)).await;
                        let late = asleep.elapsed().saturating_sub(Duration::from_millis(1));
                        latest = latest.max(late);
                        wakes += 1;
                        let working = Instant::now();
                        while working.elapsed() < work {
                            std::hint::spin_loop();
                        }
                    }
                    (latest, wakes)
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(200)).await;
        let started = Instant::now();
        match on {
            SweptOn::NoSweep => {}
            SweptOn::Worker => {
                let limiter = limiter.clone();
                tokio::spawn(async move {
                    limiter.retain_recent();
                    limiter.shrink_to_fit();
                })
                .await
                .unwrap();
            }
            SweptOn::BlockingThreads => {
                // Its first sweep 1 ms from now; the later ones, every
                // millisecond while the window lasts, find the map empty.
                gateway::per_fan::sweep(&limiter, Duration::from_millis(1));
                while !limiter.is_empty() {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            }
        }
        let swept = started.elapsed();
        tokio::time::sleep(Duration::from_millis(200)).await;
        done.store(true, Ordering::Relaxed);
        let mut latest = Duration::ZERO;
        let mut wakes = 0;
        for probe in probes {
            let (late, woke) = probe.await.unwrap();
            latest = latest.max(late);
            wakes += woke;
        }
        (latest, wakes, swept)
    })
}

/// The sweep's hold-up table: for each count of workers in
/// `BENCH_WORKERS` (default `1,2`), three rounds of no sweep, the sweep on
/// a worker and on the blocking threads, in turn.
fn sweep_hold_ups(keys: u32) {
    let work = Duration::from_micros(env_or("BENCH_PROBE_WORK_US", 20));
    let workers: Vec<usize> = std::env::var("BENCH_WORKERS")
        .unwrap_or_else(|_| "1,2".to_owned())
        .split(',')
        .map(|w| {
            w.trim()
                .parse()
                .expect("BENCH_WORKERS: counts of workers, comma-separated")
        })
        .collect();
    println!(
        "\nthe sweep of {keys} idle keys while 64 tasks wake every 1 ms and work {} µs (3 rounds, in turn)",
        work.as_micros()
    );
    println!(
        "{:>7}  {:<42} {:>16} {:>10} {:>9}",
        "workers", "sweep run", "latest wake ms", "wakes", "sweep ms"
    );
    for &workers in &workers {
        for _ in 0..3 {
            for (name, on) in [
                ("no sweep", SweptOn::NoSweep),
                ("in a task, on a worker", SweptOn::Worker),
                (
                    "on the blocking threads (per_fan::sweep)",
                    SweptOn::BlockingThreads,
                ),
            ] {
                let (latest, wakes, swept) = sweep_hold_up(keys, workers, work, on);
                println!(
                    "{workers:>7}  {name:<42} {:>16.2} {wakes:>10} {:>9.1}",
                    latest.as_secs_f64() * 1e3,
                    swept.as_secs_f64() * 1e3
                );
            }
        }
    }
}

fn main() {
    let keys: u32 = env_or("BENCH_KEYS", 2_000_000);
    let quota =
        Quota::per_second(NonZeroU32::new(10).unwrap()).allow_burst(NonZeroU32::new(20).unwrap());
    println!("\nknown keys checked while {keys} new keys come in, then the sweep (2 threads)");
    println!(
        "{:<34} {:>10} {:>12} {:>9} {:>11} {:>10}",
        "limiter map", "checks", "longest ms", "> 1 ms", "> 0.1 ms", "sweep ms"
    );
    let default = run(RateLimiter::keyed(quota), keys);
    let ours = run(
        RateLimiter::new(
            quota,
            gateway::per_fan::keyed_state(),
            DefaultClock::default(),
        ),
        keys,
    );
    for (name, (checks, longest, over_1, over_01, sweep)) in [
        ("dashmap's default shards".to_owned(), default),
        (
            format!(
                "{} shards (the gateway's)",
                gateway::per_fan::LIMITER_SHARDS
            ),
            ours,
        ),
    ] {
        println!(
            "{name:<34} {checks:>10} {:>12.2} {over_1:>9} {over_01:>11} {:>10.1}",
            longest.as_secs_f64() * 1e3,
            sweep.as_secs_f64() * 1e3
        );
    }
    println!(
        "longest wait: {:.1}x shorter with the gateway's shards",
        default.1.as_secs_f64() / ours.1.as_secs_f64()
    );
    check_costs(quota, keys, 3);
    sweep_hold_ups(keys);
}
