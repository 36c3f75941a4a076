//! The shop door: a tower layer in front of `POST /v1/events/{id}/orders`
//! that lets through only a valid access token for that event.
//!
//! It checks the signature (EdDSA, a key of the verify set), `exp`/`nbf`
//! with a small leeway, `iss`, `token_use=access`, and that `aud` is the
//! event in the path; it then hands the claims to the handler as a request
//! extension. Spending the token (its `jti`, once) is the handler's first
//! Redis step, after the body is known to be valid, so a typo in the
//! quantity never burns a fan's admission.

use std::task::{Context, Poll};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::response::{IntoResponse, Response};
use boxoffice_contract::token::{Claims, KeySet, TokenError, TokenUse};
use boxoffice_contract::Problem;
use futures_util::future::BoxFuture;
use tower::{Layer, Service};

use crate::bearer;

#[derive(Clone)]
pub struct AccessTokenLayer {
    keys: KeySet,
}

impl AccessTokenLayer {
    pub fn new(keys: KeySet) -> Self {
        Self { keys }
    }
}

impl<S> Layer<S> for AccessTokenLayer {
    type Service = AccessToken<S>;

    fn layer(&self, inner: S) -> Self::Service {
        AccessToken {
            inner,
            keys: self.keys.clone(),
        }
    }
}

#[derive(Clone)]
pub struct AccessToken<S> {
    inner: S,
    keys: KeySet,
}

/// The event id of `/v1/events/{id}/…`.
fn event_of(path: &str) -> Option<&str> {
    let mut parts = path.trim_start_matches('/').split('/');
    match (parts.next(), parts.next(), parts.next()) {
        (Some("v1"), Some("events"), Some(id)) if !id.is_empty() => Some(id),
        _ => None,
    }
}

/// Why a request was turned away, as its problem document. The detail never
/// says which check failed (signature, key, expiry, use): that is logged, not
/// told to whoever holds the token.
pub fn reject(error: &TokenError) -> Problem {
    match error {
        TokenError::WrongAudience => Problem::new(
            StatusCode::FORBIDDEN,
            "wrong-event",
            "this token is for another event",
        ),
        other => {
            tracing::debug!(error = %other, "token refused");
            Problem::unauthorized("invalid-token", "invalid token")
        }
    }
}

/// Verifies the request's access token for the event in its path.
pub fn check(keys: &KeySet, request: &Request<Body>) -> Result<Claims, Problem> {
    let token = bearer(request.headers()).ok_or_else(|| {
        Problem::unauthorized("invalid-token", "send Authorization: Bearer <access_token>")
    })?;
    let event = event_of(request.uri().path())
        .ok_or_else(|| Problem::not_found("unknown-event", "no event in the path"))?;
    let claims = keys
        .verify(token, TokenUse::Access, None)
        .map_err(|e| reject(&e))?;
    if claims.aud != event {
        return Err(reject(&TokenError::WrongAudience));
    }
    Ok(claims)
}

impl<S> Service<Request<Body>> for AccessToken<S>
where
    S: Service<Request<Body>, Response = Response> + Clone + Send + 'static,
    S::Future: Send + 'static,
{
    type Response = Response;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<Body>) -> Self::Future {
        match check(&self.keys, &request) {
            Ok(claims) => {
                request.extensions_mut().insert(claims);
                // The clone is ready-less; swap so the polled-ready service handles this call.
                let clone = self.inner.clone();
                let mut inner = std::mem::replace(&mut self.inner, clone);
                Box::pin(async move { inner.call(request).await })
            }
            Err(problem) => Box::pin(async move { Ok(problem.into_response()) }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use boxoffice_contract::token::{generate_ed25519_pem, now_s};
    use tower::ServiceExt;

    const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef";

    fn keys() -> KeySet {
        KeySet::from_pems("boxoffice", &generate_ed25519_pem(), &[], SECRET).unwrap()
    }

    /// The shop behind the door: answers 200 with the fan id it was handed.
    fn door(
        keys: &KeySet,
    ) -> impl Service<Request<Body>, Response = Response, Error = std::convert::Infallible> {
        let shop = tower::service_fn(|request: Request<Body>| async move {
            let fan = request
                .extensions()
                .get::<Claims>()
                .map(|c| c.sub.clone())
                .unwrap_or_default();
            Ok::<_, std::convert::Infallible>(fan.into_response())
        });
        AccessTokenLayer::new(keys.clone()).layer(shop)
    }

    fn buy(token: Option<&str>, event: &str) -> Request<Body> {
        let mut builder = Request::post(format!("/v1/events/{event}/orders"));
        if let Some(token) = token {
            builder = builder.header("authorization", format!("Bearer {token}"));
        }
        builder.body(Body::empty()).unwrap()
    }

    async fn slug_of(response: Response) -> (StatusCode, String) {
        let status = response.status();
        let body = axum::body::to_bytes(response.into_body(), 1 << 16)
            .await
            .unwrap();
        let problem: Problem = serde_json::from_slice(&body).unwrap();
        (status, problem.slug().to_owned())
    }

    fn token(keys: &KeySet, use_: TokenUse, event: &str, issued: u64) -> String {
        keys.sign(&Claims::new("boxoffice", event, "fan-7", use_, issued, 60))
    }

    #[tokio::test]
    async fn a_valid_access_token_reaches_the_shop_with_its_claims() {
        let keys = keys();
        let response = door(&keys)
            .oneshot(buy(
                Some(&token(&keys, TokenUse::Access, "ev1", now_s())),
                "ev1",
            ))
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        let body = axum::body::to_bytes(response.into_body(), 1024)
            .await
            .unwrap();
        assert_eq!(&body[..], b"fan-7");
    }

    #[tokio::test]
    async fn missing_garbage_and_foreign_tokens_get_401() {
        let keys = keys();
        let foreign = token(&self::keys(), TokenUse::Access, "ev1", now_s());
        for t in [None, Some("garbage"), Some(foreign.as_str())] {
            let (status, slug) = slug_of(door(&keys).oneshot(buy(t, "ev1")).await.unwrap()).await;
            assert_eq!(
                (status, slug.as_str()),
                (StatusCode::UNAUTHORIZED, "invalid-token"),
                "{t:?}"
            );
        }
    }

    #[tokio::test]
    async fn queue_tickets_order_tokens_and_expired_tokens_do_not_open_the_shop() {
        let keys = keys();
        for t in [
            token(&keys, TokenUse::Queue, "ev1", now_s()),
            token(&keys, TokenUse::Order, "ev1", now_s()),
            token(&keys, TokenUse::Access, "ev1", now_s() - 3600),
        ] {
            let (status, slug) =
                slug_of(door(&keys).oneshot(buy(Some(&t), "ev1")).await.unwrap()).await;
            assert_eq!(
                (status, slug.as_str()),
                (StatusCode::UNAUTHORIZED, "invalid-token")
            );
        }
    }

    #[tokio::test]
    async fn a_token_for_another_event_gets_403() {
        let keys = keys();
        let t = token(&keys, TokenUse::Access, "ev1", now_s());
        let (status, slug) =
            slug_of(door(&keys).oneshot(buy(Some(&t), "ev2")).await.unwrap()).await;
        assert_eq!(
            (status, slug.as_str()),
            (StatusCode::FORBIDDEN, "wrong-event")
        );
    }

    #[test]
    fn the_event_comes_from_the_path() {
        assert_eq!(event_of("/v1/events/rock/orders"), Some("rock"));
        assert_eq!(event_of("/v2/events/rock/orders"), None);
        assert_eq!(event_of("/v1/events//orders"), None);
    }
}
