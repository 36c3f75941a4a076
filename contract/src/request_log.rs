//! The request being answered, in every line logged while it is, without a
//! `tracing` span per request.
//!
//! A line logged while a service answers a request names the request as its
//! outermost span, `request{method path request_id trace_id span_id
//! parent_span_id}`, so that a request id or a trace id finds every line of
//! it. That used to be a real `tracing` span, opened for every request:
//! its six fields formatted into a string when it opened, a slot in the
//! registry, and a reference count changed at each of the four or so times
//! the request's future was polled, on whichever core polled it. With it
//! the gateway's status poll cost about 3 µs more CPU than with logging at
//! `warn`, a third of what the gateway spends over a bare handler (the edge
//! benchmark on a 2-core VM, `BENCHMARKS.md`), while almost no request logs
//! a line.
//!
//! Now the request's fields are kept as they are, in a [`RequestLog`] that
//! the service's answer carries, and [`with_request`] makes it this thread's
//! current request while the service is called or the answer polled or
//! dropped (moved in and back out, as tokio's task-locals do; no reference
//! counts): 1.4 µs less a status poll than the span in the same benchmark. The
//! lines' formatters write it only when a line is logged: [`TextLines`]
//! exactly as the span was written (byte for byte, colours too), and
//! [`JsonLines`] as the first of the line's `spans`, and as its `span` when
//! no other is open.
//!
//! What changes: `RUST_LOG` span directives naming `request`
//! (`[request]=debug`) match nothing, and a future spawned by a handler
//! logs without the request, as it did before unless it was instrumented
//! with the request's span (no service did).

use std::cell::RefCell;
use std::fmt::{self, Write};

use axum::extract::MatchedPath;
use axum::http::Method;
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::{Format, Full, Json, Writer};
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

use crate::log_fields::Escaped;
use crate::trace::{ParentSpan, TraceContext};

/// What the lines logged while a request is answered say of it.
#[derive(Debug, Clone)]
pub struct RequestLog {
    method: Method,
    /// The path, then the request id: one allocation for both.
    text: String,
    path_len: usize,
    cx: TraceContext,
    parent: ParentSpan,
    /// The route the router matched, once it has ([`set_route`]): not in
    /// the lines, but kept with the request for its metrics.
    route: Option<MatchedPath>,
}

impl RequestLog {
    pub fn new(
        method: Method,
        path: &str,
        request_id: &str,
        cx: TraceContext,
        parent: ParentSpan,
    ) -> Self {
        let mut text = String::with_capacity(path.len() + request_id.len());
        text.push_str(path);
        text.push_str(request_id);
        Self {
            method,
            text,
            path_len: path.len(),
            cx,
            parent,
            route: None,
        }
    }

    /// The route the router matched, if it did and said so ([`set_route`]).
    fn route(&self) -> Option<&MatchedPath> {
        self.route.as_ref()
    }

    /// The fields, in the order the span had them.
    fn fields(&self, mut field: impl FnMut(&str, &dyn fmt::Display) -> fmt::Result) -> fmt::Result {
        field("method", &self.method)?;
        field("path", &&self.text[..self.path_len])?;
        field("request_id", &&self.text[self.path_len..])?;
        field("trace_id", &self.cx.trace_id_hex())?;
        field("span_id", &self.cx.span_id_hex())?;
        field("parent_span_id", &self.parent)
    }

    /// As the plain-text lines write a span: `request{method=GET …}:`, the
    /// name and braces bold, the field names italic and `:` and `=` dimmed
    /// with colours on.
    fn write_text(&self, writer: &mut Writer<'_>) -> fmt::Result {
        let ansi = writer.has_ansi_escapes();
        let (bold, italic, dimmed, reset) = if ansi {
            (BOLD, ITALIC, DIMMED, RESET)
        } else {
            ("", "", "", "")
        };
        write!(writer, "{bold}request{reset}{bold}{{{reset}")?;
        let mut first = true;
        self.fields(|name, value| {
            if !std::mem::take(&mut first) {
                writer.write_char(' ')?;
            }
            write!(writer, "{italic}{name}{reset}{dimmed}={reset}{value}")
        })?;
        write!(writer, "{bold}}}{reset}{dimmed}:{reset}")
    }

    /// As the JSON lines write a span: `{"method":"GET",…,"name":"request"}`.
    fn write_json(&self, out: &mut String) -> fmt::Result {
        out.push('{');
        self.fields(|name, value| {
            out.push('"');
            out.push_str(name);
            out.push_str("\":\"");
            write!(Escaped(&mut *out), "{value}")?;
            out.push_str("\",");
            Ok(())
        })?;
        out.push_str("\"name\":\"request\"}");
        Ok(())
    }
}

thread_local! {
    /// The request being answered on this thread, while its service is
    /// called or its answer polled.
    static CURRENT: RefCell<Option<RequestLog>> = const { RefCell::new(None) };
}

/// Runs `f` with `request` (if any) as this thread's current request: moved
/// in, and back out when `f` returns or panics, the request current before
/// it current again.
pub fn with_request<R>(request: &mut Option<RequestLog>, f: impl FnOnce() -> R) -> R {
    /// Swaps the request back out on the way out.
    struct Restore<'a>(&'a mut Option<RequestLog>);

    impl Drop for Restore<'_> {
        fn drop(&mut self) {
            swap_current(self.0);
        }
    }

    swap_current(request);
    let _restore = Restore(request);
    f()
}

fn swap_current(request: &mut Option<RequestLog>) {
    // Only while the thread's locals are torn down is there none to swap with.
    let _ = CURRENT.try_with(|current| std::mem::swap(request, &mut current.borrow_mut()));
}

/// Tells this thread's current request, if any, which route it took: for a
/// layer around a router (the router matches inside it, and the request,
/// with its `MatchedPath`, goes on to the handler). Called from inside the
/// router ([`crate::telemetry::MarkRoute`]), while the request is current.
pub fn set_route(route: &MatchedPath) {
    let _ = CURRENT.try_with(|current| {
        if let Ok(mut current) = current.try_borrow_mut() {
            if let Some(request) = current.as_mut() {
                request.route = Some(route.clone());
            }
        }
    });
}

/// This thread's current request's route, if it has one ([`set_route`]).
pub fn route() -> Option<MatchedPath> {
    current(|request| request.and_then(RequestLog::route).cloned())
}

/// This thread's current request's id, if there is a request and it has
/// one: what a handler sends on to the services it calls (the gateway's
/// edge keeps an id it made here only, not in the request's headers).
pub fn request_id() -> Option<String> {
    current(|request| {
        request
            .map(|request| &request.text[request.path_len..])
            .filter(|id| !id.is_empty())
            .map(str::to_owned)
    })
}

/// `f` of this thread's current request, if any.
fn current<R>(f: impl FnOnce(Option<&RequestLog>) -> R) -> R {
    let mut f = Some(f);
    let mut call = |request: Option<&RequestLog>| (f.take().expect("called once"))(request);
    // None while the thread's locals are torn down, or (defensively) while
    // a request is swapped in or out.
    CURRENT
        .try_with(|current| {
            let borrowed = current.try_borrow().ok();
            call(borrowed.as_deref().and_then(Option::as_ref))
        })
        .unwrap_or_else(|_| call(None))
}

const BOLD: &str = "\x1b[1m";
const DIMMED: &str = "\x1b[2m";
const ITALIC: &str = "\x1b[3m";
const RESET: &str = "\x1b[0m";

/// The plain-text lines: `tracing-subscriber`'s own (`Full`), byte for byte,
/// with the current request as the outermost span. The time and level are
/// written here, the rest (spans, target, fields) by `Full` itself.
#[derive(Debug)]
pub struct TextLines<T = SystemTime> {
    timer: T,
    rest: Format<Full, ()>,
}

impl Default for TextLines {
    fn default() -> Self {
        Self::with_timer(SystemTime)
    }
}

impl<T> TextLines<T> {
    pub fn with_timer(timer: T) -> Self {
        Self {
            timer,
            rest: tracing_subscriber::fmt::format()
                .without_time()
                .with_level(false),
        }
    }
}

impl<S, N, T> FormatEvent<S, N> for TextLines<T>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
    T: FormatTime,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let ansi = writer.has_ansi_escapes();
        if ansi {
            writer.write_str(DIMMED)?;
        }
        if self.timer.format_time(&mut writer).is_err() {
            writer.write_str("<unknown time>")?;
        }
        if ansi {
            writer.write_str(RESET)?;
        }
        let level = event.metadata().level();
        let (colour, level) = match *level {
            Level::TRACE => ("\x1b[35m", "TRACE"),
            Level::DEBUG => ("\x1b[34m", "DEBUG"),
            Level::INFO => ("\x1b[32m", " INFO"),
            Level::WARN => ("\x1b[33m", " WARN"),
            Level::ERROR => ("\x1b[31m", "ERROR"),
        };
        if ansi {
            write!(writer, " {colour}{level}{RESET} ")?;
        } else {
            write!(writer, " {level} ")?;
        }
        current(|request| match request {
            Some(request) => {
                request.write_text(&mut writer)?;
                // `Full` writes a space after the last span, if it writes any.
                match ctx.event_scope() {
                    Some(_) => Ok(()),
                    None => writer.write_char(' '),
                }
            }
            None => Ok(()),
        })?;
        self.rest.format_event(ctx, writer, event)
    }
}

/// The JSON lines: `tracing-subscriber`'s own, with the current request
/// first in `spans`, and as `span` when no other span is open.
#[derive(Debug)]
pub struct JsonLines(Format<Json>);

impl Default for JsonLines {
    fn default() -> Self {
        Self(
            tracing_subscriber::fmt::format()
                .json()
                .with_current_span(true)
                .with_span_list(true),
        )
    }
}

impl<S, N> FormatEvent<S, N> for JsonLines
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        current(|request| {
            let Some(request) = request else {
                return self.0.format_event(ctx, writer, event);
            };
            let mut line = String::new();
            self.0.format_event(ctx, Writer::new(&mut line), event)?;
            let mut span = String::new();
            request.write_json(&mut span)?;
            // `"spans":[` is the span list's start and nothing else: a string
            // would have `\"` for its quotes, and only the list is an array.
            // It is the line's last member.
            const LIST: &str = "\"spans\":[";
            match line.rfind(LIST) {
                Some(at) => {
                    span.push(',');
                    line.insert_str(at + LIST.len(), &span);
                }
                None => {
                    let end = line.trim_end().len().saturating_sub(1);
                    line.insert_str(end, &format!(",\"span\":{span},{LIST}{span}]"));
                }
            }
            writer.write_str(&line)
        })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::Value;
    use tracing_subscriber::fmt::format::DefaultFields;

    use super::*;
    use crate::log_fields::tests::Sink;
    use crate::log_fields::{JsonSpanFields, TextFields};

    /// A clock that always says the same, so lines compare byte for byte.
    struct Fixed;

    impl FormatTime for Fixed {
        fn format_time(&self, w: &mut Writer<'_>) -> fmt::Result {
            w.write_str("2026-12-04T10:00:00.000000Z")
        }
    }

    fn request(request_id: &str, parent: Option<&str>) -> RequestLog {
        let (cx, parent) = TraceContext::span_under(parent);
        RequestLog::new(Method::POST, "/v1/events/ev/queue", request_id, cx, parent)
    }

    /// The same request as a real span, as every request had one.
    fn span_of(request: &RequestLog) -> tracing::Span {
        tracing::info_span!(
            "request",
            method = %request.method,
            path = %&request.text[..request.path_len],
            request_id = %&request.text[request.path_len..],
            trace_id = %request.cx.trace_id_hex(),
            span_id = %request.cx.span_id_hex(),
            parent_span_id = %request.parent,
        )
    }

    /// Lines outside a request, inside one, with spans opened inside it,
    /// and outside again; `inside` runs each part with the request current.
    fn emit(inside: &dyn Fn(&dyn Fn())) {
        tracing::info!("before");
        inside(&|| {
            tracing::info!(quantity = 2, "plain");
            tracing::warn!("a warning");
            let inner = tracing::info_span!("inner", order_id = "o-1");
            let _inner = inner.enter();
            tracing::debug!(text = "quote \" and \n", "in an inner span");
            let bare = tracing::info_span!("bare");
            let _bare = bare.enter();
            tracing::error!("in two");
        });
        tracing::info!("after");
    }

    /// The lines `emit` writes with fields `fields` and lines `events`.
    fn text_of<N, E>(fields: N, events: E, ansi: bool, inside: &dyn Fn(&dyn Fn())) -> String
    where
        N: for<'w> FormatFields<'w> + Send + Sync + 'static,
        E: FormatEvent<tracing_subscriber::Registry, N> + Send + Sync + 'static,
    {
        let sink = Sink::default();
        let writer = sink.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(Level::TRACE)
            .with_ansi(ansi)
            .fmt_fields(fields)
            .event_format(events)
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, || emit(inside));
        let text = String::from_utf8(sink.0.lock().unwrap().clone()).unwrap();
        text
    }

    /// The JSON lines `emit` writes with `events`, parsed, without their time.
    fn json_of<E>(events: E, inside: &dyn Fn(&dyn Fn())) -> Vec<Value>
    where
        E: FormatEvent<tracing_subscriber::Registry, JsonSpanFields> + Send + Sync + 'static,
    {
        text_of(JsonSpanFields, events, false, inside)
            .lines()
            .map(|line| {
                let mut line: Value = serde_json::from_str(line).expect(line);
                line.as_object_mut().unwrap().remove("timestamp");
                line
            })
            .collect()
    }

    /// With a request current, the plain-text lines are those of the
    /// request's span, byte for byte, with colours and without; without,
    /// those of `Full`.
    #[test]
    fn text_lines_name_the_request_as_its_span_did() {
        for (request_id, parent) in [
            (
                "req-7",
                Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
            ),
            ("", None),
        ] {
            for ansi in [false, true] {
                for fields in [false, true] {
                    let made = request(request_id, parent);
                    let lines = |timer_only: bool, inside: &dyn Fn(&dyn Fn())| {
                        let ours = TextLines::with_timer(Fixed);
                        let theirs = tracing_subscriber::fmt::format().with_timer(Fixed);
                        match (timer_only, fields) {
                            (false, true) => text_of(TextFields, ours, ansi, inside),
                            (false, false) => text_of(DefaultFields::new(), ours, ansi, inside),
                            (true, true) => text_of(TextFields, theirs, ansi, inside),
                            (true, false) => text_of(DefaultFields::new(), theirs, ansi, inside),
                        }
                    };
                    let with_log = |body: &dyn Fn()| {
                        let mut current = Some(made.clone());
                        with_request(&mut current, body);
                    };
                    let with_span = |body: &dyn Fn()| span_of(&made).in_scope(body);
                    let ours = lines(false, &with_log);
                    assert_eq!(ours, lines(true, &with_span), "ansi {ansi}");
                    assert_eq!(ours.lines().count(), 6, "{ours}");
                    if !ansi {
                        assert!(
                            ours.contains(&format!(
                                " INFO request{{method=POST path=/v1/events/ev/queue request_id={request_id} trace_id="
                            )),
                            "{ours}"
                        );
                    }
                }
            }
        }
    }

    /// With a request current, the JSON lines carry it as the request's span
    /// did: first in `spans`, and as `span` when no other is open.
    #[test]
    fn json_lines_name_the_request_as_its_span_did() {
        let made = request(
            "req-\"8\"",
            Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
        );
        let with_log = |body: &dyn Fn()| {
            let mut current = Some(made.clone());
            with_request(&mut current, body);
        };
        let with_span = |body: &dyn Fn()| span_of(&made).in_scope(body);
        let ours = json_of(JsonLines::default(), &with_log);
        let theirs = json_of(
            tracing_subscriber::fmt::format()
                .json()
                .with_current_span(true)
                .with_span_list(true),
            &with_span,
        );
        assert_eq!(ours.len(), 6);
        assert_eq!(ours, theirs);
        assert_eq!(ours[1]["span"]["request_id"], "req-\"8\"");
        assert_eq!(ours[1]["span"]["parent_span_id"], "00f067aa0ba902b7");
        assert_eq!(ours[3]["spans"][0]["name"], "request");
        assert_eq!(ours[3]["span"]["name"], "inner");
        assert!(ours[5].get("spans").is_none(), "{}", ours[5]);
    }

    /// A request current inside another's is current only while it is:
    /// then the outer one is again, and after both, none.
    #[test]
    fn the_current_request_is_given_back() {
        let id = |request: Option<&RequestLog>| request.map(|r| r.text[r.path_len..].to_owned());
        let mut outer = Some(request("outer", None));
        let mut inner = Some(request("inner", None));
        with_request(&mut outer, || {
            assert_eq!(current(id).as_deref(), Some("outer"));
            let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                with_request(&mut inner, || {
                    assert_eq!(current(id).as_deref(), Some("inner"));
                    panic!("a handler panics");
                })
            }));
            assert!(caught.is_err());
            assert_eq!(current(id).as_deref(), Some("outer"));
        });
        assert_eq!(current(id), None);
        assert!(outer.is_some() && inner.is_some());
        let mut none = None;
        with_request(&mut none, || assert_eq!(current(id), None));
    }
}
