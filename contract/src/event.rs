//! An event's settings as stored in `P:{E}:config`, written by the admission
//! service and read by the gateway, and the lifecycle state derived from them.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

/// `scheduled → prequeue → open ⇄ paused → (all_held ⇄) sold_out | closed`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum EventState {
    Scheduled,
    Prequeue,
    Open,
    Paused,
    /// No seat is free, but some are only held by fans still paying: a
    /// declined card or a lapsed hold gives them back, so the line stays.
    AllHeld,
    SoldOut,
    Closed,
}

/// The edge's view of an event's seats (`P:{E}:stock`), as the order
/// service publishes it: seats free, and seats held by orders still paying.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SeatView {
    /// `None` before the order service published a view.
    pub remaining: Option<i64>,
    pub held: i64,
}

impl SeatView {
    /// From the stock hash's `remaining` and `held` fields.
    pub fn new(remaining: Option<i64>, held: Option<i64>) -> Self {
        Self {
            remaining,
            held: held.unwrap_or(0),
        }
    }

    fn none_free(&self) -> bool {
        self.remaining.is_some_and(|r| r <= 0)
    }

    /// Every seat sold: final.
    pub fn sold_out(&self) -> bool {
        self.none_free() && self.held <= 0
    }

    /// No seat free, some held: seats may come back.
    pub fn all_held(&self) -> bool {
        self.none_free() && self.held > 0
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EventConfig {
    pub name: String,
    pub capacity: i64,
    pub prequeue_at_ms: i64,
    pub opens_at_ms: i64,
    pub admission_rate_per_s: f64,
    pub max_active: u64,
    pub access_ttl_s: u64,
    pub per_fan_limit: u32,
    pub max_queue: u64,
    pub price_cents: i64,
    pub paused: bool,
    pub closed: bool,
    /// Secret until `opens_at`, then published: orders the prequeue (see [`prequeue_score`]).
    pub shuffle_seed: String,
    /// When set, the admission leader moves the rate within these bounds from the pipeline's health.
    pub adaptive: Option<Adaptive>,
    /// Proof of work asked of each join: leading zero bits, 0 for none.
    pub pow_bits: u8,
    /// Who a fan is at this event.
    pub identity: Identity,
}

/// Who a fan is, per event.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Identity {
    /// The fan id the client sends (load tests, trusted kiosks): anyone who
    /// knows a fan's id can act as that fan, so an event is this only when
    /// its settings say so.
    Declared,
    /// The default: the gateway makes the fan's id on the first join and
    /// puts it only in the signed queue ticket; a repeat join keeps its
    /// place only with it.
    #[default]
    Anonymous,
    /// The join carries an identity token from the ticketing site's login
    /// (a JWT checked against the configured JWKS); its `sub` is the fan.
    Account,
}

impl Identity {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Declared => "declared",
            Self::Anonymous => "anonymous",
            Self::Account => "account",
        }
    }

    pub fn parse(value: &str) -> Option<Self> {
        match value {
            "declared" => Some(Self::Declared),
            // A hash without the field gets the default, never the mode in
            // which a client's word is its identity.
            "" | "anonymous" => Some(Self::Anonymous),
            "account" => Some(Self::Account),
            _ => None,
        }
    }
}

/// Adaptive admission: additive increase while the purchase pipeline is
/// healthy, multiplicative decrease when any signal crosses its threshold.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Adaptive {
    /// Lowest rate, greater than 0 and at most 100000; not above adaptive.ceiling.
    #[schema(exclusive_minimum = 0, maximum = 100_000)]
    pub floor: f64,
    /// Highest rate, greater than 0 and at most 100000.
    #[schema(exclusive_minimum = 0, maximum = 100_000)]
    pub ceiling: f64,
    /// The thresholds must be positive.
    #[serde(default = "Adaptive::default_latency")]
    #[schema(exclusive_minimum = 0)]
    pub max_order_latency_ms: f64,
    #[serde(default = "Adaptive::default_backlog")]
    #[schema(minimum = 0)]
    pub max_outbox_backlog: i64,
    #[serde(default = "Adaptive::default_lag")]
    #[schema(minimum = 0)]
    pub max_consumer_lag: i64,
}

impl Adaptive {
    fn default_latency() -> f64 {
        2_000.0
    }
    fn default_backlog() -> i64 {
        1_000
    }
    fn default_lag() -> i64 {
        5_000
    }
}

/// Scores at or above this are FIFO arrivals (`FIFO_BASE + join sequence`);
/// below it are prequeue fans, so every prequeue fan is ahead of every later one.
pub const FIFO_BASE: u64 = 1 << 48;

/// The place of a prequeue fan: the first 48 bits of SHA-1(`seed:fan_id`),
/// lower first (ties, vanishingly rare, go by fan id, as Redis orders them).
/// `join.lua` computes the same with `redis.sha1hex`; anyone holding the
/// published seed and the fan ids can recompute the order.
pub fn prequeue_score(seed: &str, fan_id: &str) -> u64 {
    use sha1::Digest;
    let digest = sha1::Sha1::digest(format!("{seed}:{fan_id}"));
    digest[..6]
        .iter()
        .fold(0u64, |acc, b| (acc << 8) | u64::from(*b))
}

/// The commitment published before the prequeue opens: hex SHA-256 of the seed.
pub fn seed_commitment(seed: &str) -> String {
    use sha2::Digest;
    hex(&sha2::Sha256::digest(seed.as_bytes()))
}

/// A fresh shuffle seed: 32 random bytes, hex.
pub fn new_seed() -> String {
    hex(&rand::random::<[u8; 32]>())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Defaults of the admin API for the settings a PUT may leave out.
pub mod defaults {
    pub const MAX_ACTIVE: u64 = 1_000;
    pub const ACCESS_TTL_S: u64 = 300;
    pub const PER_FAN_LIMIT: u32 = 4;
    pub const MAX_QUEUE: u64 = 5_000_000;
}

impl EventConfig {
    /// An event open since the epoch, with the admin API's defaults and a fresh seed.
    pub fn open(name: &str, capacity: i64, admission_rate_per_s: f64) -> Self {
        Self {
            name: name.to_owned(),
            capacity,
            prequeue_at_ms: 0,
            opens_at_ms: 0,
            admission_rate_per_s,
            max_active: defaults::MAX_ACTIVE,
            access_ttl_s: defaults::ACCESS_TTL_S,
            per_fan_limit: defaults::PER_FAN_LIMIT,
            max_queue: defaults::MAX_QUEUE,
            price_cents: 0,
            paused: false,
            closed: false,
            shuffle_seed: new_seed(),
            adaptive: None,
            pow_bits: 0,
            identity: Identity::default(),
        }
    }

    /// Field/value pairs for `HSET`; names match what the Lua scripts read.
    pub fn to_fields(&self) -> Vec<(&'static str, String)> {
        vec![
            ("name", self.name.clone()),
            ("capacity", self.capacity.to_string()),
            ("prequeue_at_ms", self.prequeue_at_ms.to_string()),
            ("opens_at_ms", self.opens_at_ms.to_string()),
            ("rate", self.admission_rate_per_s.to_string()),
            ("max_active", self.max_active.to_string()),
            ("access_ttl_s", self.access_ttl_s.to_string()),
            ("per_fan_limit", self.per_fan_limit.to_string()),
            ("max_queue", self.max_queue.to_string()),
            ("price_cents", self.price_cents.to_string()),
            ("paused", u8::from(self.paused).to_string()),
            ("state", if self.closed { "closed" } else { "" }.to_owned()),
            ("seed", self.shuffle_seed.clone()),
            (
                "adaptive",
                self.adaptive
                    .map(|a| serde_json::to_string(&a).expect("plain struct"))
                    .unwrap_or_default(),
            ),
            ("pow_bits", self.pow_bits.to_string()),
            ("identity", self.identity.as_str().to_owned()),
        ]
    }

    /// Parses an `HGETALL`; `None` when the event does not exist.
    pub fn from_fields(fields: &HashMap<String, String>) -> Option<Self> {
        let num = |name: &str| fields.get(name).and_then(|v| v.parse::<f64>().ok());
        Some(Self {
            name: fields.get("name")?.clone(),
            capacity: num("capacity")? as i64,
            prequeue_at_ms: num("prequeue_at_ms")? as i64,
            opens_at_ms: num("opens_at_ms")? as i64,
            admission_rate_per_s: num("rate")?,
            max_active: num("max_active")? as u64,
            access_ttl_s: num("access_ttl_s")? as u64,
            per_fan_limit: num("per_fan_limit")? as u32,
            max_queue: num("max_queue")? as u64,
            price_cents: num("price_cents").unwrap_or(0.0) as i64,
            paused: fields.get("paused").is_some_and(|v| v == "1"),
            closed: fields.get("state").is_some_and(|v| v == "closed"),
            shuffle_seed: fields.get("seed").cloned().unwrap_or_default(),
            adaptive: fields
                .get("adaptive")
                .and_then(|v| serde_json::from_str(v).ok()),
            pow_bits: num("pow_bits").unwrap_or(0.0) as u8,
            identity: Identity::parse(fields.get("identity").map_or("", String::as_str))?,
        })
    }

    /// The lifecycle state at `now_ms` given the edge view of remaining seats.
    pub fn state(&self, now_ms: i64, seats: SeatView) -> EventState {
        if self.closed {
            EventState::Closed
        } else if seats.sold_out() {
            EventState::SoldOut
        } else if seats.all_held() {
            EventState::AllHeld
        } else if now_ms < self.prequeue_at_ms {
            EventState::Scheduled
        } else if now_ms < self.opens_at_ms {
            EventState::Prequeue
        } else if self.paused {
            EventState::Paused
        } else {
            EventState::Open
        }
    }
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> EventConfig {
        EventConfig {
            name: "Rock".into(),
            capacity: 10,
            prequeue_at_ms: 1_000,
            opens_at_ms: 2_000,
            admission_rate_per_s: 2.5,
            max_active: 5,
            access_ttl_s: 60,
            per_fan_limit: 4,
            max_queue: 100,
            price_cents: 5000,
            paused: false,
            closed: false,
            shuffle_seed: "00ff".into(),
            adaptive: Some(Adaptive {
                floor: 1.0,
                ceiling: 9.5,
                max_order_latency_ms: 100.0,
                max_outbox_backlog: 5,
                max_consumer_lag: 7,
            }),
            pow_bits: 12,
            identity: Identity::Anonymous,
        }
    }

    #[test]
    fn fields_round_trip() {
        let fields = config()
            .to_fields()
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect();
        assert_eq!(EventConfig::from_fields(&fields), Some(config()));
        assert_eq!(EventConfig::from_fields(&HashMap::new()), None);
    }

    /// An event whose settings do not say how fans are named (a body without
    /// `identity`, a hash without the field) names them itself: a client's
    /// word is an identity only where the organiser chose it.
    #[test]
    fn an_event_is_anonymous_unless_its_settings_say_otherwise() {
        assert_eq!(Identity::default(), Identity::Anonymous);
        assert_eq!(EventConfig::open("x", 1, 1.0).identity, Identity::Anonymous);
        let mut fields: HashMap<String, String> = config()
            .to_fields()
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect();
        fields.insert("identity".into(), "declared".into());
        assert_eq!(
            EventConfig::from_fields(&fields).map(|c| c.identity),
            Some(Identity::Declared)
        );
        fields.remove("identity");
        assert_eq!(
            EventConfig::from_fields(&fields).map(|c| c.identity),
            Some(Identity::Anonymous)
        );
        fields.insert("identity".into(), "someone".into());
        assert_eq!(EventConfig::from_fields(&fields), None);
    }

    #[test]
    fn prequeue_scores_are_below_fifo_and_follow_the_seed() {
        let a = prequeue_score("seed-1", "fan-a");
        assert!(a < FIFO_BASE);
        assert_eq!(a, prequeue_score("seed-1", "fan-a"));
        assert_ne!(a, prequeue_score("seed-2", "fan-a"));
        // SHA-1("a:bc") starts 2d8be7b50c25.
        assert_eq!(prequeue_score("a", "bc"), 0x2d8b_e7b5_0c25);
    }

    #[test]
    fn the_commitment_is_sha256_of_the_seed() {
        assert_eq!(
            seed_commitment("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(new_seed().len(), 64);
    }

    #[test]
    fn lifecycle_follows_the_clock_the_flags_and_the_stock() {
        let mut c = config();
        let left = |n| SeatView::new(Some(n), Some(0));
        assert_eq!(c.state(500, left(10)), EventState::Scheduled);
        assert_eq!(c.state(1_500, left(10)), EventState::Prequeue);
        assert_eq!(c.state(2_000, left(10)), EventState::Open);
        assert_eq!(c.state(2_000, left(0)), EventState::SoldOut);
        assert_eq!(
            c.state(2_000, SeatView::new(Some(0), Some(3))),
            EventState::AllHeld,
            "seats only held may come back"
        );
        assert_eq!(
            c.state(2_000, SeatView::new(Some(0), None)),
            EventState::SoldOut,
            "a view without holds is final"
        );
        c.paused = true;
        assert_eq!(c.state(2_000, SeatView::default()), EventState::Paused);
        c.closed = true;
        assert_eq!(c.state(2_000, left(10)), EventState::Closed);
    }
}
