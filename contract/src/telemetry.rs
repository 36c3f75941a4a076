//! One tracing setup for every binary: `RUST_LOG` filters, `--log-json` is left
//! for the telemetry issue.

use tracing_subscriber::EnvFilter;

pub fn init() {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    // A second init (tests starting several services) is harmless.
    let _ = tracing_subscriber::fmt().with_env_filter(filter).try_init();
}
