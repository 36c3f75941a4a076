//! What a request waits for while the rate limiters' maps grow: one thread
//! puts a spike's new keys (client addresses) into a keyed limiter, as the
//! per-IP limit does for every new client address (the per-fan limit keeps
//! a table of fixed size, `gateway::per_fan::FanTable`), then runs the
//! minute's sweep (`retain_recent`, `shrink_to_fit`); another thread checks
//! keys already known, as the rest of the crowd's requests do, and records
//! how long each check took. With `dashmap`'s default shards against the
//! gateway's ([`gateway::per_fan::LIMITER_SHARDS`]), in the same run.
//!
//! `cargo bench -p gateway --bench limiter_growth`; BENCH_KEYS (default
//! 2000000) new keys.

use std::net::{IpAddr, Ipv4Addr};
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

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

fn main() {
    let keys: u32 = std::env::var("BENCH_KEYS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2_000_000);
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
}
