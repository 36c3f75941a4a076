//! Logs, traces and metrics, the same way in every binary.
//!
//! - [`init`]: `RUST_LOG` filters; `--log-json` writes one JSON object a line,
//!   with the fields of every enclosing span (`request_id`, `trace_id`, …;
//!   written by [`crate::log_fields`] and [`crate::request_log`]); plain text
//!   is coloured only on a terminal.
//! - [`Traced`]: the HTTP middleware every service wraps its routes in: the
//!   request's `request` span in its log lines (with its W3C trace id),
//!   `boxoffice_http_requests_total` and
//!   `boxoffice_http_request_duration_seconds`, and the `traceparent` of the
//!   request's trace on the answer.
//! - [`prometheus`] / [`metrics_endpoint`]: the process's recorder and `/metrics`.

use std::cell::RefCell;
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use axum::extract::{MatchedPath, Request};
use axum::http::{HeaderName, HeaderValue, Method, StatusCode};
use axum::response::Response;
use metrics::{Counter, Histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tracing_subscriber::filter::Targets;
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::EnvFilter;

use crate::log_fields::{JsonSpanFields, TextFields};
use crate::otlp::{self, Attribute as KeyValue};
use crate::request_log::{with_request, JsonLines, RequestLog, TextLines};
use crate::trace::{TraceContext, TRACEPARENT};

/// Installs the process's log subscriber and metrics recorder, before
/// anything is logged or counted (a second call is a no-op, so tests
/// starting several services in one process may all call it).
pub fn init(json: bool) {
    init_with(
        &std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()),
        json,
    );
}

/// [`init`] with the log directives given rather than read from `RUST_LOG`
/// (the edge benchmark's own knob).
pub fn init_with(directives: &str, json: bool) {
    use tracing_subscriber::util::SubscriberInitExt;

    prometheus();
    // Colour codes in a file, a pipe or a container's log are noise for the
    // reader and cost every span (field names are styled per span).
    let terminal = std::io::IsTerminal::is_terminal(&std::io::stdout());
    let _ = logs(directives, json, terminal, std::io::stdout).try_init();
}

/// The log subscriber of [`init_with`], writing its lines to `writer`
/// (tests read their own): JSON lines, or plain text, coloured if `ansi`.
pub fn logs<W>(directives: &str, json: bool, ansi: bool, writer: W) -> tracing::Dispatch
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    use tracing_subscriber::layer::SubscriberExt;

    let (fixed, dynamic) = log_filter(directives);
    // The builder's own filter lets all through (its default is `info`):
    // the filter of the directives decides. No colours in JSON.
    let builder = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(ansi && !json)
        .with_writer(writer);
    if json {
        builder
            .fmt_fields(JsonSpanFields)
            .event_format(JsonLines::default())
            .finish()
            .with(fixed)
            .with(dynamic)
            .into()
    } else {
        builder
            .fmt_fields(TextFields)
            .event_format(TextLines::default())
            .finish()
            .with(fixed)
            .with(dynamic)
            .into()
    }
}

/// The filter of `directives` (`RUST_LOG`'s syntax): plain `target=level`
/// directives, the usual kind, as a fixed filter (`Targets`); directives
/// naming spans or fields as an `EnvFilter`, which needs them. `EnvFilter`
/// takes a lock shared by every thread at each span's creation, entry, exit
/// and close even when it has no such directive (tracing's PR #3487 skips
/// it, unreleased as of tracing-subscriber 0.3.23). No directives, or
/// directives that parse as neither, mean `info`. (A request's `request`
/// span is no `tracing` span: `[request]` directives match nothing.)
fn log_filter(directives: &str) -> (Option<Targets>, Option<EnvFilter>) {
    let directives = match directives.trim() {
        "" => "info",
        given => given,
    };
    let info = || {
        (
            Some(Targets::new().with_default(tracing::Level::INFO)),
            None,
        )
    };
    // `Targets` would read `[span]` as a target's name.
    if directives.contains(['[', '{']) {
        return match EnvFilter::try_new(directives) {
            Ok(dynamic) => (None, Some(dynamic)),
            Err(_) => info(),
        };
    }
    match directives.parse::<Targets>() {
        Ok(fixed) => (Some(fixed), None),
        Err(_) => info(),
    }
}

/// Histogram buckets (seconds) of every `*_seconds` histogram: 1 ms to 30 s.
const SECONDS_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// The process's Prometheus recorder, installed on first use. Every service
/// serves `render()` at `/metrics`; several services in one test process
/// share it, which is harmless.
pub fn prometheus() -> &'static PrometheusHandle {
    static HANDLE: std::sync::OnceLock<PrometheusHandle> = std::sync::OnceLock::new();
    HANDLE.get_or_init(|| {
        let recorder = PrometheusBuilder::new()
            .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), SECONDS_BUCKETS)
            .expect("non-empty buckets")
            .build_recorder();
        let handle = recorder.handle();
        // Histogram samples are kept raw until folded into buckets; without a
        // scrape they would pile up, so fold them every few seconds.
        let upkeep = handle.clone();
        let _ = std::thread::Builder::new()
            .name("metrics-upkeep".into())
            .spawn(move || loop {
                std::thread::sleep(std::time::Duration::from_secs(5));
                upkeep.run_upkeep();
            });
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

/// Inner half of [`Traced`] where `Traced` wraps more than a router: tells
/// the request, current while the router calls its route, which route it
/// took (`request_log::set_route`), so that its answer is counted under it
/// whoever answers: the route, or a layer between `Traced` and the router
/// (a passed deadline's 503). `routes.layer(MarkRoute)`: a plain layer
/// rather than `axum::middleware::from_fn`, which would box the next service
/// and the future of every request; and the route rides with the request's
/// log, as the router's `MatchedPath` rides with the request, rather than
/// on the response, whose extensions (a map allocated for it) it would be
/// alone in.
#[derive(Debug, Clone, Copy)]
pub struct MarkRoute;

impl<S> tower::Layer<S> for MarkRoute {
    type Service = MarkRouteService<S>;

    fn layer(&self, inner: S) -> MarkRouteService<S> {
        MarkRouteService(inner)
    }
}

/// The service of [`MarkRoute`].
#[derive(Debug, Clone)]
pub struct MarkRouteService<S>(S);

impl<S> tower::Service<Request> for MarkRouteService<S>
where
    S: tower::Service<Request, Response = Response>,
{
    type Response = Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, request: Request) -> Self::Future {
        if let Some(route) = request.extensions().get::<MatchedPath>() {
            crate::request_log::set_route(route);
        }
        self.0.call(request)
    }
}

/// The `traceparent` name, made once: a `&'static str` is parsed again on
/// each lookup and insert.
const TRACEPARENT_HEADER: HeaderName = HeaderName::from_static(TRACEPARENT);

/// The `x-request-id` name, made once.
const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// Counts and times one answer. Looking a series up in the registry (a key
/// built from owned label strings, hashed) costs more than updating it, so
/// each thread keeps the handles it has used: by route, in a map hashed with
/// `foldhash` (the routes are the router's own paths, not a client's
/// strings), and by status in a short list (a route answers with a few).
fn record_http(route: &str, status: StatusCode, seconds: f64) {
    type Handles =
        HashMap<String, (Histogram, Vec<(StatusCode, Counter)>), foldhash::fast::RandomState>;
    thread_local! {
        static HANDLES: RefCell<Handles> = RefCell::default();
    }
    HANDLES.with(|handles| {
        let mut handles = handles.borrow_mut();
        let (histogram, counters) = match handles.get_mut(route) {
            Some(handles) => handles,
            None => {
                let histogram = metrics::histogram!(
                    "boxoffice_http_request_duration_seconds",
                    "route" => route.to_owned()
                );
                handles
                    .entry(route.to_owned())
                    .or_insert((histogram, Vec::new()))
            }
        };
        histogram.record(seconds);
        match counters.iter().find(|(answered, _)| *answered == status) {
            Some((_, counter)) => counter.increment(1),
            None => {
                let counter = metrics::counter!(
                    "boxoffice_http_requests_total",
                    "route" => route.to_owned(),
                    "status" => status.as_str().to_owned()
                );
                counter.increment(1);
                counters.push((status, counter));
            }
        }
    });
}

/// The span, the trace context, the HTTP metrics, as a tower layer:
/// `Router::layer(Traced(Some(NAME)))` (or `ServiceBuilder::layer`). The
/// request's span is a child of the caller's (`traceparent`), or a new
/// trace's root; handlers find its [`TraceContext`] in the request's
/// extensions and send it downstream as is, so the callee's span is a child
/// of this one. Every line logged while the request is answered names it as
/// its outermost span, `request{method path request_id trace_id span_id
/// parent_span_id}` (see [`crate::request_log`]: no `tracing` span is
/// opened). With a service's name (`service.name`) the span is also
/// exported as that service's (see [`otlp`]); with `None`, logged and
/// counted only.
///
/// A plain layer rather than `axum::middleware::from_fn`, which boxes the
/// next service and every request's future and clones the next service for
/// each request: the gateway's outermost layers, where every request of a
/// crowd passes, are all plain layers.
#[derive(Debug, Clone, Copy)]
pub struct Traced(pub Option<&'static str>);

impl<S> tower::Layer<S> for Traced {
    type Service = TracedService<S>;

    fn layer(&self, inner: S) -> TracedService<S> {
        TracedService {
            inner,
            service: self.0,
        }
    }
}

/// The service of [`Traced`].
#[derive(Debug, Clone)]
pub struct TracedService<S> {
    inner: S,
    service: Option<&'static str>,
}

impl<S> tower::Service<Request> for TracedService<S>
where
    S: tower::Service<Request, Response = Response>,
{
    type Response = Response;
    type Error = S::Error;
    type Future = Observed<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request) -> Self::Future {
        let request_id = request.headers().get(&X_REQUEST_ID);
        let (observation, log) = Observation::begin(
            self.service,
            &request,
            request_id.and_then(|v| v.to_str().ok()).unwrap_or(""),
        );
        request.extensions_mut().insert(observation.trace());
        // The layers below do their first part here, in `call`: with the
        // request current too.
        let mut log = Some(log);
        let future = with_request(&mut log, || self.inner.call(request));
        Observed {
            future: Some(future),
            observation: Some(observation),
            log,
        }
    }
}

pin_project_lite::pin_project! {
    /// The answer of [`TracedService`], counted and timed when it comes.
    pub struct Observed<F> {
        // Always there until dropped, with the request current (as a span's
        // `Instrumented` does): what it logs on the way out, answered or
        // given up (the client gone), is the request's too.
        #[pin]
        future: Option<F>,
        observation: Option<Observation>,
        // The request, current while the answer is polled or dropped.
        log: Option<RequestLog>,
    }

    impl<F> PinnedDrop for Observed<F> {
        fn drop(this: Pin<&mut Self>) {
            let mut this = this.project();
            with_request(this.log, || this.future.set(None));
        }
    }
}

impl<F, E> Future for Observed<F>
where
    F: Future<Output = Result<Response, E>>,
{
    type Output = Result<Response, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let (future, observation) = (this.future, this.observation);
        with_request(this.log, || {
            let future = future.as_pin_mut().expect("there until dropped");
            let response = std::task::ready!(future.poll(cx))?;
            let observation = observation.take().expect("polled after it answered");
            Poll::Ready(Ok(observation.finish(response)))
        })
    }
}

/// One request's telemetry, from when it comes to when it is answered:
/// what [`Traced`] keeps for a request, for a layer that does its work
/// itself (the gateway's edge, which does it in the same service as its
/// limits, so that a request's future is not moved through one future per
/// layer). [`Observation::begin`] it, call the routes and poll their answer
/// with its [`RequestLog`] current ([`with_request`]), and
/// [`Observation::finish`] the answer, still current.
pub struct Observation {
    started: Instant,
    cx: TraceContext,
    matched: Option<MatchedPath>,
    exported: otlp::Span,
    /// The method, while the span is exported.
    method: Option<Method>,
}

impl Observation {
    /// The request's span and trace context (for its extensions:
    /// [`Observation::trace`]), and its exported span if `service` exports
    /// them; with what its log lines say of it (`request_id` among them).
    pub fn begin(
        service: Option<&'static str>,
        request: &Request,
        request_id: &str,
    ) -> (Self, RequestLog) {
        let started = Instant::now();
        let (cx, parent) = TraceContext::span_under(
            request
                .headers()
                .get(&TRACEPARENT_HEADER)
                .and_then(|v| v.to_str().ok()),
        );
        let matched = request.extensions().get::<MatchedPath>().cloned();
        let log = RequestLog::new(
            request.method().clone(),
            request.uri().path(),
            request_id,
            cx,
            parent,
        );
        // Probes, scrapes and the internal plane's polling (admission asks the
        // order service for its health and kept settings every second or two)
        // are not worth a trace each.
        let service = service.filter(|_| {
            otlp::enabled()
                && !matches!(
                    request.uri().path(),
                    "/healthz"
                        | "/readyz"
                        | "/metrics"
                        | "/internal/health"
                        | "/internal/event-settings"
                )
        });
        let mut exported = match service {
            Some(service) => otlp::Span::start(
                service,
                format!(
                    "{} {}",
                    request.method(),
                    matched.as_ref().map_or("", MatchedPath::as_str)
                ),
                otlp::Kind::Server,
                &cx,
                parent,
            ),
            None => otlp::Span::none(),
        };
        let method = exported.is_recording().then(|| request.method().clone());
        if exported.is_recording() {
            exported.set_attribute(KeyValue::new(
                "http.request.method",
                request.method().as_str().to_owned(),
            ));
            exported.set_attribute(KeyValue::new("url.path", request.uri().path().to_owned()));
        }
        let observation = Self {
            started,
            cx,
            matched,
            exported,
            method,
        };
        (observation, log)
    }

    /// The request's trace context: what its handlers send downstream.
    pub fn trace(&self) -> TraceContext {
        self.cx
    }

    /// Counts and times the answer, ends the exported span and sends the
    /// trace context back with the answer. Called with the request current
    /// ([`with_request`]): the route it took may be known only there.
    pub fn finish(self, mut response: Response) -> Response {
        let Self {
            started,
            cx,
            matched,
            mut exported,
            method,
        } = self;
        let status = response.status();
        let elapsed = started.elapsed();
        if status.is_server_error() {
            tracing::warn!(
                status = status.as_u16(),
                ?elapsed,
                "answered with a server error"
            );
        }
        // Matched before `Traced` (inside a router), or after it (a router
        // inside, with `MarkRoute`): the request is current here.
        let marked = matched.is_none().then(crate::request_log::route).flatten();
        let route = matched
            .as_ref()
            .or(marked.as_ref())
            .map_or("unmatched", MatchedPath::as_str);
        record_http(route, status, elapsed.as_secs_f64());
        if let Some(method) = method {
            if matched.is_none() {
                exported.update_name(format!("{method} {route}"));
            }
            exported.set_attribute(KeyValue::new("http.route", route.to_owned()));
            exported.set_attribute(KeyValue::new(
                "http.response.status_code",
                i64::from(status.as_u16()),
            ));
            if status.is_server_error() {
                exported.set_status(otlp::Status::error(status.to_string()));
            }
        }
        if let Ok(value) = HeaderValue::from_bytes(&cx.to_header_bytes()) {
            response.headers_mut().insert(TRACEPARENT_HEADER, value);
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use tracing_subscriber::layer::SubscriberExt;

    use super::*;
    use crate::log_fields::tests::Sink;

    /// Each answer is counted under its own route and status, and timed
    /// under its route, with the handles the thread keeps.
    #[test]
    fn answers_are_counted_by_route_and_status() {
        let recorder = PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        metrics::with_local_recorder(&recorder, || {
            for (route, status) in [
                ("/a", StatusCode::OK),
                ("/a", StatusCode::TOO_MANY_REQUESTS),
                ("/a", StatusCode::OK),
                ("/b", StatusCode::OK),
                ("/a", StatusCode::OK),
            ] {
                record_http(route, status, 0.001);
            }
        });
        let text = handle.render();
        for line in [
            r#"boxoffice_http_requests_total{route="/a",status="200"} 3"#,
            r#"boxoffice_http_requests_total{route="/a",status="429"} 1"#,
            r#"boxoffice_http_requests_total{route="/b",status="200"} 1"#,
            r#"boxoffice_http_request_duration_seconds_count{route="/a"} 4"#,
            r#"boxoffice_http_request_duration_seconds_count{route="/b"} 1"#,
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
        }
    }

    /// Around a router (as the gateway's edge layers are), an answer is
    /// counted under the route the router matched, with `MarkRoute` on its
    /// routes: also an answer that a layer between the two gave in the
    /// route's place (as the gateway's deadline gives a 503), which carries
    /// nothing of the route's own; a path no route matches, under
    /// "unmatched".
    #[test]
    fn answers_from_behind_a_router_are_counted_by_its_route() {
        use tower::{ServiceBuilder, ServiceExt};
        let recorder = PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let get = |path: &str| Request::get(path).body(axum::body::Body::empty()).unwrap();
        metrics::with_local_recorder(&recorder, || {
            runtime.block_on(async {
                let routes = axum::Router::new()
                    .route("/items/{id}", axum::routing::get(|| async { "an item" }))
                    .layer(MarkRoute);
                let traced = ServiceBuilder::new()
                    .layer(Traced(None))
                    .service(routes.clone());
                for (path, status) in [
                    ("/items/1", StatusCode::OK),
                    ("/items/2", StatusCode::OK),
                    ("/nothing", StatusCode::NOT_FOUND),
                ] {
                    let response = traced.clone().oneshot(get(path)).await.unwrap();
                    assert_eq!(response.status(), status, "{path}");
                }
                let cut_short = ServiceBuilder::new()
                    .layer(Traced(None))
                    .map_response(|_: Response| {
                        let mut response = Response::new(axum::body::Body::empty());
                        *response.status_mut() = StatusCode::GATEWAY_TIMEOUT;
                        response
                    })
                    .service(routes);
                let response = cut_short.oneshot(get("/items/3")).await.unwrap();
                assert_eq!(response.status(), StatusCode::GATEWAY_TIMEOUT);
            })
        });
        let text = handle.render();
        for line in [
            r#"boxoffice_http_requests_total{route="/items/{id}",status="200"} 2"#,
            r#"boxoffice_http_requests_total{route="unmatched",status="404"} 1"#,
            r#"boxoffice_http_requests_total{route="/items/{id}",status="504"} 1"#,
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
        }
    }

    /// The messages logged by `emit` under `directives`.
    fn logged(directives: &str, emit: impl FnOnce()) -> String {
        let sink = Sink::default();
        let writer = sink.clone();
        let (fixed, dynamic) = log_filter(directives);
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish()
            .with(fixed)
            .with(dynamic);
        tracing::subscriber::with_default(subscriber, emit);
        let text = String::from_utf8(sink.0.lock().unwrap().clone()).unwrap();
        text
    }

    /// What the layers below do in `call`, before their future is polled,
    /// is logged in the request's span, as with `from_fn`, and so is a
    /// server error; and the answer carries the trace context.
    #[tokio::test]
    async fn the_traced_layer_logs_in_the_requests_span() {
        use tower::{Service, ServiceExt};
        let inner = tower::service_fn(|request: Request| {
            tracing::info!("called");
            let broken = request.uri().path() == "/v1/broken";
            async move {
                tracing::info!("answering");
                let mut response = Response::new(axum::body::Body::empty());
                if broken {
                    *response.status_mut() = StatusCode::BAD_GATEWAY;
                }
                Ok::<_, std::convert::Infallible>(response)
            }
        });
        let mut traced = tower::Layer::layer(&Traced(Some("test")), inner);
        let request = Request::get("/v1/x")
            .header("x-request-id", "req-7")
            .body(axum::body::Body::empty())
            .unwrap();
        let sink = Sink::default();
        let writer = sink.clone();
        let _guard =
            tracing::dispatcher::set_default(&logs("info", false, false, move || writer.clone()));
        let response = traced.ready().await.unwrap().call(request).await.unwrap();
        assert!(response.headers().contains_key("traceparent"));
        let text = String::from_utf8(sink.0.lock().unwrap().clone()).unwrap();
        for message in ["called", "answering"] {
            let line = text
                .lines()
                .find(|l| l.ends_with(message))
                .unwrap_or_else(|| panic!("no {message}: {text}"));
            assert!(
                line.contains("request{method=GET path=/v1/x request_id=req-7 "),
                "{line}"
            );
        }
        assert!(!text.contains("server error"), "{text}");
        let broken = Request::get("/v1/broken")
            .header("x-request-id", "req-8")
            .body(axum::body::Body::empty())
            .unwrap();
        let response = traced.ready().await.unwrap().call(broken).await.unwrap();
        assert_eq!(response.status(), StatusCode::BAD_GATEWAY);
        let text = String::from_utf8(sink.0.lock().unwrap().clone()).unwrap();
        let line = text
            .lines()
            .find(|l| l.contains("answered with a server error"))
            .unwrap_or_else(|| panic!("no server error line: {text}"));
        assert!(
            line.contains("request{method=GET path=/v1/broken request_id=req-8 ")
                && line.contains("status=502"),
            "{line}"
        );
    }

    /// An answer given up before it comes (the client gone) is dropped with
    /// the request current: what it logs then is the request's.
    #[test]
    fn an_answer_given_up_is_dropped_in_the_requests_span() {
        use tower::Service;

        /// Logs when dropped.
        struct Goodbye;

        impl Drop for Goodbye {
            fn drop(&mut self) {
                tracing::info!("given up");
            }
        }

        let inner = tower::service_fn(|_: Request| async {
            let _goodbye = Goodbye;
            std::future::pending::<()>().await;
            Ok::<_, std::convert::Infallible>(Response::new(axum::body::Body::empty()))
        });
        let mut traced = tower::Layer::layer(&Traced(None), inner);
        let request = Request::get("/v1/slow")
            .header("x-request-id", "req-9")
            .body(axum::body::Body::empty())
            .unwrap();
        let sink = Sink::default();
        let writer = sink.clone();
        tracing::dispatcher::with_default(
            &logs("info", false, false, move || writer.clone()),
            || {
                let mut answer = Box::pin(traced.call(request));
                let mut cx = Context::from_waker(std::task::Waker::noop());
                assert!(answer.as_mut().poll(&mut cx).is_pending());
                drop(answer);
                tracing::info!("after");
            },
        );
        let text = String::from_utf8(sink.0.lock().unwrap().clone()).unwrap();
        let line = text
            .lines()
            .find(|l| l.ends_with("given up"))
            .unwrap_or_else(|| panic!("no line: {text}"));
        assert!(
            line.contains("request{method=GET path=/v1/slow request_id=req-9 "),
            "{line}"
        );
        let after = text.lines().find(|l| l.ends_with("after")).unwrap();
        assert!(!after.contains("request{"), "{after}");
    }

    #[test]
    fn target_and_level_directives_filter_without_env_filter() {
        assert!(matches!(log_filter("warn,special=debug"), (Some(_), None)));
        let text = logged("warn,special=debug", || {
            tracing::info!("an info line");
            tracing::warn!("a warning");
            tracing::debug!(target: "special", "a special debug line");
            tracing::trace!(target: "special", "a special trace line");
        });
        assert!(!text.contains("an info line"), "{text}");
        assert!(text.contains("a warning"), "{text}");
        assert!(text.contains("a special debug line"), "{text}");
        assert!(!text.contains("trace line"), "{text}");
    }

    #[test]
    fn span_directives_still_filter_by_span() {
        assert!(matches!(log_filter("warn,[wanted]=debug"), (None, Some(_))));
        let text = logged("warn,[wanted]=debug", || {
            tracing::debug!("debug outside");
            let span = tracing::info_span!("wanted");
            let _entered = span.enter();
            tracing::debug!("debug inside");
        });
        assert!(!text.contains("debug outside"), "{text}");
        assert!(text.contains("debug inside"), "{text}");
    }

    #[test]
    fn no_directives_or_garbage_mean_info() {
        for directives in ["", "  ", "warn=loud", "info,[{=debug"] {
            let text = logged(directives, || {
                tracing::debug!("a debug line");
                tracing::info!("an info line");
            });
            assert!(!text.contains("a debug line"), "{directives:?}: {text}");
            assert!(text.contains("an info line"), "{directives:?}: {text}");
        }
    }
}
