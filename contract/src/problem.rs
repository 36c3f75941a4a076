//! RFC 9457 problem documents (`application/problem+json`).
//!
//! Every 4xx/5xx a BoxOffice service sends is a [`Problem`]. The `type` URI ends
//! in a stable slug (`/problems/sold-out`) that clients switch on; `detail` is for
//! people. 5xx details are never internals: callers build them from fixed text.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};

/// Base of every problem `type`; the slug is appended.
pub const PROBLEM_BASE: &str = "https://boxoffice.dev/problems/";

/// An RFC 9457 problem document (`application/problem+json`); a `Retry-After`
/// header comes with 429 and 503.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Problem {
    /// `https://boxoffice.dev/problems/<slug>`; clients switch on the slug.
    #[serde(rename = "type")]
    pub kind: String,
    pub title: String,
    pub status: u16,
    pub detail: String,
    /// Seconds; sent as the `Retry-After` header, not in the body.
    #[serde(skip)]
    #[schema(ignore)]
    pub retry_after: Option<u64>,
    /// Only on `seats-held` (a purchase): the fan's admission, renewed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admission: Option<Box<RenewedAdmission>>,
}

/// An admission renewed by a `seats-held` answer: a fresh access token for
/// it (the same `jti`, so it still buys once), valid `access_ttl_s` from
/// now. Buy with it after `Retry-After`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct RenewedAdmission {
    pub access_token: String,
    pub expires_at: chrono::DateTime<chrono::Utc>,
}

impl Problem {
    pub fn new(status: StatusCode, slug: &str, detail: impl Into<String>) -> Self {
        Self {
            kind: format!("{PROBLEM_BASE}{slug}"),
            title: title_of(slug),
            status: status.as_u16(),
            detail: detail.into(),
            retry_after: None,
            admission: None,
        }
    }

    pub fn retry_after(mut self, seconds: u64) -> Self {
        self.retry_after = Some(seconds.max(1));
        self
    }

    /// The slug at the end of `type`, e.g. `sold-out`.
    pub fn slug(&self) -> &str {
        self.kind.rsplit('/').next().unwrap_or_default()
    }

    pub fn status_code(&self) -> StatusCode {
        StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }

    pub fn bad_request(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "bad-request", detail)
    }

    pub fn not_found(slug: &str, detail: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, slug, detail)
    }

    pub fn unauthorized(slug: &str, detail: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, slug, detail)
    }

    /// A 500 whose detail says nothing about the cause; log the cause before.
    pub fn internal() -> Self {
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "the server failed; the failure has been logged",
        )
    }

    pub fn unavailable(slug: &str, detail: impl Into<String>, retry_after: u64) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, slug, detail).retry_after(retry_after)
    }

    /// A 429 with `Retry-After`.
    pub fn too_many_requests(slug: &str, detail: impl Into<String>, retry_after: u64) -> Self {
        Self::new(StatusCode::TOO_MANY_REQUESTS, slug, detail).retry_after(retry_after)
    }
}

/// "sold-out" → "Sold out".
fn title_of(slug: &str) -> String {
    let text = slug.replace('-', " ");
    let mut chars = text.chars();
    match chars.next() {
        Some(first) => first.to_uppercase().collect::<String>() + chars.as_str(),
        None => String::new(),
    }
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {}", self.status, self.slug(), self.detail)
    }
}

impl std::error::Error for Problem {}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let status = self.status_code();
        let retry_after = self.retry_after;
        let body = serde_json::to_vec(&self).unwrap_or_default();
        let mut response = (status, body).into_response();
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        if let Some(seconds) = retry_after {
            headers.insert(
                header::RETRY_AFTER,
                crate::header_number::header_number(seconds),
            );
        }
        response
    }
}

/// Fallback for routes that do not exist: a 404 problem document, not an empty body.
pub async fn no_route() -> Problem {
    Problem::not_found("not-found", "no such resource")
}

/// Fallback for a known route called with the wrong method.
pub async fn wrong_method() -> Problem {
    Problem::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method-not-allowed",
        "this resource does not take that method",
    )
}

/// Adds both fallbacks to a router.
pub fn with_fallbacks<S: Clone + Send + Sync + 'static>(
    router: axum::Router<S>,
) -> axum::Router<S> {
    router
        .fallback(no_route)
        .method_not_allowed_fallback(wrong_method)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn problem_carries_slug_title_and_retry_after() {
        let p = Problem::new(
            StatusCode::TOO_MANY_REQUESTS,
            "room-full",
            "the room is full",
        )
        .retry_after(7);
        assert_eq!(p.slug(), "room-full");
        assert_eq!(p.title, "Room full");
        let response = p.into_response();
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(response.headers()[header::RETRY_AFTER], "7");
        assert_eq!(
            response.headers()[header::CONTENT_TYPE],
            "application/problem+json"
        );
    }

    #[test]
    fn retry_after_is_never_zero() {
        assert_eq!(
            Problem::bad_request("x").retry_after(0).retry_after,
            Some(1)
        );
    }
}
