//! Token share of the purchase request: how much of the CPU one purchase
//! costs goes to signing and verifying tokens.
//!
//! The whole stack runs in this process (gateway, order service without its
//! saga runners, relay and worker, admission) against the real Redis and a
//! database of its own. `BENCH_PURCHASES` fans (default 1000) are joined and
//! admitted first; then a client in a separate process (this binary again)
//! spends each access token on one purchase, 32 at a time. The CPU of that phase is read from /proc for this process
//! (gateway + order service) and for the Redis and PostgreSQL servers. In
//! the same run the token operations a purchase performs (verify the access
//! token, sign the order token) are timed on one thread, and the share is
//! printed against both totals.
//!
//! `cargo bench -p gateway --bench purchase` (needs Redis and PostgreSQL).

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "../../order-service/benches/support/mod.rs"]
mod order_bench;

use std::io::Write;
use std::process::Command;
use std::time::{Duration, Instant};

use boxoffice_contract::token::{Claims, TokenUse};
use sqlx::postgres::PgPoolOptions;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The client side, run as a second process of this same binary (so its CPU
/// is not counted): spends each access token on one purchase, 32 at a time,
/// and prints how many were accepted.
async fn client(tokens_file: &str, url: &str) {
    use futures_util::stream::{self, StreamExt};
    let tokens = std::fs::read_to_string(tokens_file).unwrap();
    let http = reqwest::Client::new();
    let statuses: Vec<u16> = stream::iter(tokens.lines())
        .map(|token| {
            let http = http.clone();
            async move {
                http.post(url)
                    .bearer_auth(token)
                    .json(&serde_json::json!({ "quantity": 1 }))
                    .send()
                    .await
                    .map_or(0, |r| r.status().as_u16())
            }
        })
        .buffer_unordered(32)
        .collect()
        .await;
    let accepted = statuses.iter().filter(|s| **s == 202).count();
    let refused: Vec<&u16> = statuses.iter().filter(|s| **s != 202).collect();
    println!("accepted {accepted}");
    if !refused.is_empty() {
        eprintln!("refused: {refused:?}");
    }
}

/// CPU seconds (user + system) of the processes whose command is `comm`,
/// or of this process for `None`.
fn cpu_seconds(comm: Option<&str>) -> f64 {
    // SAFETY: sysconf has no preconditions.
    let ticks_per_s = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let read = |path: &std::path::Path| -> Option<(String, f64)> {
        let stat = std::fs::read_to_string(path).ok()?;
        let open = stat.find('(')?;
        let close = stat.rfind(')')?;
        let name = stat[open + 1..close].to_owned();
        let fields: Vec<&str> = stat[close + 2..].split(' ').collect();
        // Fields 14 and 15 of stat(5), counted after the command.
        let ticks = fields[11].parse::<f64>().ok()? + fields[12].parse::<f64>().ok()?;
        Some((name, ticks / ticks_per_s))
    };
    match comm {
        None => read("/proc/self/stat".as_ref()).map_or(0.0, |(_, s)| s),
        Some(comm) => std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter_map(|entry| read(&entry.path().join("stat")))
            .filter(|(name, _)| name.starts_with(comm))
            .map(|(_, s)| s)
            .sum(),
    }
}

fn cpu_snapshot() -> [f64; 3] {
    [
        cpu_seconds(None),
        cpu_seconds(Some("redis-server")),
        cpu_seconds(Some("postgres")),
    ]
}

/// Mean wall time of `op` on this thread over `n` runs, in microseconds.
fn time_us(n: u32, mut op: impl FnMut()) -> f64 {
    for _ in 0..n / 10 {
        op();
    }
    let start = Instant::now();
    for _ in 0..n {
        op();
    }
    start.elapsed().as_secs_f64() * 1e6 / f64::from(n)
}

#[tokio::main]
async fn main() {
    if let (Ok(tokens), Ok(url)) = (
        std::env::var("BENCH_CLIENT_TOKENS"),
        std::env::var("BENCH_CLIENT_URL"),
    ) {
        return client(&tokens, &url).await;
    }
    let purchases: usize = std::env::var("BENCH_PURCHASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let db = order_bench::BenchDb::create().await;
    let connect = db.connect.clone();

    let stack = common::Stack::start_with(PgPoolOptions::new(), connect, false).await;
    let event = "bench";
    stack
        .create_event(event, purchases as i64, 100_000.0, 1)
        .await;
    let max_active = serde_json::json!({ "max_active": purchases });
    let response = stack
        .http
        .patch(format!("{}/admin/v1/events/{event}", stack.admission))
        .bearer_auth(common::ADMIN_TOKEN)
        .json(&max_active)
        .send()
        .await
        .unwrap();
    assert!(
        response.status().is_success(),
        "{:?}",
        response.text().await
    );

    // Every fan joins and is admitted before the measured phase.
    let mut tokens = Vec::with_capacity(purchases);
    for fan in 0..purchases {
        let (status, body) = stack.join(event, &format!("fan-{fan}")).await;
        assert!(status.is_success(), "{body}");
        tokens.push(body["queue_ticket"].as_str().unwrap().to_owned());
    }
    let mut access = Vec::with_capacity(purchases);
    for ticket in &tokens {
        access.push(stack.wait_admitted(event, ticket).await);
    }
    let tokens_file =
        std::env::temp_dir().join(format!("bench-{}.tokens", uuid::Uuid::new_v4().simple()));
    std::fs::File::create(&tokens_file)
        .unwrap()
        .write_all(access.join("\n").as_bytes())
        .unwrap();

    let before = cpu_snapshot();
    let started = Instant::now();
    let output = Command::new(std::env::current_exe().unwrap())
        .env("BENCH_CLIENT_TOKENS", &tokens_file)
        .env(
            "BENCH_CLIENT_URL",
            format!("{}/v1/events/{event}/orders", stack.gateway),
        )
        .output()
        .expect("running the client process");
    let elapsed = started.elapsed();
    let after = cpu_snapshot();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let accepted: usize = stdout
        .lines()
        .find_map(|l| l.strip_prefix("accepted "))
        .unwrap_or_else(|| {
            panic!(
                "the client failed:\n{}",
                String::from_utf8_lossy(&output.stderr)
            )
        })
        .trim()
        .parse()
        .unwrap();
    let held: i32 = sqlx::query_scalar("SELECT reserved FROM inventory WHERE event_id = $1")
        .bind(event)
        .fetch_one(&stack.pool)
        .await
        .unwrap();
    assert_eq!(
        (accepted, held),
        (purchases, purchases as i32),
        "every purchase must be accepted and hold its seat: {}",
        String::from_utf8_lossy(&output.stderr)
    );

    // The token work of one purchase, in the same run, with the stack's keys.
    let sample = stack
        .keys
        .verify(&access[0], TokenUse::Access, Some(event))
        .unwrap();
    let verify_us = time_us(2_000, || {
        stack
            .keys
            .verify(&access[0], TokenUse::Access, Some(event))
            .unwrap();
    });
    let mut order_claims = Claims::new(
        stack.keys.issuer(),
        event,
        &sample.sub,
        TokenUse::Order,
        boxoffice_contract::token::now_s(),
        86_400,
    );
    order_claims.order_id = Some(uuid::Uuid::now_v7());
    let sign_us = time_us(2_000, || {
        std::hint::black_box(stack.keys.sign(&order_claims));
    });
    let token_us = verify_us + sign_us;

    let per = |seconds: f64| seconds * 1e6 / purchases as f64;
    let process_us = per(after[0] - before[0]);
    let redis_us = per(after[1] - before[1]);
    let postgres_us = per(after[2] - before[2]);
    let total_us = process_us + redis_us + postgres_us;
    println!(
        "purchases: {purchases} in {:.2} s ({:.0}/s), all 202 with a seat held",
        elapsed.as_secs_f64(),
        purchases as f64 / elapsed.as_secs_f64()
    );
    println!(
        "CPU per purchase: gateway+order service {process_us:.0} µs, Redis {redis_us:.0} µs, \
         PostgreSQL {postgres_us:.0} µs, total {total_us:.0} µs"
    );
    println!(
        "tokens per purchase: verify access {verify_us:.1} µs + sign order {sign_us:.1} µs = {token_us:.1} µs"
    );
    println!(
        "token share: {:.1} % of the whole purchase's CPU, {:.1} % of the services' own (goal ≤ 5 %)",
        100.0 * token_us / total_us,
        100.0 * token_us / process_us
    );

    std::fs::remove_file(&tokens_file).ok();
    stack.stop().await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    db.drop().await;
}
