//! Log fields written straight into the line or the span's string: the
//! JSON logs' span fields ([`JsonSpanFields`]) and the plain-text logs'
//! fields ([`TextFields`]).
//!
//! `tracing-subscriber`'s JSON logs keep each span's fields as the text of a
//! JSON object, written once when the span opens. Its own field formatter
//! (`JsonFields`) first collects them in a map of `serde_json::Value`s,
//! formatting every value into a `String` of its own. [`JsonSpanFields`]
//! writes the same object in place, about 7,400 instructions fewer per
//! span of six fields (`BENCH_LOG_JSON=true scripts/edge_cost.sh`, measured
//! when every request opened such a span), and
//! the lines come out the same: the JSON formatter parses the object back
//! when a line is written, so key order and layout do not show.

use std::fmt::{self, Write};

use tracing::field::{Field, Visit};
use tracing_subscriber::field::{RecordFields, VisitOutput};
use tracing_subscriber::fmt::format::{DefaultFields, DefaultVisitor, Writer};
use tracing_subscriber::fmt::{FormatFields, FormattedFields};

/// Span fields as a JSON object: strings, numbers and booleans as
/// `JsonFields` has them (other values as their `Debug` text, errors as
/// their message), `r#` prefixes dropped, `log.*` fields skipped.
#[derive(Debug, Default, Clone, Copy)]
pub struct JsonSpanFields;

impl<'writer> FormatFields<'writer> for JsonSpanFields {
    fn format_fields<R: RecordFields>(
        &self,
        mut writer: Writer<'writer>,
        fields: R,
    ) -> fmt::Result {
        writer.write_char('{')?;
        write_fields(&mut writer, true, fields)?;
        writer.write_char('}')
    }

    fn add_fields(
        &self,
        current: &'writer mut FormattedFields<Self>,
        fields: &tracing::span::Record<'_>,
    ) -> fmt::Result {
        // Reopen the object: `{}` or `{…}`. A field recorded twice is then
        // in it twice, and the later one wins when the line is written.
        let first = match current.fields.as_str() {
            "" => {
                current.fields.push('{');
                true
            }
            "{}" => {
                current.fields.pop();
                true
            }
            _ => {
                current.fields.pop();
                false
            }
        };
        write_fields(&mut current.fields, first, fields)?;
        current.fields.push('}');
        Ok(())
    }
}

fn write_fields(writer: &mut dyn Write, first: bool, fields: impl RecordFields) -> fmt::Result {
    let mut visitor = Members {
        writer,
        first,
        result: Ok(()),
    };
    fields.record(&mut visitor);
    visitor.result
}

/// Writes each field as `"name":value`, comma-separated.
struct Members<'a> {
    writer: &'a mut dyn Write,
    first: bool,
    result: fmt::Result,
}

impl Members<'_> {
    /// Writes `"name":` and then the value, by `value`; nothing for a
    /// `log.*` field or after an error.
    fn member(&mut self, field: &Field, value: impl FnOnce(&mut dyn Write) -> fmt::Result) {
        let name = field.name();
        if self.result.is_err() || name.starts_with("log.") {
            return;
        }
        let name = name.strip_prefix("r#").unwrap_or(name);
        let comma = !std::mem::take(&mut self.first);
        let writer = &mut *self.writer;
        self.result = (|| {
            if comma {
                writer.write_char(',')?;
            }
            writer.write_char('"')?;
            Escaped(&mut *writer).write_str(name)?;
            writer.write_str("\":")?;
            value(writer)
        })();
    }

    fn string(&mut self, field: &Field, value: impl FnOnce(&mut Escaped<'_>) -> fmt::Result) {
        self.member(field, |writer| {
            writer.write_char('"')?;
            value(&mut Escaped(&mut *writer))?;
            writer.write_char('"')
        });
    }
}

impl Visit for Members<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.string(field, |writer| write!(writer, "{value:?}"));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.string(field, |writer| writer.write_str(value));
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.member(field, |writer| write!(writer, "{value}"));
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.member(field, |writer| write!(writer, "{value}"));
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.member(field, |writer| write!(writer, "{value}"));
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        // As serde_json writes it: `1.0`, and `null` for NaN and infinities.
        self.member(field, |writer| {
            write!(writer, "{}", serde_json::Value::from(value))
        });
    }

    fn record_bytes(&mut self, field: &Field, value: &[u8]) {
        self.member(field, |writer| {
            write!(writer, "{}", serde_json::Value::from(value))
        });
    }
}

/// The plain-text logs' fields as `tracing-subscriber`'s default formatter
/// (`DefaultFields`) writes them, byte for byte, without its styling
/// machinery when there is no styling: a field is `name=value` (its `Debug`
/// text), written at once, where the default paints the name and the `=`
/// with no colour and formats the three parts apart. That was about half of
/// a span's cost (six fields, written when the span opens; measured when
/// every request opened one). Messages (escaped against terminal codes),
/// errors (with their sources) and `r#` names still go through the default
/// formatter, and so does everything with colours on (a terminal).
#[derive(Debug, Default, Clone, Copy)]
pub struct TextFields;

impl<'writer> FormatFields<'writer> for TextFields {
    fn format_fields<R: RecordFields>(&self, writer: Writer<'writer>, fields: R) -> fmt::Result {
        if writer.has_ansi_escapes() {
            return DefaultFields::new().format_fields(writer, fields);
        }
        // Written whole into a buffer kept by the thread, then copied at
        // once: a span's fields go into a new, empty string, which would
        // otherwise grow (and move) several times a span.
        SCRATCH.with(|scratch| match scratch.try_borrow_mut() {
            Ok(mut scratch) => {
                scratch.clear();
                let result = Text::record_all(Writer::new(&mut *scratch), fields);
                let written = result.and_then(|()| {
                    let mut writer = writer;
                    writer.write_str(&scratch)
                });
                if scratch.capacity() > SCRATCH_KEPT {
                    *scratch = String::new();
                }
                written
            }
            // In use further up this thread's stack (tracing does not
            // dispatch while it dispatches, so only defensively): in place.
            Err(_) => Text::record_all(writer, fields),
        })
    }
}

/// Larger buffers are dropped after use, not kept by the thread.
const SCRATCH_KEPT: usize = 4096;

thread_local! {
    static SCRATCH: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
}

/// Writes each field as `name=value`, space-separated.
struct Text<'a> {
    writer: Writer<'a>,
    is_empty: bool,
    result: fmt::Result,
}

impl<'a> Text<'a> {
    fn record_all<R: RecordFields>(writer: Writer<'a>, fields: R) -> fmt::Result {
        let mut visitor = Text {
            writer,
            is_empty: true,
            result: Ok(()),
        };
        fields.record(&mut visitor);
        visitor.result
    }

    /// The default formatter's way, for what it writes differently.
    fn by_default(&mut self, record: impl FnOnce(&mut DefaultVisitor<'_>)) {
        if self.result.is_err() {
            return;
        }
        let mut visitor = DefaultVisitor::new(self.writer.by_ref(), self.is_empty);
        record(&mut visitor);
        self.result = visitor.finish();
        self.is_empty = false;
    }
}

impl Visit for Text<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        let name = field.name();
        if name == "message" || name.starts_with("r#") {
            return self.by_default(|visitor| visitor.record_debug(field, value));
        }
        if self.result.is_err() || name.starts_with("log.") {
            return;
        }
        if !std::mem::take(&mut self.is_empty) {
            self.result = self.writer.write_char(' ');
        }
        self.result = self
            .result
            .and_then(|()| self.writer.write_str(name))
            .and_then(|()| self.writer.write_char('='))
            .and_then(|()| write!(self.writer, "{value:?}"));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        match field.name() {
            "message" => self.by_default(|visitor| visitor.record_str(field, value)),
            _ => self.record_debug(field, &value),
        }
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.by_default(|visitor| visitor.record_error(field, value));
    }
}

/// Writes a string's contents as the inside of a JSON string, escaped as
/// serde_json escapes them: `"`, `\` and the control characters.
pub(crate) struct Escaped<'a>(pub(crate) &'a mut dyn Write);

impl Write for Escaped<'_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let mut start = 0;
        for (i, byte) in s.bytes().enumerate() {
            let escape = match byte {
                b'"' => "\\\"",
                b'\\' => "\\\\",
                b'\n' => "\\n",
                b'\r' => "\\r",
                b'\t' => "\\t",
                0x08 => "\\b",
                0x0c => "\\f",
                0x00..=0x1f => "",
                _ => continue,
            };
            self.0.write_str(&s[start..i])?;
            if escape.is_empty() {
                write!(self.0, "\\u{byte:04x}")?;
            } else {
                self.0.write_str(escape)?;
            }
            start = i + 1;
        }
        self.0.write_str(&s[start..])
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::sync::{Arc, Mutex};

    use serde_json::Value;
    use tracing_subscriber::fmt::format::JsonFields;

    use super::*;

    /// A log sink a test can read (the telemetry tests' too).
    #[derive(Clone, Default)]
    pub(crate) struct Sink(pub(crate) Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Sink {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[derive(Debug)]
    struct Failed;

    impl fmt::Display for Failed {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("it \"failed\"\n\tbadly")
        }
    }

    impl std::error::Error for Failed {}

    /// The log lines, parsed, of `emit` run under JSON logs with field
    /// formatter `fields`.
    fn lines<F>(fields: F, emit: impl Fn()) -> Vec<Value>
    where
        F: for<'w> FormatFields<'w> + Send + Sync + 'static,
    {
        let sink = Sink::default();
        let writer = sink.clone();
        let subscriber = tracing_subscriber::fmt()
            .json()
            .with_current_span(true)
            .with_span_list(true)
            .fmt_fields(fields)
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, emit);
        let text = String::from_utf8(sink.0.lock().unwrap().clone()).unwrap();
        text.lines()
            .map(|line| serde_json::from_str(line).expect(line))
            .collect()
    }

    /// What a line's spans say, without the timestamp.
    fn spans(line: &Value) -> (Value, Value) {
        (line["span"].clone(), line["spans"].clone())
    }

    /// Spans and events with every kind of field, nested, recorded late.
    fn emit_all_kinds() {
        let text = "quote \" backslash \\ newline \n tab \t bell \u{7} é 🎟";
        let error: &(dyn std::error::Error + 'static) = &Failed;
        let outer = tracing::info_span!(
            "request",
            method = %"GET",
            path = %"/v1/events/ev/queue/status",
            text = %text,
            debugged = ?text,
            plain = text,
            r#type = "r#-named",
            signed = -3_i64,
            unsigned = 18_446_744_073_709_551_615_u64,
            yes = true,
            ratio = 0.25_f64,
            whole = 2.0_f64,
            nan = f64::NAN,
            error,
            later = tracing::field::Empty,
        );
        let _outer = outer.enter();
        outer.record("later", "recorded after");
        outer.record("signed", 7_i64);
        let empty = tracing::info_span!("empty", added = tracing::field::Empty);
        let _empty = empty.enter();
        tracing::info!("inside both");
        empty.record("added", 1_u64);
        tracing::warn!(status = 503, "after a record");
        tracing::warn!(%text, error, r#type = "r#", "a message with \u{1b}[31m in it {}", 7);
        tracing::info!(message = text, quantity = 2);
        let bare = tracing::info_span!("bare");
        let _bare = bare.enter();
        tracing::info!("no fields at all");
    }

    /// The plain-text lines of `emit_all_kinds` with field formatter `fields`.
    fn text_lines<F>(fields: F, ansi: bool) -> String
    where
        F: for<'w> FormatFields<'w> + Send + Sync + 'static,
    {
        text_lines_of(fields, ansi, emit_all_kinds)
    }

    /// The plain-text lines of `emit` with field formatter `fields`.
    fn text_lines_of<F>(fields: F, ansi: bool, emit: impl Fn()) -> String
    where
        F: for<'w> FormatFields<'w> + Send + Sync + 'static,
    {
        let sink = Sink::default();
        let writer = sink.clone();
        let subscriber = tracing_subscriber::fmt()
            .without_time()
            .with_ansi(ansi)
            .fmt_fields(fields)
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, emit);
        let text = String::from_utf8(sink.0.lock().unwrap().clone()).unwrap();
        text
    }

    /// The fields are written through a buffer the thread keeps: fields
    /// longer than the buffer kept are written whole all the same, and the
    /// next line's are not mixed with them.
    #[test]
    fn long_text_fields_are_written_whole() {
        let long = "long ".repeat(2 * SCRATCH_KEPT);
        let emit = || {
            let span = tracing::info_span!("outer", first = 1, long = %long);
            let _span = span.enter();
            tracing::info!(after = %long, "inside");
            tracing::info!(short = 2, "inside again");
        };
        let ours = text_lines_of(TextFields, false, emit);
        assert_eq!(ours, text_lines_of(DefaultFields::new(), false, emit));
        assert!(
            ours.contains(&format!("outer{{first=1 long={long}}}")),
            "{ours}"
        );
        assert!(ours.contains(&format!("inside after={long}")), "{ours}");
        assert!(ours.contains("inside again short=2"), "{ours}");
    }

    #[test]
    fn text_lines_are_the_same_as_with_the_default_fields() {
        let ours = text_lines(TextFields, false);
        let theirs = text_lines(DefaultFields::new(), false);
        assert_eq!(ours.matches("log_fields::tests:").count(), 5, "{ours}");
        assert_eq!(ours, theirs);
        // With colours, the default formatter itself.
        assert_eq!(
            text_lines(TextFields, true),
            text_lines(DefaultFields::new(), true)
        );
        // What the lines say is what was recorded.
        assert!(
            ours.contains(r#"request{method=GET path=/v1/events/ev/queue/status text=quote"#),
            "{ours}"
        );
        assert!(ours.contains(" type=\"r#-named\" signed=-3 "), "{ours}");
        assert!(
            ours.contains(" later=\"recorded after\" signed=7"),
            "{ours}"
        );
        assert!(ours.contains("empty{added=1}"), "{ours}");
        assert!(
            !ours.contains('\u{1b}'),
            "a message's terminal codes are escaped: {ours}"
        );
    }

    #[test]
    fn lines_carry_the_same_span_fields_as_with_json_fields() {
        let emit = emit_all_kinds;
        let ours = lines(JsonSpanFields, emit);
        let theirs = lines(JsonFields::default(), emit);
        assert_eq!(ours.len(), 5);
        assert_eq!(
            ours.iter().map(spans).collect::<Vec<_>>(),
            theirs.iter().map(spans).collect::<Vec<_>>()
        );
        // And what they say is what was recorded.
        let request = &ours[1]["spans"][0];
        assert_eq!(
            request["text"],
            "quote \" backslash \\ newline \n tab \t bell \u{7} é 🎟"
        );
        assert_eq!(request["type"], "r#-named");
        assert_eq!(request["signed"], 7);
        assert_eq!(request["unsigned"], u64::MAX);
        assert_eq!(request["ratio"], 0.25);
        assert_eq!(request["nan"], Value::Null);
        assert_eq!(request["error"], "it \"failed\"\n\tbadly");
        assert_eq!(request["later"], "recorded after");
        assert_eq!(ours[1]["span"]["added"], 1);
        assert_eq!(ours[4]["span"]["name"], "bare");
    }
}
