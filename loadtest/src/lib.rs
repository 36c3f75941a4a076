//! The BoxOffice load test: goose users driven by an open-model arrival
//! schedule, a realistic crowd of fans, thresholds that fail the run, and the
//! sale's verdict (the design's invariants) at the end of every run.
//!
//! The `loadtest` binary parses [`Cli`] and hands its options to [`run::run`];
//! the integration tests call the same function against an in-process stack.
//! How to use it: `docs/load-testing.md`.
//!
//! - [`arrivals`] — schedules (constant, stages, Poisson) and the dispatcher
//!   that hands each arrival to a free goose user or counts it dropped;
//! - [`profile`] — the options and the `steady`/`spike`/`soak`/`sale` profiles;
//! - [`journey`] — one fan's journey as goose transactions, timed raw and
//!   corrected for coordinated omission;
//! - [`classify`] — expected answers versus errors;
//! - [`sale`] — the admin API: the run's event and the sale's timeline;
//! - [`rules`] — the sale thresholds (admission accuracy, drops, sell-out
//!   time, confirmation p95, errors, verdict);
//! - [`verdict`] — the invariants, read from PostgreSQL and the payment provider;
//! - [`report`] — JSON, Markdown and HTML reports;
//! - [`run`] — one run, start to verdict.
#![forbid(unsafe_code)]

pub mod arrivals;
pub mod classify;
pub mod journey;
pub mod profile;
pub mod report;
pub mod rules;
pub mod run;
pub mod sale;
pub mod verdict;

/// The command line: goose's options and BoxOffice's.
#[derive(Debug, clap::Parser)]
#[command(
    name = "loadtest",
    about = "BoxOffice's flash-sale load test: open-model arrivals, thresholds and the sale's verdict",
    disable_version_flag = true
)]
pub struct Cli {
    #[command(flatten)]
    pub options: profile::Options,
    #[command(flatten)]
    pub goose: goose::config::GooseConfiguration,
}
