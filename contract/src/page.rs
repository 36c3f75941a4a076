//! The headers every HTML page is served with: a Content-Security-Policy
//! that allows the page's own inline `<script>` and `<style>` blocks by hash
//! (and nothing else inline), no framing, no MIME sniffing, no referrer
//! leaving the site.

use axum::http::{header, HeaderName, HeaderValue};
use base64::Engine;
use sha2::{Digest, Sha256};

/// `'sha256-…'` of every inline block `<tag>…</tag>` (without attributes) of `html`.
fn inline_hashes(html: &str, tag: &str) -> Vec<String> {
    let (open, close) = (format!("<{tag}>"), format!("</{tag}>"));
    let mut hashes = Vec::new();
    let mut rest = html;
    while let Some(start) = rest.find(&open) {
        let body = &rest[start + open.len()..];
        let Some(end) = body.find(&close) else { break };
        // Browsers hash the block with its line breaks normalized to LF.
        let block = body[..end].replace("\r\n", "\n").replace('\r', "\n");
        let digest = Sha256::digest(block.as_bytes());
        hashes.push(format!(
            "'sha256-{}'",
            base64::engine::general_purpose::STANDARD.encode(digest)
        ));
        rest = &body[end + close.len()..];
    }
    hashes
}

/// The Content-Security-Policy of `html`: its own origin and its inline blocks.
pub fn content_security_policy(html: &str) -> String {
    let with = |tag: &str| {
        std::iter::once("'self'".to_owned())
            .chain(inline_hashes(html, tag))
            .collect::<Vec<_>>()
            .join(" ")
    };
    format!(
        "default-src 'none'; script-src {}; style-src {}; connect-src 'self'; img-src 'self' data:; \
         base-uri 'none'; form-action 'self'; frame-ancestors 'none'",
        with("script"),
        with("style"),
    )
}

/// Every security header of a page whose HTML is `html`.
pub fn headers(html: &str) -> Vec<(HeaderName, HeaderValue)> {
    vec![
        (
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_str(&content_security_policy(html)).expect("ASCII policy"),
        ),
        (header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY")),
        (
            header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        ),
        (
            header::REFERRER_POLICY,
            HeaderValue::from_static("no-referrer"),
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inline_blocks_are_allowed_by_their_hash_only() {
        let html = "<style>p{}</style><script>go()</script><script src=\"/x.js\"></script>";
        let policy = content_security_policy(html);
        let hash = |s: &str| {
            base64::engine::general_purpose::STANDARD.encode(Sha256::digest(s.as_bytes()))
        };
        assert!(
            policy.contains(&format!("script-src 'self' 'sha256-{}';", hash("go()"))),
            "{policy}"
        );
        assert!(
            policy.contains(&format!("style-src 'self' 'sha256-{}';", hash("p{}"))),
            "{policy}"
        );
        assert!(policy.contains("frame-ancestors 'none'"));
        assert!(!policy.contains("unsafe-inline"));
        let crlf = content_security_policy("<script>a()\r\nb()</script>");
        assert!(crlf.contains(&hash("a()\nb()")), "{crlf}");
    }
}
