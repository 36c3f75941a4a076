//! The bundled load test against the whole stack, as CI's short `sale`:
//! the gateway's default edge limits on, fans from many client addresses,
//! open-model arrivals through a prequeue and an opening rush to sold out,
//! proof of work on every join,
//! then every threshold and the verdict.

mod common;

use std::time::Duration;

use common::Stack;
use loadtest::report;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

#[sqlx::test(migrator = "order_service::MIGRATOR")]
async fn a_short_sale_meets_every_threshold_and_the_verdict_passes(
    options: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let stack = Stack::start_with_edge_limits(options, connect).await;
    let dir = std::env::temp_dir().join(format!(
        "boxoffice-loadtest-{}",
        uuid::Uuid::new_v4().simple()
    ));
    let dir = dir.display().to_string();
    let started = std::time::Instant::now();
    let outcome = stack
        .load_test(&[
            "--profile=sale",
            // 120 seats, 1-2 a fan, admitted 10/s: about 80 buyers, sold out
            // some 10 s after opening; fans arrive 8/s in a 6 s prequeue, 30/s
            // for 5 s at opening, then 8/s.
            "--capacity=120",
            "--per-fan-limit=2",
            "--admission-rate=10",
            "--access-ttl-s=15",
            "--prequeue=6s",
            "--stages=5s:8,5s:=30,40s:=8",
            "--users=300",
            "--misbehave=0.15",
            "--pow-bits=4",
            "--settle=60s",
            // The correctness rules as the profile has them; the timing
            // rules loosened. Here the whole debug-built stack shares the
            // test runtime's one thread with the rush on a shared 2-core CI
            // machine: clean-clone runs measured admission 2.9-25.6 % off
            // the set rate (a tick late by more than two ticks loses its
            // budget by design) and confirmation p95 up to 8.2 s. Against
            // scripts/up.sh the defaults (2 %, 10 s) hold: BENCHMARKS.md.
            "--rule=errors<=0",
            "--rule=verdict",
            "--rule=dropped<=0",
            "--rule=sold-out-after<=90s",
            "--rule=confirm-p95<=30s",
            "--rule=admission-accuracy<=50%",
            "--report-dir",
            &dir,
        ])
        .await;
    let r = &outcome.report;
    let summary = report::markdown(r);
    assert!(outcome.pass, "{summary}");
    assert!(
        started.elapsed() < Duration::from_secs(90),
        "the CI sale takes under 90 s: {:?}",
        started.elapsed()
    );

    // Sold out exactly, every invariant checked.
    assert!(r.verdict.pass && r.verdict.checks.len() == 8, "{summary}");
    assert_eq!((r.verdict.sold, r.verdict.tickets), (120, 120), "{summary}");
    assert!(r.figures.sold_out_after_s.is_some(), "{summary}");
    assert!(r.figures.admission_accuracy_pct.is_some(), "{summary}");
    assert!(r.verdict.fairness_pairs_checked > 50, "{summary}");
    // The crowd came from many addresses: with the default 50/s per IP, one
    // host would have met 429s.
    let rate_limited: u64 = r.statuses.values().filter_map(|by| by.get("429")).sum();
    assert_eq!(rate_limited, 0, "{summary}");
    // Misbehaving fans were refused, and that counts as expected.
    let attacks: u64 = r.statuses.get("attack").map_or(0, |by| by.values().sum());
    assert!(attacks > 0, "{summary}");
    assert_eq!(r.figures.errors, 0, "{summary}");
    // The event asked for proof of work: every fan met 428, fetched a
    // challenge and solved it.
    let challenges = r
        .statuses
        .get("challenge")
        .and_then(|by| by.get("200"))
        .copied();
    let asked = r.statuses.get("join").and_then(|by| by.get("428")).copied();
    assert!(challenges.is_some() && challenges == asked, "{summary}");
    assert!(
        r.figures.arrivals > 150 && r.figures.dropped == 0,
        "{summary}"
    );
    for file in ["summary.md", "summary.json", "report.html", "goose.html"] {
        assert!(
            std::path::Path::new(&dir).join(file).exists(),
            "{file} written"
        );
    }
    stack.stop().await;
}
