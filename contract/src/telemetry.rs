//! One tracing setup for every binary: `RUST_LOG` filters, `--log-json` is left
//! for the telemetry issue.

use tracing_subscriber::EnvFilter;

pub fn init() {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    // A second init (tests starting several services) is harmless.
    let _ = tracing_subscriber::fmt().with_env_filter(filter).try_init();
}

/// The process's Prometheus recorder, installed on first use. Every service
/// serves `render()` at `/metrics`; several services in one test process
/// share it, which is harmless.
pub fn prometheus() -> &'static metrics_exporter_prometheus::PrometheusHandle {
    static HANDLE: std::sync::OnceLock<metrics_exporter_prometheus::PrometheusHandle> =
        std::sync::OnceLock::new();
    HANDLE.get_or_init(|| {
        let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        if metrics::set_global_recorder(recorder).is_err() {
            tracing::warn!(
                "a metrics recorder was already installed; /metrics shows only this one"
            );
        }
        handle
    })
}

/// `GET /metrics`: Prometheus text exposition.
pub async fn metrics_endpoint() -> impl axum::response::IntoResponse {
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4",
        )],
        prometheus().render(),
    )
}
