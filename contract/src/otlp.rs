//! Span export over OTLP, so one purchase is one trace in Jaeger or Tempo.
//!
//! Off unless `OTEL_EXPORTER_OTLP_ENDPOINT` (or
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set; then each service exports
//! the spans BoxOffice records ([`telemetry::Traced`](crate::telemetry::Traced)'s
//! request span, the saga's step, the ticket worker's message) over
//! OTLP/HTTP with protobuf, batched off the request path. The standard
//! `OTEL_*` variables apply (`OTEL_EXPORTER_OTLP_HEADERS`,
//! `OTEL_EXPORTER_OTLP_TIMEOUT`, `OTEL_SERVICE_NAME`,
//! `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_BSP_*`); `OTEL_SDK_DISABLED=true` or
//! `OTEL_TRACES_EXPORTER=none` turns it off.
//!
//! An exported span has exactly the ids of BoxOffice's own
//! [`TraceContext`]: the `span_id` in the logs, the `traceparent` sent
//! downstream (in HTTP and in Kafka headers) and the exported span are one
//! span, so a log line leads to its span and the callee's span is the
//! exported child of the caller's. (`tracing-opentelemetry` would make its
//! own span ids, which the `traceparent` handed on would then have to follow.)
//!
//! When off, a span costs one atomic load ([`enabled`]; callers check it
//! before building a name). Spans are sampled parent-based, always on: a
//! caller's `traceparent` flagged not sampled is not exported, and
//! `OTEL_TRACES_SAMPLER` is not followed.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{LazyLock, RwLock};

use opentelemetry::trace::{
    SpanContext, SpanId, SpanKind, TraceContextExt, TraceFlags, TraceId, TraceState, Tracer as _,
    TracerProvider as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::trace::{Sampler, SdkTracer, SdkTracerProvider};
use opentelemetry_sdk::Resource;

use crate::trace::{ParentSpan, TraceContext};

pub use opentelemetry::trace::{SpanKind as Kind, Status};

/// Whether any service in this process exports: the hot path's only cost when none does.
static ON: AtomicBool = AtomicBool::new(false);

/// Each service's exporter, by service name (several services share one
/// process in tests; in a deployment there is one per process).
static EXPORTERS: LazyLock<RwLock<HashMap<&'static str, Exporter>>> =
    LazyLock::new(Default::default);

#[derive(Clone)]
struct Exporter {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
}

/// Whether the standard environment asks for span export.
pub fn wanted_by_env() -> bool {
    let set = |name| std::env::var(name).is_ok_and(|v| !v.trim().is_empty());
    let disabled = std::env::var("OTEL_SDK_DISABLED").is_ok_and(|v| v.eq_ignore_ascii_case("true"))
        || std::env::var("OTEL_TRACES_EXPORTER").is_ok_and(|v| v.eq_ignore_ascii_case("none"));
    !disabled && (set("OTEL_EXPORTER_OTLP_ENDPOINT") || set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))
}

/// Starts `service`'s exporter if the environment asks for one (see the
/// module docs); a binary calls it once at start. Returns whether it did.
pub fn init_from_env(service: &'static str) -> anyhow::Result<bool> {
    if !wanted_by_env() {
        return Ok(false);
    }
    install(service, None)?;
    Ok(true)
}

/// Starts `service`'s exporter, sending to `endpoint` (the full URL of the
/// traces path, e.g. `http://collector:4318/v1/traces`) or, when `None`,
/// where the `OTEL_EXPORTER_OTLP_*` variables say. A second call for the
/// same service replaces the first.
pub fn install(service: &'static str, endpoint: Option<&str>) -> anyhow::Result<()> {
    use opentelemetry_otlp::{Protocol, WithExportConfig};
    let mut exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpBinary);
    if let Some(endpoint) = endpoint {
        exporter = exporter.with_endpoint(endpoint);
    }
    let exporter = exporter.build()?;
    let mut resource = Resource::builder();
    if std::env::var_os("OTEL_SERVICE_NAME").is_none() {
        resource = resource.with_service_name(service);
    }
    // Every span whose parent is sampled (or that has none) is exported: the
    // `traceparent` handed on says "sampled" before any sampler could decide
    // otherwise, so `OTEL_TRACES_SAMPLER` is not followed.
    let provider = SdkTracerProvider::builder()
        .with_sampler(Sampler::ParentBased(Box::new(Sampler::AlwaysOn)))
        .with_batch_exporter(exporter)
        .with_resource(resource.build())
        .build();
    let tracer = provider.tracer("boxoffice");
    EXPORTERS
        .write()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .insert(service, Exporter { provider, tracer });
    ON.store(true, Ordering::Release);
    Ok(())
}

/// Whether any service in this process exports: check it before building
/// a span's name or attributes.
pub fn enabled() -> bool {
    ON.load(Ordering::Acquire)
}

/// Sends every finished span now (blocking: call it from a blocking
/// thread). Shutdown and tests use it.
pub fn flush() {
    let exporters: Vec<Exporter> = EXPORTERS
        .read()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .values()
        .cloned()
        .collect();
    for exporter in exporters {
        if let Err(error) = exporter.provider.force_flush() {
            tracing::warn!(%error, "exporting spans failed");
        }
    }
}

/// [`flush`] on a blocking thread, when anything exports: what a binary
/// does as it exits, so the last spans are not lost.
pub async fn flush_on_exit() {
    if ON.load(Ordering::Acquire) {
        let _ = tokio::task::spawn_blocking(flush).await;
    }
}

/// A span being exported; it ends (and is queued for export) when dropped.
/// A no-op when `service` does not export.
#[must_use = "the span ends when dropped"]
pub struct Span(Option<opentelemetry_sdk::trace::Span>);

impl Span {
    /// Starts the span whose ids are `cx` (the context BoxOffice records and
    /// hands on), under `parent` (the caller's span, from the `traceparent`
    /// received) or as its trace's root.
    pub fn start(
        service: &'static str,
        name: impl Into<Cow<'static, str>>,
        kind: SpanKind,
        cx: &TraceContext,
        parent: ParentSpan,
    ) -> Self {
        if !ON.load(Ordering::Acquire) {
            return Self(None);
        }
        let Some(tracer) = EXPORTERS
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .get(service)
            .map(|e| e.tracer.clone())
        else {
            return Self(None);
        };
        let flags = if cx.sampled {
            TraceFlags::SAMPLED
        } else {
            TraceFlags::default()
        };
        let trace_id = TraceId::from(cx.trace_id);
        let parent_cx = match parent.0 {
            Some(parent) => Context::new().with_remote_span_context(SpanContext::new(
                trace_id,
                SpanId::from(parent),
                flags,
                true,
                TraceState::default(),
            )),
            None => Context::new(),
        };
        let span = tracer
            .span_builder(name)
            .with_kind(kind)
            .with_trace_id(trace_id)
            .with_span_id(SpanId::from(cx.span_id))
            .start_with_context(&tracer, &parent_cx);
        Self(Some(span))
    }

    /// A span that is not exported.
    pub fn none() -> Self {
        Self(None)
    }

    /// Whether the span is exported (so attributes are worth computing).
    pub fn is_recording(&self) -> bool {
        self.0
            .as_ref()
            .is_some_and(opentelemetry::trace::Span::is_recording)
    }

    pub fn set_attribute(&mut self, attribute: KeyValue) {
        if let Some(span) = &mut self.0 {
            opentelemetry::trace::Span::set_attribute(span, attribute);
        }
    }

    pub fn update_name(&mut self, name: impl Into<Cow<'static, str>>) {
        if let Some(span) = &mut self.0 {
            opentelemetry::trace::Span::update_name(span, name);
        }
    }

    pub fn set_status(&mut self, status: Status) {
        if let Some(span) = &mut self.0 {
            opentelemetry::trace::Span::set_status(span, status);
        }
    }
}

pub use opentelemetry::KeyValue as Attribute;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_service_that_does_not_export_records_nothing() {
        let cx = TraceContext::root();
        assert!(!Span::start(
            "not-installed",
            "x",
            SpanKind::Internal,
            &cx,
            ParentSpan(None)
        )
        .is_recording());
    }
}
