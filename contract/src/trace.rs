//! W3C Trace Context (`traceparent`), so one purchase is one trace: the
//! gateway starts it (or continues the caller's), the order service keeps it
//! on the order and its outbox row, the relay puts it in the Kafka headers and
//! the ticket worker continues it. Every log span on the way records the
//! `trace_id`.
//!
//! `traceparent: 00-<32 hex trace id>-<16 hex parent span id>-<2 hex flags>`
//! (<https://www.w3.org/TR/trace-context/>).

use std::fmt;

/// The header, in HTTP and in Kafka record headers alike.
pub const TRACEPARENT: &str = "traceparent";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceContext {
    pub trace_id: u128,
    /// The span this context was handed on from.
    pub span_id: u64,
    pub sampled: bool,
}

impl TraceContext {
    /// A new trace, sampled.
    pub fn root() -> Self {
        Self {
            trace_id: nonzero_u128(),
            span_id: nonzero_u64(),
            sampled: true,
        }
    }

    /// The same trace handed on from a new span: what a service sends downstream.
    pub fn child(&self) -> Self {
        Self {
            span_id: nonzero_u64(),
            ..*self
        }
    }

    /// Parses a `traceparent` value; `None` when it is not a valid one (the
    /// receiver then starts a new trace, as the spec asks). Versions after
    /// `00` are read by their `00` prefix.
    pub fn parse(value: &str) -> Option<Self> {
        let bytes = value.as_bytes();
        if bytes.len() < 55 || bytes[2] != b'-' || bytes[35] != b'-' || bytes[52] != b'-' {
            return None;
        }
        let version = lower_hex(&value[0..2])? as u8;
        if version == 0xff || (version == 0 && bytes.len() != 55) {
            return None;
        }
        if version > 0 && bytes.len() > 55 && bytes[55] != b'-' {
            return None;
        }
        let trace_id = lower_hex(&value[3..35])?;
        let span_id = lower_hex(&value[36..52])? as u64;
        let flags = lower_hex(&value[53..55])? as u8;
        if trace_id == 0 || span_id == 0 {
            return None;
        }
        Some(Self {
            trace_id,
            span_id,
            sampled: flags & 1 == 1,
        })
    }

    /// The context of a new span under the caller's (read from a header
    /// value), and the caller's span id: what a service records on its span
    /// (`span_id`, `parent_span_id`) and sends downstream as `traceparent`,
    /// so the spans of one trace form a tree.
    pub fn span_under(value: Option<&str>) -> (Self, ParentSpan) {
        match value.and_then(Self::parse) {
            Some(caller) => (caller.child(), ParentSpan(Some(caller.span_id))),
            None => (Self::root(), ParentSpan(None)),
        }
    }

    /// The trace id as 32 lowercase hex digits, as logs and tracing back
    /// ends show it; written straight into a log field, no `String` first.
    pub fn trace_id_hex(&self) -> impl fmt::Display {
        Hex::<32>(self.trace_id)
    }

    /// The span id as 16 lowercase hex digits.
    pub fn span_id_hex(&self) -> impl fmt::Display {
        Hex::<16>(u128::from(self.span_id))
    }

    /// The `traceparent` value, as bytes: 55 ASCII characters.
    pub fn to_header_bytes(&self) -> [u8; 55] {
        let mut out = *b"00-00000000000000000000000000000000-0000000000000000-00";
        out[3..35].copy_from_slice(&hex_digits::<32>(self.trace_id));
        out[36..52].copy_from_slice(&hex_digits::<16>(u128::from(self.span_id)));
        out[54] = b'0' + u8::from(self.sampled);
        out
    }
}

impl fmt::Display for TraceContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(ascii(&self.to_header_bytes()))
    }
}

/// The caller's span id, shown as 16 hex digits (nothing for a trace's root).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParentSpan(pub Option<u64>);

impl fmt::Display for ParentSpan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(id) => Hex::<16>(u128::from(id)).fmt(f),
            None => Ok(()),
        }
    }
}

/// An id as `DIGITS` lowercase hex digits, zero-padded.
struct Hex<const DIGITS: usize>(u128);

impl<const DIGITS: usize> fmt::Display for Hex<DIGITS> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(ascii(&hex_digits::<DIGITS>(self.0)))
    }
}

/// The low `DIGITS` hex digits of `value`, lowercase and zero-padded: by
/// table rather than `{:032x}`, which costs several times as much, and ids
/// are written several times per request (log span, `traceparent`).
fn hex_digits<const DIGITS: usize>(value: u128) -> [u8; DIGITS] {
    const DIGIT: &[u8; 16] = b"0123456789abcdef";
    let mut out = [0; DIGITS];
    for (i, digit) in out.iter_mut().enumerate() {
        *digit = DIGIT[(value >> (4 * (DIGITS - 1 - i)) & 0xf) as usize];
    }
    out
}

/// Bytes this module wrote, all ASCII.
fn ascii(bytes: &[u8]) -> &str {
    std::str::from_utf8(bytes).expect("hex digits and dashes are ASCII")
}

/// Digits 0-9a-f only: the spec forbids upper case.
fn lower_hex(digits: &str) -> Option<u128> {
    if digits.is_empty()
        || !digits
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        return None;
    }
    u128::from_str_radix(digits, 16).ok()
}

fn nonzero_u128() -> u128 {
    loop {
        let id = rand::random::<u128>();
        if id != 0 {
            return id;
        }
    }
}

fn nonzero_u64() -> u64 {
    loop {
        let id = rand::random::<u64>();
        if id != 0 {
            return id;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn parses_the_specs_example_and_writes_it_back() {
        let cx = TraceContext::parse(EXAMPLE).unwrap();
        assert_eq!(cx.trace_id, 0x4bf92f3577b34da6a3ce929d0e0e4736);
        assert_eq!(cx.span_id, 0x00f067aa0ba902b7);
        assert!(cx.sampled);
        assert_eq!(cx.to_string(), EXAMPLE);
        assert_eq!(
            cx.trace_id_hex().to_string(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert_eq!(cx.span_id_hex().to_string(), "00f067aa0ba902b7");
    }

    #[test]
    fn ids_are_written_as_format_writes_them() {
        for (trace_id, span_id) in [
            (u128::MAX, u64::MAX),
            (0x0123456789abcdef_fedcba9876543210, 0x0f1e2d3c4b5a6978),
            (1 << 127, 1 << 63),
            (rand::random(), rand::random()),
        ] {
            let cx = TraceContext {
                trace_id,
                span_id,
                sampled: true,
            };
            assert_eq!(cx.trace_id_hex().to_string(), format!("{trace_id:032x}"));
            assert_eq!(cx.span_id_hex().to_string(), format!("{span_id:016x}"));
            assert_eq!(
                cx.to_string(),
                format!("00-{trace_id:032x}-{span_id:016x}-01")
            );
            assert_eq!(&cx.to_header_bytes()[..], cx.to_string().as_bytes());
        }
    }

    #[test]
    fn rejects_what_the_spec_rejects() {
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473x-00f067aa0ba902b7-01",
            "00-+bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ] {
            assert_eq!(TraceContext::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn later_versions_are_read_by_their_prefix() {
        let later = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00-whatever";
        let cx = TraceContext::parse(later).unwrap();
        assert_eq!(cx.trace_id, 0x4bf92f3577b34da6a3ce929d0e0e4736);
        assert!(!cx.sampled);
    }

    #[test]
    fn a_child_keeps_the_trace_and_gets_a_new_span() {
        let root = TraceContext::root();
        let child = root.child();
        assert_eq!(child.trace_id, root.trace_id);
        assert_ne!(child.span_id, root.span_id);
        assert_eq!(TraceContext::parse(&child.to_string()), Some(child));
    }

    #[test]
    fn a_span_under_the_caller_keeps_the_trace_and_names_its_parent() {
        let (span, parent) = TraceContext::span_under(Some(EXAMPLE));
        assert_eq!(span.trace_id, 0x4bf92f3577b34da6a3ce929d0e0e4736);
        assert_eq!(parent, ParentSpan(Some(0x00f067aa0ba902b7)));
        assert_eq!(parent.to_string(), "00f067aa0ba902b7");
        assert_ne!(span.span_id, 0x00f067aa0ba902b7);
        assert_eq!(span.span_id_hex().to_string().len(), 16);
        let (root, none) = TraceContext::span_under(Some("garbage"));
        assert_eq!(none.to_string(), "");
        assert_ne!(root.trace_id, span.trace_id);
    }

    #[test]
    fn no_header_or_a_bad_one_starts_a_new_trace() {
        let (a, no_parent) = TraceContext::span_under(None);
        let (b, _) = TraceContext::span_under(Some("garbage"));
        assert_ne!(a.trace_id, b.trace_id);
        assert_eq!(no_parent, ParentSpan(None));
        // Small ids keep their leading zeros.
        let small = TraceContext {
            trace_id: 1,
            span_id: 2,
            sampled: false,
        };
        assert_eq!(
            small.to_string(),
            "00-00000000000000000000000000000001-0000000000000002-00"
        );
    }
}
