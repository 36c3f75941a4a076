//! How every service connects to Redis: one multiplexed connection that
//! reconnects on its own, quickly.
//!
//! redis-rs's defaults are wrong for a service that must come back when
//! Redis does: its reconnect backoff starts at 1 s and multiplies by 100, so
//! after a Redis restart the second attempt waits a minute (measured: the
//! gateway answered nothing for 110 s after a 2 s Redis restart), and no
//! command or connection attempt ever times out, so a request can hang on a
//! server that does not answer. Here: attempts at most a second apart, each
//! bounded, and every command answered or failed within
//! [`RESPONSE_TIMEOUT`], so the edge answers 503 instead of hanging.

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};

/// No command waits longer for its answer.
pub const RESPONSE_TIMEOUT: Duration = Duration::from_secs(2);
/// Longest wait between two reconnection attempts.
pub const MAX_RECONNECT_DELAY: Duration = Duration::from_secs(1);

pub fn config() -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_factor(2)
        .set_max_delay(MAX_RECONNECT_DELAY.as_millis() as u64)
        .set_number_of_retries(6)
        .set_connection_timeout(Duration::from_secs(1))
        .set_response_timeout(RESPONSE_TIMEOUT)
}

/// Connects to the Redis at `url` (the first connection must succeed).
pub async fn connect(url: &str) -> redis::RedisResult<ConnectionManager> {
    let client = redis::Client::open(url)?;
    ConnectionManager::new_with_config(client, config()).await
}
