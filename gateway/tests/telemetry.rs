//! Telemetry of a real purchase through the whole stack: the metrics named in
//! the design are exported with plausible values, and the trace the gateway
//! starts is the one the ticket worker's span carries.
//!
//! The services run in this one process, so they share one metrics recorder
//! and one log subscriber: every `/metrics` shows every service's series, and
//! the JSON log lines of all services land in one buffer this test reads.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use common::Stack;
use reqwest::StatusCode;
use serde_json::Value;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

/// Every JSON log line written in this process.
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Logs {
    fn lines(&self) -> Vec<Value> {
        let bytes = self.0.lock().unwrap().clone();
        String::from_utf8_lossy(&bytes)
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }
}

/// Installs the process's subscriber before any service starts (theirs is then a no-op).
fn logs() -> Logs {
    static LOGS: OnceLock<Logs> = OnceLock::new();
    LOGS.get_or_init(|| {
        let logs = Logs::default();
        let writer = logs.clone();
        tracing::dispatcher::set_global_default(boxoffice_contract::telemetry::logs(
            "info",
            true,
            false,
            move || writer.clone(),
        ))
        .expect("the first subscriber");
        logs
    })
    .clone()
}

fn monitoring_files() -> Vec<(&'static str, String)> {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../k8s/monitoring/");
    ["prometheus-rules.yaml", "grafana-dashboard.json"]
        .into_iter()
        .map(|file| {
            (
                file,
                std::fs::read_to_string(format!("{dir}{file}")).unwrap(),
            )
        })
        .collect()
}

/// Every `boxoffice_…` name in a text, histogram suffixes stripped.
fn metric_names(text: &str) -> std::collections::BTreeSet<String> {
    let mut names = std::collections::BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("boxoffice_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_lowercase() || c == '_'))
            .unwrap_or(tail.len());
        let name = &tail[..end];
        let name = name.strip_suffix("_bucket").unwrap_or(name);
        names.insert(name.to_owned());
        rest = &tail[end..];
    }
    names
}

/// The alert rules load, and each alert fires on the series it is meant
/// for and not on healthy ones (promtool's rule unit tests); the Grafana
/// dashboard is JSON whose every panel queries something.
#[test]
fn alert_rules_pass_promtool_and_the_dashboard_queries_boxoffice_series() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../k8s/monitoring");
    for args in [
        &["check", "rules", "prometheus-rules.yaml"][..],
        &["test", "rules", "prometheus-rules.test.yaml"][..],
    ] {
        let out = std::process::Command::new("promtool")
            .args(args)
            .current_dir(dir)
            .output()
            .expect("promtool (Debian package prometheus; scripts/test.sh installs it)");
        assert!(
            out.status.success(),
            "promtool {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let (_, text) = &monitoring_files()[1];
    let dashboard: Value = serde_json::from_str(text).unwrap();
    let panels = dashboard["panels"].as_array().unwrap();
    assert!(panels.len() >= 10);
    for panel in panels {
        let targets = panel["targets"].as_array().unwrap();
        assert!(
            targets
                .iter()
                .all(|t| t["expr"].as_str().unwrap().contains("boxoffice_")),
            "{}",
            panel["title"]
        );
    }
    let names = metric_names(text);
    for required in [
        "boxoffice_queue_oldest_wait_seconds",
        "boxoffice_outbox_oldest_age_seconds",
        "boxoffice_consumer_lag",
        "boxoffice_dlq_messages_total",
        "boxoffice_http_requests_total",
    ] {
        assert!(names.contains(required), "the dashboard lacks {required}");
    }
}

/// Readings of shared state that every replica exports alike: admission's
/// of each event (from Redis), the order service's of the outbox (from
/// PostgreSQL), each worker's lag of every partition (from the broker).
const SHARED_READINGS: [&str; 8] = [
    "boxoffice_queue_length",
    "boxoffice_active",
    "boxoffice_admitted_total",
    "boxoffice_admission_rate",
    "boxoffice_queue_oldest_wait_seconds",
    "boxoffice_outbox_backlog",
    "boxoffice_outbox_oldest_age_seconds",
    "boxoffice_consumer_lag",
];

/// `expr` with every `boxoffice_…` selector narrowed to `pod="a"`.
fn only_pod_a(expr: &str) -> String {
    let mut out = String::new();
    let mut rest = expr;
    while let Some(at) = rest.find("boxoffice_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_lowercase() || c == '_'))
            .unwrap_or(tail.len());
        out.push_str(&rest[..at + end]);
        rest = &tail[end..];
        match rest.strip_prefix('{') {
            Some(labels) => {
                out.push_str("{pod=\"a\",");
                rest = labels;
            }
            None => out.push_str("{pod=\"a\"}"),
        }
    }
    out.push_str(rest);
    out
}

/// A dashboard panel reads shared state the same with two replicas as with
/// one: each query of a shared reading, over two pods exporting the same
/// values, equals the same query over pod `a` alone (promtool evaluates it).
#[test]
fn the_dashboard_reads_shared_state_once_with_two_replicas() {
    let (_, text) = &monitoring_files()[1];
    let dashboard: Value = serde_json::from_str(text).unwrap();
    let mut tests = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            let expr = target["expr"].as_str().unwrap().replace("$event", ".*");
            let names = metric_names(&expr);
            if !names.iter().any(|n| SHARED_READINGS.contains(&n.as_str())) {
                continue;
            }
            assert!(
                names.iter().all(|n| SHARED_READINGS.contains(&n.as_str())),
                "{}: a query mixes shared readings with per-process series: {expr}",
                panel["title"]
            );
            let one = only_pod_a(&expr);
            // 0 when every series of both pods has its twin of pod a alone,
            // with the same value; nothing (a failure too) when either is empty.
            let differing = format!(
                "sum(({expr}) != bool ({one})) + count({expr}) - count(({expr}) == bool ({one}))"
            );
            tests.push(serde_json::json!({
                "name": format!("{} {}", panel["title"].as_str().unwrap(), target["refId"]),
                "interval": "15s",
                "input_series": input_series_of_two_pods(),
                "promql_expr_test": [{
                    "expr": differing,
                    "eval_time": "10m",
                    "exp_samples": [{ "labels": "{}", "value": 0 }],
                }],
            }));
        }
    }
    assert!(
        tests.len() >= 6,
        "{} queries of shared readings",
        tests.len()
    );
    let file = std::env::temp_dir().join(format!(
        "boxoffice-dashboard-{}.test.json",
        uuid::Uuid::new_v4()
    ));
    let spec =
        serde_json::json!({ "rule_files": [], "evaluation_interval": "15s", "tests": tests });
    std::fs::write(&file, spec.to_string()).unwrap();
    let out = std::process::Command::new("promtool")
        .args(["test", "rules"])
        .arg(&file)
        .output()
        .expect("promtool (Debian package prometheus; scripts/test.sh installs it)");
    let _ = std::fs::remove_file(&file);
    assert!(
        out.status.success(),
        "a dashboard query counts a shared reading once per replica: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Every shared reading as pods `a` and `b` export it: the same values
/// (only the leader, pod a, knows the admission rate).
fn input_series_of_two_pods() -> Vec<Value> {
    let mut series = Vec::new();
    for pod in ["a", "b"] {
        for (name, labels, values) in [
            ("boxoffice_queue_length", r#"event="e1","#, "5000-10x40"),
            ("boxoffice_active", r#"event="e1","#, "300x40"),
            ("boxoffice_admitted_total", r#"event="e1","#, "0+600x40"),
            (
                "boxoffice_queue_oldest_wait_seconds",
                r#"event="e1","#,
                "30+15x40",
            ),
            ("boxoffice_outbox_backlog", "", "12x40"),
            ("boxoffice_outbox_oldest_age_seconds", "", "3x40"),
            (
                "boxoffice_consumer_lag",
                r#"topic="order-events",partition="0","#,
                "40+2x40",
            ),
            (
                "boxoffice_consumer_lag",
                r#"topic="order-events",partition="1","#,
                "25x40",
            ),
        ] {
            series.push(serde_json::json!({
                "series": format!("{name}{{{labels}instance=\"{pod}:8080\",pod=\"{pod}\"}}"),
                "values": values,
            }));
        }
    }
    series.push(serde_json::json!({
        "series": r#"boxoffice_admission_rate{event="e1",instance="a:8080",pod="a"}"#,
        "values": "100x40",
    }));
    series
}

/// `name{labels} value` lines of a Prometheus text exposition.
fn samples(text: &str) -> Vec<(String, HashMap<String, String>, f64)> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let value: f64 = value.parse().ok()?;
            let (name, labels) = match series.split_once('{') {
                Some((name, rest)) => (name, rest.trim_end_matches('}')),
                None => (series, ""),
            };
            let labels = labels
                .split(',')
                .filter_map(|kv| kv.split_once('='))
                .map(|(k, v)| (k.to_owned(), v.trim_matches('"').to_owned()))
                .collect();
            Some((name.to_owned(), labels, value))
        })
        .collect()
}

/// The value of the one series of `name` whose labels include `with`.
fn value(
    all: &[(String, HashMap<String, String>, f64)],
    name: &str,
    with: &[(&str, &str)],
) -> Option<f64> {
    all.iter()
        .filter(|(n, labels, _)| {
            n == name
                && with
                    .iter()
                    .all(|(k, v)| labels.get(*k).map(String::as_str) == Some(*v))
        })
        .map(|(_, _, v)| *v)
        .reduce(f64::max)
}

async fn scrape(stack: &Stack, base: &str) -> String {
    let response = stack
        .http
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK, "{base}/metrics");
    assert!(response.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/plain"));
    response.text().await.unwrap()
}

#[sqlx::test(migrations = "../order-service/migrations")]
async fn after_a_purchase_every_named_metric_is_exported_with_a_plausible_value(
    pool_options: PgPoolOptions,
    connect: PgConnectOptions,
) {
    logs();
    let stack = Stack::start(pool_options, connect).await;
    let event = format!("m{}", &stack.prefix[1..12]);
    stack
        .purchase(
            &event,
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        )
        .await;
    // The admitter exports per tick; the lag reporter every 5 s.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let all = loop {
        let mut text = String::new();
        for base in [&stack.gateway, &stack.admission, &stack.order_service] {
            text.push_str(&scrape(&stack, base).await);
        }
        let all = samples(&text);
        let lag = value(
            &all,
            "boxoffice_consumer_lag",
            &[("topic", stack.topic.as_str())],
        );
        if lag == Some(0.0) || tokio::time::Instant::now() > deadline {
            break all;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let ev = [("event", event.as_str())];
    type Check<'a> = (&'a str, Option<f64>, &'a dyn Fn(f64) -> bool);
    let checks: Vec<Check> = vec![
        (
            "boxoffice_queue_length",
            value(&all, "boxoffice_queue_length", &ev),
            &|v| v == 0.0,
        ),
        (
            "boxoffice_active",
            value(&all, "boxoffice_active", &ev),
            &|v| (0.0..=1.0).contains(&v),
        ),
        (
            "boxoffice_admitted_total",
            value(&all, "boxoffice_admitted_total", &ev),
            &|v| v == 1.0,
        ),
        (
            "boxoffice_admission_rate",
            value(&all, "boxoffice_admission_rate", &ev),
            &|v| v == 100.0,
        ),
        (
            "boxoffice_http_requests_total (purchase, 202)",
            value(
                &all,
                "boxoffice_http_requests_total",
                &[("route", "/v1/events/{event_id}/orders"), ("status", "202")],
            ),
            &|v| v >= 1.0,
        ),
        (
            "boxoffice_http_requests_total (order service)",
            value(
                &all,
                "boxoffice_http_requests_total",
                &[("route", "/internal/orders"), ("status", "202")],
            ),
            &|v| v >= 1.0,
        ),
        (
            "boxoffice_http_requests_total (admin API)",
            value(
                &all,
                "boxoffice_http_requests_total",
                &[("route", "/admin/v1/events/{event_id}"), ("status", "201")],
            ),
            &|v| v >= 1.0,
        ),
        (
            "boxoffice_http_request_duration_seconds_count",
            value(
                &all,
                "boxoffice_http_request_duration_seconds_count",
                &[("route", "/v1/events/{event_id}/orders")],
            ),
            &|v| v >= 1.0,
        ),
        (
            "boxoffice_http_request_duration_seconds_sum",
            value(
                &all,
                "boxoffice_http_request_duration_seconds_sum",
                &[("route", "/v1/events/{event_id}/orders")],
            ),
            &|v| v > 0.0 && v < 30.0,
        ),
        (
            "boxoffice_join_calls_total",
            value(&all, "boxoffice_join_calls_total", &[]),
            &|v| v >= 1.0,
        ),
        (
            "boxoffice_join_fans_total",
            value(&all, "boxoffice_join_fans_total", &[]),
            &|v| v >= 1.0,
        ),
        (
            "boxoffice_orders_total{confirmed}",
            value(&all, "boxoffice_orders_total", &[("status", "confirmed")]),
            &|v| v >= 1.0,
        ),
        (
            "boxoffice_outbox_backlog",
            value(&all, "boxoffice_outbox_backlog", &[]),
            &|v| v >= 0.0,
        ),
        (
            "boxoffice_outbox_oldest_age_seconds",
            value(&all, "boxoffice_outbox_oldest_age_seconds", &[]),
            &|v| v >= 0.0,
        ),
        (
            "boxoffice_consumer_lag",
            value(
                &all,
                "boxoffice_consumer_lag",
                &[("topic", stack.topic.as_str())],
            ),
            &|v| v == 0.0,
        ),
        (
            "boxoffice_dlq_messages_total",
            value(&all, "boxoffice_dlq_messages_total", &[("class", "fatal")]),
            &|v| v >= 0.0,
        ),
        (
            "boxoffice_worker_service_time_seconds",
            value(&all, "boxoffice_worker_service_time_seconds", &[]),
            &|v| v > 0.0 && v < 10.0,
        ),
    ];
    let wrong: Vec<String> = checks
        .iter()
        .filter(|(_, v, ok)| !v.is_some_and(ok))
        .map(|(name, v, _)| format!("{name} = {v:?}"))
        .collect();
    assert!(wrong.is_empty(), "missing or implausible: {wrong:#?}");

    // What the alert rules and the Grafana dashboard query is what is exported.
    let exported: std::collections::BTreeSet<&str> = all
        .iter()
        .map(|(name, _, _)| {
            ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|suffix| name.strip_suffix(suffix))
                .unwrap_or(name)
        })
        .collect();
    for (file, text) in monitoring_files() {
        for name in metric_names(&text) {
            assert!(
                exported.contains(name.as_str()),
                "{file} queries {name}, which no service exports"
            );
        }
    }
    stack.stop().await;
}

#[sqlx::test(migrations = "../order-service/migrations")]
async fn one_purchase_is_one_trace_from_the_gateway_to_the_ticket_worker(
    pool_options: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let logs = logs();
    let stack = Stack::start_behind_proxy(pool_options, connect).await;
    let event = format!("t{}", &stack.prefix[1..12]);
    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    let (order_id, answered, request_id) = stack
        .purchase_with_id(&event, &format!("00-{trace_id}-00f067aa0ba902b7-01"))
        .await;
    assert!(
        answered.starts_with(&format!("00-{trace_id}-")),
        "{answered}"
    );

    // Each hop's span is a child of the one before: client ▸ gateway request
    // ▸ order service request ▸ saga step ▸ ticket worker message.
    let lines = logs.lines();
    let span_of = |message: &str, span: &str| -> Vec<Value> {
        lines
            .iter()
            .filter(|l| {
                l["fields"]["message"] == message
                    && l["span"]["name"] == span
                    && l["span"]["trace_id"] == trace_id
            })
            .map(|l| l["span"].clone())
            .collect()
    };
    let gateway = span_of("order placed", "request");
    assert_eq!(
        gateway.len(),
        1,
        "the gateway's purchase line lacks the trace"
    );
    assert_eq!(gateway[0]["parent_span_id"], "00f067aa0ba902b7");
    let gateway_span = gateway[0]["span_id"].as_str().unwrap();
    assert_eq!(answered, format!("00-{trace_id}-{gateway_span}-01"));

    let orders = span_of("seats held", "request");
    assert_eq!(orders.len(), 1, "the order service's line lacks the trace");
    assert_eq!(orders[0]["parent_span_id"], gateway_span);
    // The id the gateway made for the purchase (it sent none) is the one
    // on its answer, its line and the order service's.
    assert_eq!(gateway[0]["request_id"], request_id.as_str());
    assert_eq!(orders[0]["request_id"], request_id.as_str());
    let order_span = orders[0]["span_id"].as_str().unwrap();

    let saga: Vec<&Value> = lines
        .iter()
        .filter(|l| l["span"]["name"] == "saga" && l["span"]["order_id"] == order_id.as_str())
        .map(|l| &l["span"])
        .collect();
    assert!(!saga.is_empty(), "no saga line of {order_id}");
    assert!(
        saga.iter()
            .all(|s| s["trace_id"] == trace_id && s["parent_span_id"] == order_span),
        "{saga:#?}"
    );
    let saga_spans: Vec<&str> = saga
        .iter()
        .map(|s| s["span_id"].as_str().unwrap())
        .collect();

    let worker = span_of("tickets issued", "message");
    assert_eq!(worker.len(), 1, "the worker's span lacks the trace");
    assert_eq!(worker[0]["key"], order_id.as_str());
    let parent = worker[0]["parent_span_id"].as_str().unwrap();
    assert!(
        saga_spans.contains(&parent),
        "the worker's parent {parent} is no saga span of the order: {saga_spans:?}"
    );

    // The context rode from the order row through the outbox row (and the
    // Kafka headers) to the worker.
    let (on_order, on_outbox): (Option<String>, Option<String>) = sqlx::query_as(
        "SELECT o.traceparent, x.traceparent FROM orders o
         JOIN outbox x ON x.aggregate_id = o.order_id::text WHERE o.order_id = $1::uuid",
    )
    .bind(&order_id)
    .fetch_one(&stack.pool)
    .await
    .unwrap();
    assert_eq!(on_order, Some(format!("00-{trace_id}-{order_span}-01")));
    assert_eq!(on_outbox, Some(format!("00-{trace_id}-{parent}-01")));
    stack.stop().await;
}
