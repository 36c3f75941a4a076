//! Failed admin-token attempts, per client: after `max_failures` wrong or
//! missing tokens within `window`, every admin request of that client gets
//! 429 until the window ends, the right token included, so a guesser learns
//! nothing more. IPv6 clients are counted per /64 (one host has a whole one).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// More clients than this and windows that have ended are forgotten.
const PRUNE_ABOVE: usize = 10_000;

pub struct Lockout {
    max_failures: u32,
    window: Duration,
    clients: Mutex<HashMap<IpAddr, Window>>,
}

#[derive(Clone, Copy)]
struct Window {
    started: Instant,
    failures: u32,
}

/// The key of a client: its IPv4 address, or its IPv6 /64.
pub fn client_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let bits = u128::from(v6) & !((1u128 << 64) - 1);
                IpAddr::V6(bits.into())
            }
        },
    }
}

impl Lockout {
    pub fn new(max_failures: u32, window: Duration) -> Self {
        Self {
            max_failures: max_failures.max(1),
            window,
            clients: Mutex::default(),
        }
    }

    /// How long the client stays locked out, if it is.
    pub fn locked(&self, ip: IpAddr, now: Instant) -> Option<Duration> {
        let clients = self.clients.lock().expect("lockout lock");
        let window = clients.get(&client_key(ip))?;
        let left = self
            .window
            .checked_sub(now.duration_since(window.started))?;
        (window.failures >= self.max_failures && !left.is_zero()).then_some(left)
    }

    /// The client sent the right token: its failures are forgotten.
    pub fn succeeded(&self, ip: IpAddr) {
        self.clients
            .lock()
            .expect("lockout lock")
            .remove(&client_key(ip));
    }

    /// Counts a failed attempt.
    pub fn failed(&self, ip: IpAddr, now: Instant) {
        let mut clients = self.clients.lock().expect("lockout lock");
        if clients.len() > PRUNE_ABOVE {
            clients.retain(|_, w| now.duration_since(w.started) < self.window);
        }
        let window = clients.entry(client_key(ip)).or_insert(Window {
            started: now,
            failures: 0,
        });
        if now.duration_since(window.started) >= self.window {
            *window = Window {
                started: now,
                failures: 0,
            };
        }
        window.failures += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_is_locked_after_the_failures_until_its_window_ends() {
        let lockout = Lockout::new(3, Duration::from_secs(60));
        let (a, b): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let t0 = Instant::now();
        for _ in 0..2 {
            lockout.failed(a, t0);
        }
        assert_eq!(lockout.locked(a, t0), None, "two failures of three allowed");
        lockout.succeeded(a);
        for _ in 0..2 {
            lockout.failed(a, t0);
        }
        assert_eq!(
            lockout.locked(a, t0),
            None,
            "the right token reset the count"
        );
        lockout.failed(a, t0);
        assert_eq!(lockout.locked(a, t0), Some(Duration::from_secs(60)));
        assert_eq!(lockout.locked(b, t0), None, "another client is not locked");
        let later = t0 + Duration::from_secs(45);
        assert_eq!(lockout.locked(a, later), Some(Duration::from_secs(15)));
        assert_eq!(lockout.locked(a, t0 + Duration::from_secs(60)), None);
        lockout.failed(a, t0 + Duration::from_secs(61));
        assert_eq!(
            lockout.locked(a, t0 + Duration::from_secs(61)),
            None,
            "a new window"
        );
    }

    #[test]
    fn ipv6_clients_are_counted_per_64() {
        let lockout = Lockout::new(2, Duration::from_secs(60));
        let t0 = Instant::now();
        lockout.failed("2001:db8:1:2::1".parse().unwrap(), t0);
        lockout.failed("2001:db8:1:2:ffff::9".parse().unwrap(), t0);
        assert!(lockout
            .locked("2001:db8:1:2::77".parse().unwrap(), t0)
            .is_some());
        assert!(lockout
            .locked("2001:db8:1:3::1".parse().unwrap(), t0)
            .is_none());
        assert_eq!(
            client_key("::ffff:10.1.2.3".parse().unwrap()),
            "10.1.2.3".parse::<IpAddr>().unwrap()
        );
    }
}
