//! Span export over OTLP: one real purchase through the whole stack, the
//! spans received here over OTLP/HTTP (protobuf) as a collector would and
//! decoded with `opentelemetry-proto`, form one trace whose parents run from
//! the caller through the gateway, the order service and its saga to the
//! ticket worker, each span under its own service's name; and the admin's
//! event creation is admission's span with the order service's under it.
//!
//! The exporters are process-wide, so this file holds one test: its process
//! is the only one exporting to its receiver.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::routing::post;
use boxoffice_contract::otlp;
use common::Stack;
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use prost::Message;
use reqwest::StatusCode;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

/// One received span, flattened.
#[derive(Debug, Clone)]
struct Received {
    service: String,
    name: String,
    kind: i32,
    trace_id: String,
    span_id: String,
    parent_span_id: String,
    attributes: Vec<(String, String)>,
}

impl Received {
    fn attribute(&self, key: &str) -> Option<&str> {
        self.attributes
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// An OTLP/HTTP traces endpoint on 127.0.0.1:0 keeping what it receives.
async fn collector() -> (String, Arc<Mutex<Vec<Received>>>) {
    let received = Arc::new(Mutex::new(Vec::new()));
    let kept = received.clone();
    let app = axum::Router::new().route(
        "/v1/traces",
        post(move |body: Bytes| {
            let kept = kept.clone();
            async move {
                let request =
                    ExportTraceServiceRequest::decode(body).expect("an OTLP protobuf body");
                let mut kept = kept.lock().unwrap();
                for resource_spans in request.resource_spans {
                    let service = resource_spans
                        .resource
                        .iter()
                        .flat_map(|r| &r.attributes)
                        .find(|a| a.key == "service.name")
                        .map(|a| text(a.value.as_ref().and_then(|v| v.value.as_ref())))
                        .unwrap_or_default();
                    for span in resource_spans.scope_spans.into_iter().flat_map(|s| s.spans) {
                        kept.push(Received {
                            service: service.clone(),
                            name: span.name,
                            kind: span.kind,
                            trace_id: hex(&span.trace_id),
                            span_id: hex(&span.span_id),
                            parent_span_id: hex(&span.parent_span_id),
                            attributes: span
                                .attributes
                                .iter()
                                .map(|a| {
                                    (
                                        a.key.clone(),
                                        text(a.value.as_ref().and_then(|v| v.value.as_ref())),
                                    )
                                })
                                .collect(),
                        });
                    }
                }
                (
                    [("content-type", "application/x-protobuf")],
                    ExportTraceServiceResponse::default().encode_to_vec(),
                )
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/v1/traces", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, received)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn text(value: Option<&AnyValue>) -> String {
    match value {
        Some(AnyValue::StringValue(s)) => s.clone(),
        Some(AnyValue::IntValue(i)) => i.to_string(),
        Some(other) => format!("{other:?}"),
        None => String::new(),
    }
}

#[sqlx::test(migrations = "../order-service/migrations")]
async fn one_purchase_is_one_exported_trace_across_the_services(
    pool_options: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let (endpoint, received) = collector().await;
    for service in [
        admission::SERVICE,
        gateway::SERVICE,
        order_service::SERVICE,
        order_service::WORKER_SERVICE,
    ] {
        otlp::install(service, Some(&endpoint)).unwrap();
    }
    let stack = Stack::start_behind_proxy(pool_options, connect).await;
    let event = format!("o{}", &stack.prefix[1..12]);
    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    let caller_span = "00f067aa0ba902b7";
    let (order_id, answered) = stack
        .purchase(&event, &format!("00-{trace_id}-{caller_span}-01"))
        .await;

    for probe in ["/healthz", "/readyz"] {
        let answer = stack
            .http
            .get(format!("{}{probe}", stack.gateway))
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), StatusCode::OK, "{probe}");
    }

    // Batched export: flush until the worker's span has arrived.
    let mut trace = Vec::new();
    let mut all = Vec::new();
    for _ in 0..50 {
        tokio::task::spawn_blocking(otlp::flush).await.unwrap();
        all = received.lock().unwrap().clone();
        trace = all
            .iter()
            .filter(|s| s.trace_id == trace_id)
            .cloned()
            .collect::<Vec<_>>();
        if trace
            .iter()
            .any(|s| s.service == order_service::WORKER_SERVICE)
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let one = |service: &str, name: &str| -> Received {
        let found: Vec<&Received> = trace
            .iter()
            .filter(|s| s.service == service && s.name == name)
            .collect();
        assert_eq!(found.len(), 1, "{service} {name:?} in {trace:#?}");
        found[0].clone()
    };

    // The gateway's span is the caller's child, and is what the fan was answered.
    let gateway = one(gateway::SERVICE, "POST /v1/events/{event_id}/orders");
    assert_eq!(gateway.parent_span_id, caller_span);
    assert_eq!(gateway.kind, SpanKind::Server as i32);
    assert_eq!(answered, format!("00-{trace_id}-{}-01", gateway.span_id));
    assert_eq!(gateway.attribute("http.response.status_code"), Some("202"));

    // The order service's request span is the gateway's child.
    let orders = one(order_service::SERVICE, "POST /internal/orders");
    assert_eq!(orders.parent_span_id, gateway.span_id);

    // Every saga step of the order is the order request's child.
    let saga: Vec<&Received> = trace
        .iter()
        .filter(|s| s.service == order_service::SERVICE && s.name.starts_with("saga "))
        .collect();
    assert!(!saga.is_empty(), "no saga span in {trace:#?}");
    for step in &saga {
        assert_eq!(step.parent_span_id, orders.span_id, "{step:#?}");
        assert_eq!(
            step.attribute("boxoffice.order_id"),
            Some(order_id.as_str())
        );
    }

    // The worker's span is the child of the saga step that confirmed.
    let worker: Vec<&Received> = trace
        .iter()
        .filter(|s| s.service == order_service::WORKER_SERVICE)
        .collect();
    assert_eq!(worker.len(), 1, "{trace:#?}");
    assert_eq!(worker[0].kind, SpanKind::Consumer as i32);
    assert_eq!(worker[0].attribute("messaging.system"), Some("kafka"));
    assert!(
        saga.iter().any(|s| s.span_id == worker[0].parent_span_id),
        "the worker's parent is no saga span: {trace:#?}"
    );

    // One tree: every span's parent is in the trace, but the gateway's (the caller's).
    for span in &trace {
        assert!(
            span.span_id == gateway.span_id
                || trace.iter().any(|p| p.span_id == span.parent_span_id),
            "{span:#?} hangs outside the trace"
        );
    }
    // The admin's PUT that created the event is a trace of its own:
    // admission's span, and the order service's inventory write under it.
    let put: Vec<&Received> = all
        .iter()
        .filter(|s| s.service == admission::SERVICE && s.name == "PUT /admin/v1/events/{event_id}")
        .collect();
    assert_eq!(put.len(), 1, "{put:#?}");
    let under_put: Vec<&str> = all
        .iter()
        .filter(|s| s.trace_id == put[0].trace_id && s.parent_span_id == put[0].span_id)
        .map(|s| s.name.as_str())
        .collect();
    assert!(
        under_put.contains(&"PUT /internal/events/{event_id}")
            && under_put.contains(&"PUT /internal/events/{event_id}/settings"),
        "the order service's inventory and settings writes are not under the admin's PUT: {under_put:?}"
    );
    // Probes are not exported.
    assert!(
        received.lock().unwrap().iter().all(|s| s
            .attribute("url.path")
            .is_none_or(|p| p != "/healthz" && p != "/readyz")),
        "a probe was exported"
    );
    stack.stop().await;
}
