//! A service's Redis connection comes back on its own soon after Redis does:
//! a real `redis-server` of this test's own is killed (-9) and started again
//! on the same port, and commands succeed again within seconds.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn redis_server(port: u16) -> Child {
    Command::new("redis-server")
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .stdout(Stdio::null())
        .spawn()
        .expect("redis-server on PATH")
}

async fn wait_up(port: u16) {
    for _ in 0..100 {
        if tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("redis-server did not start on {port}");
}

#[tokio::test]
async fn the_connection_is_back_within_seconds_of_a_redis_restart() {
    let port = free_port();
    let mut server = redis_server(port);
    wait_up(port).await;
    let mut redis = boxoffice_contract::redis_link::connect(&format!("redis://127.0.0.1:{port}"))
        .await
        .unwrap();
    let _: () = redis::cmd("SET")
        .arg("k")
        .arg("v")
        .query_async(&mut redis)
        .await
        .unwrap();

    server.kill().unwrap();
    server.wait().unwrap();
    // Commands while Redis is down fail, promptly.
    let started = Instant::now();
    let down: redis::RedisResult<String> = redis::cmd("PING").query_async(&mut redis).await;
    assert!(down.is_err());
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut server = redis_server(port);
    wait_up(port).await;

    let back = Instant::now();
    let reconnected = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let pong: redis::RedisResult<String> = redis::cmd("PING").query_async(&mut redis).await;
            if pong.is_ok() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    assert!(
        reconnected.is_ok(),
        "still no answer 10 s after Redis came back"
    );
    println!("reconnected {:?} after Redis came back", back.elapsed());
    server.kill().unwrap();
    server.wait().unwrap();
}
