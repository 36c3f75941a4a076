//! The bundled goose scenario against the whole stack: more fans than seats,
//! each following Retry-After, then the sale's invariants in Postgres.

mod common;

use std::time::Duration;

use common::Stack;
use goose::config::GooseConfiguration;
use goose::prelude::*;
use loadtest::scenario::{self, Sale};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

#[sqlx::test(migrator = "order_service::MIGRATOR")]
async fn a_goose_spike_sells_out_cleanly(options: PgPoolOptions, connect: PgConnectOptions) {
    let stack = Stack::start(options, connect).await;
    stack.create_event("spike", 30, 50.0, 1).await;
    scenario::configure(Sale {
        event_id: "spike".into(),
        quantity: 1,
    });

    // 45 fans for 30 seats, all arriving within a second; each runs its journey once.
    let config = GooseConfiguration::parse_args_default(&[
        "--host",
        &stack.gateway,
        "--users",
        "45",
        "--increase-rate",
        "45",
        "--iterations",
        "1",
        "--quiet",
        "--no-print-metrics",
    ])
    .unwrap();
    let metrics = GooseAttack::initialize_with_config(config)
        .unwrap()
        .register_scenario(scenario::flash_sale())
        .execute()
        .await
        .unwrap();
    let buys = metrics
        .requests
        .get("POST buy")
        .map_or(0, |m| m.success_count + m.fail_count);
    assert!(buys >= 30, "at least the 30 winners bought: {buys}");

    let mut report = loadtest::invariants::check(&stack.pool, "spike", false)
        .await
        .unwrap();
    for _ in 0..300 {
        if report.tickets == report.confirmed_quantity && report.sold == 30 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        report = loadtest::invariants::check(&stack.pool, "spike", false)
            .await
            .unwrap();
    }
    let report = loadtest::invariants::check(&stack.pool, "spike", true)
        .await
        .unwrap();
    assert!(report.holds(), "{report:?}");
    assert_eq!(
        (report.sold, report.confirmed_quantity, report.tickets),
        (30, 30, 30),
        "sold out, exactly"
    );
    stack.stop().await;
}
