//! A Redis server of one test's own (`redis-server` on a free port, nothing
//! kept on disk), for a test that kills, pauses or counts the commands of
//! its Redis: the shared one would take every other test down with it.
//! Included by path (`#[path = "common/own_redis.rs"] mod own_redis;`), not
//! through `common`, so a test of the edge alone builds no whole stack.

use std::time::Duration;

/// Killed when the test ends, however it ends.
pub struct OwnRedis {
    child: std::process::Child,
    pub url: String,
}

impl OwnRedis {
    /// Starts it and waits until it answers.
    pub async fn start() -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = std::process::Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("redis-server on PATH");
        let server = Self {
            child,
            url: format!("redis://127.0.0.1:{port}"),
        };
        let client = redis::Client::open(server.url.as_str()).unwrap();
        for _ in 0..100 {
            if client.get_multiplexed_async_connection().await.is_ok() {
                return server;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("redis-server did not start on port {port}");
    }

    /// Kills it now: the test goes on without its Redis.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for OwnRedis {
    fn drop(&mut self) {
        self.kill();
    }
}
