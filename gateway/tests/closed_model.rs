//! The load test's closed model (goose's own: each user runs fan after fan
//! for `--run-time`) against the whole stack: every fan is a new fan, and
//! the run ends with its thresholds met and the verdict PASS.

mod common;

use common::Stack;
use loadtest::report;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

#[sqlx::test(migrator = "order_service::MIGRATOR")]
async fn goose_users_looping_fans_still_get_a_verdict(
    options: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let stack = Stack::start_with_edge_limits(options, connect).await;
    let dir = std::env::temp_dir().join(format!(
        "boxoffice-closed-{}",
        uuid::Uuid::new_v4().simple()
    ));
    let outcome = stack
        .load_test(&[
            "--profile=steady",
            "--model=closed",
            "--capacity=1000",
            "--admission-rate=50",
            "--users=8",
            "--increase-rate=8",
            "--run-time=8s",
            "--report-dir",
            &dir.display().to_string(),
        ])
        .await;
    let r = &outcome.report;
    let summary = report::markdown(r);
    assert!(outcome.pass, "{summary}");
    // Each user ran several fans one after another, each a fan of its own.
    assert!(r.figures.arrivals > 8, "{summary}");
    let join = r.statuses.get("join").cloned().unwrap_or_default();
    assert!(join.get("201").copied().unwrap_or(0) > 8, "{summary}");
    assert_eq!(
        join.get("200"),
        None,
        "no fan joined twice (a repeat join is 200): {summary}"
    );
    assert!(r.verdict.confirmed_orders > 8, "{summary}");
    stack.stop().await;
}
