//! A flash sale under goose: each user is a stream of fans; each fan joins,
//! polls its place at the pace `Retry-After` asks, buys when admitted, and
//! follows the order to `confirmed`. Sold-out and room-full answers are the
//! edge doing its job, not errors. After the run, the sale's invariants are
//! checked in Postgres when `DATABASE_URL` is set.
//!
//! ```sh
//! BOXOFFICE_EVENT=demo DATABASE_URL=postgres://postgres@127.0.0.1:5432/boxoffice \
//!   cargo run --release -p loadtest -- --host http://127.0.0.1:8080 --users 200 --increase-rate 50 --run-time 60s
//! ```
//! Every goose flag works (`--help`); `BOXOFFICE_EVENT` (default `demo`) and
//! `BOXOFFICE_QUANTITY` (default 1) pick the sale.

use std::time::Duration;

use goose::prelude::*;
use loadtest::scenario::{self, Sale};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let sale = Sale {
        event_id: std::env::var("BOXOFFICE_EVENT").unwrap_or_else(|_| "demo".into()),
        quantity: std::env::var("BOXOFFICE_QUANTITY")
            .ok()
            .and_then(|q| q.parse().ok())
            .unwrap_or(1),
    };
    let event = sale.event_id.clone();
    scenario::configure(sale);
    GooseAttack::initialize()?
        .register_scenario(scenario::flash_sale())
        .set_default(GooseDefault::Host, "http://127.0.0.1:8080")?
        .execute()
        .await?;

    if let Ok(url) = std::env::var("DATABASE_URL") {
        let pool = sqlx::PgPool::connect(&url).await?;
        // Give the ticket workers a moment to catch up before tickets are due.
        let mut report = loadtest::invariants::check(&pool, &event, false).await?;
        for _ in 0..30 {
            if report.tickets == report.confirmed_quantity {
                break;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
            report = loadtest::invariants::check(&pool, &event, false).await?;
        }
        let report = loadtest::invariants::check(&pool, &event, true).await?;
        println!(
            "invariants for {event}: {}",
            serde_json::to_string_pretty(&report)?
        );
        anyhow::ensure!(report.holds(), "invariants broken: {:?}", report.violations);
    }
    Ok(())
}
