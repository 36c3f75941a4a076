//! Credentials: the `Authorization: Bearer` header, the internal plane's
//! service token, and the start-up check that refuses a missing, short or
//! well-known secret.
//!
//! The internal plane (the order service's `/internal/*`, the payment
//! provider's `/v1/*`) trusts its callers to have checked tickets, tokens
//! and limits, so a caller must prove it is one of ours: every call carries
//! `Authorization: Bearer <service token>`, compared in constant time.
//! Rotation without downtime: add the new token to
//! `BOXOFFICE_SERVICE_TOKENS_ACCEPTED` everywhere, then make it
//! `BOXOFFICE_SERVICE_TOKEN` everywhere (the old one accepted), then drop the old one.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use subtle::ConstantTimeEq;

use crate::Problem;

/// Shortest secret accepted at start (bytes): 32 random bytes as hex are 64.
pub const MIN_SECRET_BYTES: usize = 32;

/// The token of an `Authorization: Bearer …` header (the scheme is case-insensitive, RFC 9110).
pub fn bearer(headers: &HeaderMap) -> Option<&str> {
    bearer_of(headers.get(header::AUTHORIZATION)?)
}

/// The token of an `Authorization` header's value, if it is `Bearer …`.
pub fn bearer_of(authorization: &HeaderValue) -> Option<&str> {
    let value = authorization.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|t| !t.is_empty())
}

/// A request's `Authorization` header alone, as an extractor: axum's
/// `HeaderMap` extractor copies every header of the request.
#[derive(Debug, Clone, Default)]
pub struct Authorization(pub Option<HeaderValue>);

impl Authorization {
    /// Its bearer token, as [`bearer`].
    pub fn bearer(&self) -> Option<&str> {
        self.0.as_ref().and_then(bearer_of)
    }
}

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for Authorization {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        _: &S,
    ) -> Result<Self, Self::Rejection> {
        Ok(Self(parts.headers.get(header::AUTHORIZATION).cloned()))
    }
}

/// Compares in time independent of where the first difference is.
pub fn same_secret(a: &[u8], b: &[u8]) -> bool {
    a.ct_eq(b).into()
}

/// The service-token flags every service shares.
#[derive(Debug, Clone, clap::Args)]
pub struct ServiceTokenArgs {
    /// Token of the internal plane (≥ 32 bytes): sent on every call to
    /// another BoxOffice service, and required on this one's internal API.
    #[arg(long, env = "BOXOFFICE_SERVICE_TOKEN", hide_env_values = true)]
    pub service_token: String,
    /// Further service tokens accepted, comma-separated (during a rotation).
    #[arg(
        long,
        env = "BOXOFFICE_SERVICE_TOKENS_ACCEPTED",
        value_delimiter = ',',
        hide_env_values = true
    )]
    pub service_tokens_accepted: Vec<String>,
    /// Accept well-known development values (`dev-…`, `change-me`) for
    /// every secret of this process. Never in production.
    #[arg(long, env = "BOXOFFICE_ALLOW_DEV_SECRETS")]
    pub allow_dev_secrets: bool,
}

impl ServiceTokenArgs {
    /// One token, sent and accepted (tests and embedders).
    pub fn new(token: &str) -> Self {
        Self {
            service_token: token.to_owned(),
            service_tokens_accepted: Vec::new(),
            allow_dev_secrets: false,
        }
    }

    /// Refuses a token a start-up must not run with (see [`check_secret`]).
    pub fn check(&self) -> Result<(), SecretError> {
        self.check_secret("BOXOFFICE_SERVICE_TOKEN", &self.service_token)?;
        for extra in &self.service_tokens_accepted {
            self.check_secret("BOXOFFICE_SERVICE_TOKENS_ACCEPTED", extra)?;
        }
        Ok(())
    }

    /// [`check_secret`] with this process's `--allow-dev-secrets`.
    pub fn check_secret(&self, name: &'static str, value: &str) -> Result<(), SecretError> {
        check_secret(name, value, self.allow_dev_secrets)
    }

    /// The header a caller sends.
    pub fn header(&self) -> Result<HeaderMap, SecretError> {
        let mut value = HeaderValue::from_str(&format!("Bearer {}", self.service_token))
            .map_err(|_| SecretError::Unprintable("BOXOFFICE_SERVICE_TOKEN"))?;
        value.set_sensitive(true);
        Ok(HeaderMap::from_iter([(header::AUTHORIZATION, value)]))
    }

    pub fn acceptor(&self) -> ServiceAuth {
        ServiceAuth {
            accepted: std::iter::once(&self.service_token)
                .chain(&self.service_tokens_accepted)
                .filter(|t| !t.is_empty())
                .map(|t| t.as_bytes().to_vec())
                .collect(),
        }
    }
}

/// What a callee accepts.
#[derive(Clone, Debug)]
pub struct ServiceAuth {
    accepted: Arc<[Vec<u8>]>,
}

impl ServiceAuth {
    pub fn accepts(&self, headers: &HeaderMap) -> bool {
        bearer(headers).is_some_and(|presented| {
            // Every accepted token is compared, so timing says nothing of which matched.
            self.accepted
                .iter()
                .fold(false, |ok, t| same_secret(presented.as_bytes(), t) | ok)
        })
    }
}

/// Middleware: 401 unless the request carries an accepted service token.
pub async fn require_service(
    State(auth): State<ServiceAuth>,
    request: Request,
    next: Next,
) -> Response {
    if auth.accepts(request.headers()) {
        next.run(request).await
    } else {
        Problem::unauthorized(
            "unauthorized",
            "internal API: send Authorization: Bearer <service token>",
        )
        .into_response()
    }
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum SecretError {
    #[error("{0} is required (no default works: make one with `openssl rand -hex 32`)")]
    Missing(&'static str),
    #[error(
        "{0} must be at least {MIN_SECRET_BYTES} bytes (make one with `openssl rand -hex 32`)"
    )]
    TooShort(&'static str),
    #[error("{0} is a well-known development value; set a random one (`openssl rand -hex 32`), or pass --allow-dev-secrets (BOXOFFICE_ALLOW_DEV_SECRETS=true) on a development machine")]
    WellKnown(&'static str),
    #[error("{0} must be printable ASCII")]
    Unprintable(&'static str),
}

/// Values anyone can read in a repository or a tutorial.
fn well_known(value: &str) -> bool {
    let lower = value.to_ascii_lowercase();
    lower.starts_with("dev-")
        || lower.starts_with("test-")
        || ["change-me", "changeme", "secret", "password"]
            .iter()
            .any(|word| lower.contains(word))
}

/// A secret a service may start with: present, at least [`MIN_SECRET_BYTES`]
/// long, printable, and (unless `dev`) not a well-known development value.
pub fn check_secret(name: &'static str, value: &str, dev: bool) -> Result<(), SecretError> {
    if value.is_empty() {
        return Err(SecretError::Missing(name));
    }
    if !value.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(SecretError::Unprintable(name));
    }
    if value.len() < MIN_SECRET_BYTES {
        return Err(SecretError::TooShort(name));
    }
    if !dev && well_known(value) {
        return Err(SecretError::WellKnown(name));
    }
    Ok(())
}

/// A connection URL fit for a log line or an error: any password replaced by
/// `***`. Errs toward hiding: everything before the last `@` counts as the
/// user part (a password may hold an unencoded `/`, `?` or `#`), and a
/// libpq `key=value` string has its `password=` masked.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url
            .split(' ')
            .map(|pair| match pair.split_once('=') {
                Some((key, _)) if key.to_ascii_lowercase().contains("pass") => format!("{key}=***"),
                _ => pair.to_owned(),
            })
            .collect::<Vec<_>>()
            .join(" ");
    };
    match rest.rsplit_once('@') {
        Some((userinfo, after)) => {
            let masked = match userinfo.split_once(':') {
                Some((user, _)) => format!("{user}:***"),
                None => userinfo.to_owned(),
            };
            // A password may also ride in the query (`?password=`).
            format!("{scheme}://{masked}@{}", redact_query(after))
        }
        None => format!("{scheme}://{}", redact_query(rest)),
    }
}

fn redact_query(tail: &str) -> String {
    let Some((path, query)) = tail.split_once('?') else {
        return tail.to_owned();
    };
    let query: Vec<String> = query
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some((key, _)) if key.to_ascii_lowercase().contains("pass") => format!("{key}=***"),
            _ => pair.to_owned(),
        })
        .collect();
    format!("{path}?{}", query.join("&"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_tokens_are_found_whatever_the_scheme_case() {
        let mut headers = HeaderMap::new();
        for (value, token) in [
            ("Bearer abc", Some("abc")),
            ("bearer abc", Some("abc")),
            ("BEARER  abc ", Some("abc")),
            ("Basic abc", None),
            ("Bearer ", None),
            ("Bearerabc", None),
        ] {
            headers.insert(header::AUTHORIZATION, value.parse().unwrap());
            assert_eq!(bearer(&headers), token, "{value}");
        }
    }

    /// The extractor takes the `Authorization` header and only it.
    #[tokio::test]
    async fn the_authorization_extractor_finds_the_same_token() {
        use axum::extract::FromRequestParts;
        for (headers, token) in [
            (
                vec![("authorization", "Bearer abc"), ("x-other", "Bearer no")],
                Some("abc"),
            ),
            (vec![("x-other", "Bearer no")], None),
            (vec![("authorization", "Basic abc")], None),
        ] {
            let mut request = axum::http::Request::get("/");
            for (name, value) in &headers {
                request = request.header(*name, *value);
            }
            let (mut parts, ()) = request.body(()).unwrap().into_parts();
            let found = Authorization::from_request_parts(&mut parts, &())
                .await
                .unwrap();
            assert_eq!(found.bearer(), token, "{headers:?}");
        }
    }

    #[test]
    fn secrets_are_refused_when_missing_short_or_well_known() {
        let good = "9f1c2e4b7a0d3c6e8f1a2b3c4d5e6f708192a3b4c5d6e7f8";
        assert_eq!(check_secret("S", good, false), Ok(()));
        assert_eq!(check_secret("S", "", true), Err(SecretError::Missing("S")));
        assert_eq!(
            check_secret("S", "short", true),
            Err(SecretError::TooShort("S"))
        );
        for known in [
            "dev-ticket-secret-change-me-0123456789",
            "test-queue-secret-of-32-bytes-at-least",
            "my-very-long-but-change-me-value-000000",
            "supersecretsupersecretsupersecret00",
        ] {
            assert_eq!(
                check_secret("S", known, false),
                Err(SecretError::WellKnown("S")),
                "{known}"
            );
            assert_eq!(
                check_secret("S", known, true),
                Ok(()),
                "{known} with the dev flag"
            );
        }
        assert_eq!(
            check_secret("S", "a b c d e f g h i j k l m n o p q r s t", false),
            Err(SecretError::Unprintable("S"))
        );
    }

    #[test]
    fn service_tokens_are_accepted_only_when_listed() {
        let mut args = ServiceTokenArgs::new("current-token");
        args.service_tokens_accepted = vec!["next-token".into()];
        let auth = args.acceptor();
        let with =
            |value: &str| HeaderMap::from_iter([(header::AUTHORIZATION, value.parse().unwrap())]);
        assert!(auth.accepts(&with("Bearer current-token")));
        assert!(auth.accepts(&with("bearer next-token")));
        assert!(!auth.accepts(&with("Bearer current-tokeN")));
        assert!(!auth.accepts(&with("Bearer current-token-and-more")));
        assert!(!auth.accepts(&with("Bearer current")));
        assert!(!auth.accepts(&with("Bearer ")));
        assert!(!auth.accepts(&HeaderMap::new()));
        assert!(!ServiceTokenArgs::new("")
            .acceptor()
            .accepts(&with("Bearer ")));
        assert_eq!(
            args.header().unwrap()[header::AUTHORIZATION],
            "Bearer current-token"
        );
    }

    #[test]
    fn passwords_never_survive_redaction() {
        for (url, want) in [
            (
                "postgres://bo:s3cret@db:5432/boxoffice",
                "postgres://bo:***@db:5432/boxoffice",
            ),
            ("postgres://bo@db/boxoffice", "postgres://bo@db/boxoffice"),
            (
                "rediss://default:p@ss:w0rd@cache:6380",
                "rediss://default:***@cache:6380",
            ),
            (
                "postgres://db/x?user=bo&password=s3cret",
                "postgres://db/x?user=bo&password=***",
            ),
            ("redis://127.0.0.1:6379", "redis://127.0.0.1:6379"),
            ("not a url", "not a url"),
            ("postgres://bo:ab/cd?e#f@db/x", "postgres://bo:***@db/x"),
            (
                "host=db user=bo password=s3cret dbname=x",
                "host=db user=bo password=*** dbname=x",
            ),
        ] {
            assert_eq!(redact_url(url), want, "{url}");
        }
    }
}
