//! The Redis key layout. Every key of one event shares the hash tag `{EVENT}`,
//! so every script touching one event touches one Redis Cluster slot.
//!
//! | key | type | holds |
//! | --- | --- | --- |
//! | `P:events` | set | ids of the events the admission loop ticks |
//! | `P:{E}:config` | hash | the event's settings (name, rate, caps, times, state) |
//! | `P:{E}:queue` | sorted set | waiting fans, score = join sequence |
//! | `P:{E}:seq` | string | the join sequence counter |
//! | `P:{E}:active` | sorted set | admitted fans, score = admission expiry (ms) |
//! | `P:{E}:admit` | hash | admission state: carried fraction, last tick, admitted total |
//! | `P:{E}:lease` | string | id of the admission replica leading this event |
//! | `P:{E}:stock` | hash | edge view of remaining seats and its version |
//! | `P:{E}:jti:ID` | string | a spent access token (value: idempotency key and order id) |

/// Keys of one event under one prefix (`bo` in production, per test in tests).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventKeys {
    base: String,
}

impl EventKeys {
    pub fn new(prefix: &str, event_id: &str) -> Self {
        Self {
            base: format!("{prefix}:{{{event_id}}}"),
        }
    }

    fn key(&self, suffix: &str) -> String {
        format!("{}:{suffix}", self.base)
    }

    pub fn config(&self) -> String {
        self.key("config")
    }
    pub fn queue(&self) -> String {
        self.key("queue")
    }
    pub fn seq(&self) -> String {
        self.key("seq")
    }
    pub fn active(&self) -> String {
        self.key("active")
    }
    pub fn admit(&self) -> String {
        self.key("admit")
    }
    pub fn lease(&self) -> String {
        self.key("lease")
    }
    pub fn stock(&self) -> String {
        self.key("stock")
    }
    pub fn jti(&self, jti: &str) -> String {
        self.key(&format!("jti:{jti}"))
    }
}

/// The set of event ids the admission loop ticks.
pub fn events_key(prefix: &str) -> String {
    format!("{prefix}:events")
}

/// Whether an event id is safe inside a key and a URL: 1-64 of `[A-Za-z0-9_-]`.
/// Braces in particular would break the hash tag.
pub fn valid_event_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 64
        && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_of_an_event_carries_its_hash_tag() {
        let keys = EventKeys::new("bo", "rock-1");
        for key in [keys.config(), keys.queue(), keys.seq(), keys.active(), keys.admit(), keys.lease(), keys.stock(), keys.jti("x")] {
            assert!(key.starts_with("bo:{rock-1}:"), "{key}");
        }
    }

    #[test]
    fn event_ids_with_braces_or_spaces_are_refused() {
        assert!(valid_event_id("rock-2026_a"));
        for bad in ["", "a{b}", "a b", "a:b", &"x".repeat(65)] {
            assert!(!valid_event_id(bad), "{bad}");
        }
    }
}
