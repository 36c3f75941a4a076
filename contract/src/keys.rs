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
//! | `P:{E}:admits` | list | (time, admitted total) once a second, newest first: the admission rate over the last minute |
//! | `P:{E}:joins` | sorted set | (join sequence → time) once a second: how long the head of the line has waited |
//! | `P:{E}:lease` | string | id of the admission replica leading this event |
//! | `P:{E}:stock` | hash | edge view of remaining seats and its version |
//! | `P:{E}:jti:ID` | string | a spent access token (value: idempotency key and order id) |
//! | `P:{E}:held-over:FAN` | string | an admission renewed by a `seats-held` answer: its jti and its current expiry (ms), `JTI|EXPIRY` |

/// Keys of one event under one prefix (`bo` in production, per test in tests).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct EventKeys {
    base: String,
}

impl EventKeys {
    pub fn new(prefix: &str, event_id: &str) -> Self {
        Self {
            // `concat` rather than `format!`: sized once, no formatting
            // machinery (on every request at the edge).
            base: [prefix, ":{", event_id, "}"].concat(),
        }
    }

    fn key(&self, suffix: &str) -> String {
        [self.base.as_str(), ":", suffix].concat()
    }

    /// The key `suffix` as a command's argument, written in place.
    fn arg(&self, suffix: &'static str) -> KeyArg<'_> {
        KeyArg {
            base: &self.base,
            suffix,
        }
    }

    fn key_of(&self, kind: &str, id: &str) -> String {
        [self.base.as_str(), ":", kind, ":", id].concat()
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
    pub fn admits(&self) -> String {
        self.key("admits")
    }
    pub fn joins(&self) -> String {
        self.key("joins")
    }
    pub fn lease(&self) -> String {
        self.key("lease")
    }
    pub fn stock(&self) -> String {
        self.key("stock")
    }
    /// Held by the one admin write of the event in progress.
    pub fn write_lock(&self) -> String {
        self.key("write-lock")
    }
    pub fn jti(&self, jti: &str) -> String {
        self.key_of("jti", jti)
    }
    /// The fan's admission as renewed by a `seats-held` answer: `JTI|EXPIRY`,
    /// the admission's `jti` (made from its first expiry) and the expiry it
    /// was renewed to; see [`crate::token::admission_jti_of`].
    pub fn held_over(&self, fan_id: &str) -> String {
        self.key_of("held-over", fan_id)
    }
    /// A proof-of-work challenge already spent on an anonymous join.
    pub fn pow_used(&self, challenge: &str) -> String {
        self.key_of("pow", challenge)
    }

    /// [`Self::queue`] as a command's argument, written in place.
    pub fn queue_arg(&self) -> KeyArg<'_> {
        self.arg("queue")
    }
    /// [`Self::seq`] as a command's argument, written in place.
    pub fn seq_arg(&self) -> KeyArg<'_> {
        self.arg("seq")
    }
    /// [`Self::active`] as a command's argument, written in place.
    pub fn active_arg(&self) -> KeyArg<'_> {
        self.arg("active")
    }
    /// [`Self::joins`] as a command's argument, written in place.
    pub fn joins_arg(&self) -> KeyArg<'_> {
        self.arg("joins")
    }
}

/// One of an event's keys as a command's argument, written into the
/// command where it goes rather than made a `String` first and copied: the
/// join script's four keys and the status poll's one, on every request.
#[derive(Debug, Clone, Copy)]
pub struct KeyArg<'a> {
    base: &'a str,
    suffix: &'static str,
}

impl redis::ToRedisArgs for KeyArg<'_> {
    fn write_redis_args<W>(&self, out: &mut W)
    where
        W: ?Sized + redis::RedisWrite,
    {
        use std::io::Write;
        let mut arg = out.writer_for_next_arg();
        // Writes into the command's own buffer: they cannot fail.
        let _ = arg.write_all(self.base.as_bytes());
        let _ = arg.write_all(b":");
        let _ = arg.write_all(self.suffix.as_bytes());
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
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// The Redis Cluster slot of a key: CRC16 (XMODEM) of its hash tag, or of
/// the whole key when it has none, modulo 16384.
pub fn cluster_slot(key: &str) -> u16 {
    let bytes = key.as_bytes();
    let tagged = bytes.iter().position(|&b| b == b'{').and_then(|open| {
        let close = bytes[open + 1..].iter().position(|&b| b == b'}')?;
        (close > 0).then(|| &bytes[open + 1..open + 1 + close])
    });
    crc16(tagged.unwrap_or(bytes)) % 16384
}

fn crc16(data: &[u8]) -> u16 {
    data.iter().fold(0u16, |crc, &byte| {
        (0..8).fold(crc ^ (u16::from(byte) << 8), |crc, _| {
            if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            }
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A key written in place is the same argument as the key's `String`.
    #[test]
    fn keys_written_in_place_are_the_keys() {
        let keys = EventKeys::new("bo", "ev-1");
        for (in_place, key) in [
            (keys.queue_arg(), keys.queue()),
            (keys.seq_arg(), keys.seq()),
            (keys.active_arg(), keys.active()),
            (keys.joins_arg(), keys.joins()),
        ] {
            let mut written = redis::cmd("X");
            written.arg(in_place).arg(1);
            let mut made = redis::cmd("X");
            made.arg(&key).arg(1);
            assert_eq!(written.get_packed_command(), made.get_packed_command());
            assert_eq!(
                redis::ToRedisArgs::to_redis_args(&in_place),
                vec![key.into_bytes()]
            );
        }
    }

    #[test]
    fn cluster_slots_match_redis() {
        // Values from CLUSTER KEYSLOT on a Redis Cluster.
        assert_eq!(cluster_slot("foo"), 12182);
        assert_eq!(cluster_slot("somekey"), 11058);
        assert_eq!(
            cluster_slot("{user1000}.following"),
            cluster_slot("user1000")
        );
        assert_eq!(
            cluster_slot("foo{}{bar}"),
            crc16(b"foo{}{bar}") % 16384,
            "an empty tag hashes the whole key"
        );
    }

    /// Every script gets only keys of one event, and these are all of them:
    /// one slot per event, so each script runs on one Redis Cluster node.
    #[test]
    fn every_key_a_script_touches_shares_one_slot() {
        for event in ["rock-2026", "a", "Z_9"] {
            let keys = EventKeys::new("bo", event);
            let all = [
                keys.config(),
                keys.queue(),
                keys.seq(),
                keys.active(),
                keys.admit(),
                keys.admits(),
                keys.joins(),
                keys.lease(),
                keys.stock(),
                keys.jti("x"),
                keys.held_over("fan-{1}"),
            ];
            let slot = cluster_slot(&all[0]);
            for key in &all {
                assert_eq!(cluster_slot(key), slot, "{key}");
            }
        }
        assert_ne!(
            cluster_slot(&EventKeys::new("bo", "a").queue()),
            cluster_slot(&EventKeys::new("bo", "b").queue())
        );
    }

    #[test]
    fn every_key_of_an_event_carries_its_hash_tag() {
        let keys = EventKeys::new("bo", "rock-1");
        for key in [
            keys.config(),
            keys.queue(),
            keys.seq(),
            keys.active(),
            keys.admit(),
            keys.lease(),
            keys.stock(),
            keys.write_lock(),
            keys.jti("x"),
            keys.held_over("fan-1"),
        ] {
            assert!(key.starts_with("bo:{rock-1}:"), "{key}");
        }
    }

    /// The names are the layout of the table above, which operators and the
    /// other services read by hand.
    #[test]
    fn keys_are_named_as_the_layout_says() {
        let keys = EventKeys::new("bo", "rock-1");
        assert_eq!(keys.config(), "bo:{rock-1}:config");
        assert_eq!(keys.queue(), "bo:{rock-1}:queue");
        assert_eq!(keys.active(), "bo:{rock-1}:active");
        assert_eq!(keys.jti("j-9"), "bo:{rock-1}:jti:j-9");
        assert_eq!(keys.held_over("fan-1"), "bo:{rock-1}:held-over:fan-1");
        assert_eq!(keys.pow_used("c0ffee"), "bo:{rock-1}:pow:c0ffee");
        assert_eq!(events_key("bo"), "bo:events");
    }

    #[test]
    fn event_ids_with_braces_or_spaces_are_refused() {
        assert!(valid_event_id("rock-2026_a"));
        for bad in ["", "a{b}", "a b", "a:b", &"x".repeat(65)] {
            assert!(!valid_event_id(bad), "{bad}");
        }
    }
}
