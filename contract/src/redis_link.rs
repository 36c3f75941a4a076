//! How every service connects to Redis: one multiplexed connection that
//! reconnects on its own, quickly, to a single Redis or to a Redis Cluster.
//!
//! `REDIS_URL` is one URL for a single Redis (with replicas for failover),
//! or several of a cluster's node URLs, comma-separated, for a Redis
//! Cluster: then [`RedisLink`] routes each command by its key's hash slot.
//! Every key of an event carries the event's hash tag (`P:{E}:…`), so one
//! event's scripts and pipelines stay on one node; only the set of events
//! (`P:events`) lives elsewhere, and nothing writes it in the same
//! transaction as an event's keys.
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

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, Value};

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

/// Connects to the Redis at `url`, or to the Redis Cluster whose nodes
/// `url` lists comma-separated (the first connection must succeed).
pub async fn connect(url: &str) -> redis::RedisResult<RedisLink> {
    let nodes: Vec<&str> = url.split(',').map(str::trim).collect();
    if let [one] = nodes[..] {
        let client = redis::Client::open(one)?;
        return Ok(RedisLink::Single(
            ConnectionManager::new_with_config(client, config()).await?,
        ));
    }
    // The same bounds as a single connection's: attempts at most a second
    // apart, each bounded, and no command waiting past RESPONSE_TIMEOUT.
    let client = ClusterClient::builder(nodes)
        .connection_timeout(Duration::from_secs(1))
        .response_timeout(RESPONSE_TIMEOUT)
        .retries(6)
        .min_retry_wait(50)
        .max_retry_wait(MAX_RECONNECT_DELAY.as_millis() as u64)
        .build()?;
    Ok(RedisLink::Cluster(client.get_async_connection().await?))
}

/// A connection to a single Redis or to a Redis Cluster; cloned freely
/// (both multiplex one connection per node), used alike by commands,
/// single-slot pipelines and scripts.
#[derive(Clone)]
pub enum RedisLink {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl From<ConnectionManager> for RedisLink {
    fn from(connection: ConnectionManager) -> Self {
        Self::Single(connection)
    }
}

impl ConnectionLike for RedisLink {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Self::Single(c) => c.req_packed_command(cmd),
            Self::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Self::Single(c) => c.req_packed_commands(cmd, offset, count),
            Self::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Single(c) => c.get_db(),
            Self::Cluster(c) => c.get_db(),
        }
    }
}
