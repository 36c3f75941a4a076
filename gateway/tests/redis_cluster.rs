//! The whole stack on a real Redis Cluster: three masters started here
//! (`redis-server --cluster-enabled yes`, joined by `redis-cli --cluster
//! create`), and events whose hash tags land on each of them. Join, status,
//! admission, the purchase's spend, the stock view and the admin API all
//! run against it; without a cluster-aware client every event whose slot is
//! on another node than the one a plain connection reached fails with
//! `MOVED`.

mod common;

use std::process::Stdio;
use std::time::Duration;

use boxoffice_contract::keys::cluster_slot;
use common::{Stack, ADMIN_TOKEN};
use reqwest::StatusCode;
use serde_json::json;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use tokio::process::{Child, Command};

/// Three cluster masters on free ports, in a folder of their own; stopped
/// when dropped.
struct Cluster {
    ports: Vec<u16>,
    _nodes: Vec<Child>,
    dir: std::path::PathBuf,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A port free for a node and for its cluster bus (the port + 10000).
fn free_port() -> u16 {
    loop {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        if port < 55_000 && std::net::TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return port;
        }
    }
}

impl Cluster {
    async fn start() -> Self {
        let dir = std::env::temp_dir().join(format!("boxoffice-cluster-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
        let mut nodes = Vec::new();
        for port in &ports {
            let node = Command::new("redis-server")
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                .args(["--cluster-enabled", "yes"])
                .args(["--cluster-config-file", &format!("nodes-{port}.conf")])
                .args(["--save", "", "--appendonly", "no"])
                .arg("--dir")
                .arg(&dir)
                .stdout(Stdio::null())
                .kill_on_drop(true)
                .spawn()
                .expect("redis-server (Debian package redis-server) on PATH");
            nodes.push(node);
        }
        for port in &ports {
            wait_ping(*port).await;
        }
        let created = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(ports.iter().map(|p| format!("127.0.0.1:{p}")))
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .output()
            .await
            .unwrap();
        assert!(
            created.status.success(),
            "redis-cli --cluster create: {}",
            String::from_utf8_lossy(&created.stdout)
        );
        let cluster = Self {
            ports,
            _nodes: nodes,
            dir,
        };
        for port in &cluster.ports {
            for _ in 0..100 {
                let info: String = redis::cmd("CLUSTER")
                    .arg("INFO")
                    .query_async(&mut node(*port).await)
                    .await
                    .unwrap();
                if info.contains("cluster_state:ok") {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        cluster
    }

    /// The services' `REDIS_URL`: every node, comma-separated.
    fn url(&self) -> String {
        self.ports
            .iter()
            .map(|p| format!("redis://127.0.0.1:{p}"))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The node serving `slot`, from `CLUSTER NODES` (`… 127.0.0.1:P@B
    /// master … connected 0-5460`).
    async fn owner(&self, slot: u16) -> u16 {
        let nodes: String = redis::cmd("CLUSTER")
            .arg("NODES")
            .query_async(&mut node(self.ports[0]).await)
            .await
            .unwrap();
        for line in nodes.lines() {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let port: u16 = fields[1]
                .split(['@', ','])
                .next()
                .and_then(|a| a.rsplit(':').next())
                .and_then(|p| p.parse().ok())
                .unwrap();
            for range in fields.iter().skip(8) {
                let (start, end) = range.split_once('-').unwrap_or((range, range));
                if let (Ok(start), Ok(end)) = (start.parse::<u16>(), end.parse::<u16>()) {
                    if (start..=end).contains(&slot) {
                        return port;
                    }
                }
            }
        }
        panic!("no node serves slot {slot}: {nodes}");
    }
}

async fn node(port: u16) -> redis::aio::MultiplexedConnection {
    redis::Client::open(format!("redis://127.0.0.1:{port}"))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

async fn wait_ping(port: u16) {
    for _ in 0..100 {
        if let Ok(client) = redis::Client::open(format!("redis://127.0.0.1:{port}")) {
            if let Ok(mut c) = client.get_multiplexed_async_connection().await {
                if redis::cmd("PING")
                    .query_async::<String>(&mut c)
                    .await
                    .is_ok()
                {
                    return;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("redis-server on {port} did not start");
}

#[sqlx::test(migrations = "../order-service/migrations")]
async fn a_sale_runs_on_a_redis_cluster_with_events_on_every_node(
    pool_options: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let cluster = Cluster::start().await;
    let stack = Stack::start_on_redis(pool_options, connect, cluster.url()).await;

    // One event per master: an id whose hash tag's slot that node serves.
    let mut events: Vec<(String, u16)> = Vec::new();
    for n in 0.. {
        let id = format!("c{n}-{}", &stack.prefix[1..9]);
        let owner = cluster.owner(cluster_slot(&format!("{{{id}}}"))).await;
        if events.iter().all(|(_, o)| *o != owner) {
            events.push((id, owner));
        }
        if events.len() == cluster.ports.len() {
            break;
        }
    }

    for (event, owner) in &events {
        // The admin API writes the event; the public view reads it back.
        stack.create_event(event, 10, 50.0, 4).await;
        let public = stack.public_event(event).await;
        assert_eq!(public["name"], format!("Test {event}"), "{public}");
        assert!(
            redis::cmd("EXISTS")
                .arg(format!("{}:{{{event}}}:config", stack.prefix))
                .query_async::<bool>(&mut node(*owner).await)
                .await
                .unwrap(),
            "the event's settings are on the node that serves its slot"
        );

        // Join (join.lua), status, admission (admit.lua), the purchase
        // (spend.lua), the order through the saga to its tickets (the
        // stock view's script).
        let (status, joined) = stack.join(event, "fan-1").await;
        assert_eq!(status, StatusCode::CREATED, "{joined}");
        let access = stack
            .wait_admitted(event, joined["queue_ticket"].as_str().unwrap())
            .await;
        let (status, order) = stack.buy(event, &access, 2, Some("k-1")).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{order}");
        let order_id = order["order_id"].as_str().unwrap();
        let done = stack
            .wait_ticketed(order_id, order["order_token"].as_str().unwrap())
            .await;
        assert_eq!(done["status"], "confirmed", "{done}");
        // The spent admission is refused a second order.
        let (status, again) = stack.buy(event, &access, 1, Some("k-2")).await;
        assert_eq!(status, StatusCode::CONFLICT, "{again}");
    }

    // The admin API's reads and writes of each: a PATCH, the ops view.
    for (event, _) in &events {
        let patched = stack
            .http
            .patch(format!("{}/admin/v1/events/{event}", stack.admission))
            .bearer_auth(ADMIN_TOKEN)
            .json(&json!({ "paused": true }))
            .send()
            .await
            .unwrap();
        assert_eq!(patched.status(), StatusCode::OK);
        let view = stack.admin_get(&format!("/admin/v1/events/{event}")).await;
        assert_eq!(view["paused"], true, "{view}");
        assert_eq!(
            (&view["sold"], &view["remaining"]),
            (&json!(2), &json!(8)),
            "{view}"
        );
    }
    let listed = stack.admin_get("/admin/v1/events").await;
    for (event, _) in &events {
        assert!(listed.to_string().contains(event.as_str()), "{listed}");
    }

    // Every master holds some of the sale.
    for port in &cluster.ports {
        let keys: i64 = redis::cmd("DBSIZE")
            .query_async(&mut node(*port).await)
            .await
            .unwrap();
        assert!(keys > 0, "node {port} holds nothing");
    }
    stack.stop().await;
}
