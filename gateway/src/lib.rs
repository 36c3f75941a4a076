//! The BoxOffice gateway: the only public surface.
//!
//! Fans join the waiting room, poll their place, buy with the access token
//! admission grants them and follow their order here; the fan page is served
//! at `/`. The waiting room itself lives in Redis (one round trip a request);
//! purchases are forwarded to the order service. [`serve`] runs [`app`], the
//! routes inside their protective layers.
//!
//! - [`queue`]: join the waiting room and poll your place (Redis only, one round trip).
//! - [`access`]: the tower layer that admits only valid access tokens to the shop.
//! - [`orders`]: buy (spend the token once, forward to the order service) and follow an order.
//! - [`events`]: public event info and the JWKS.
//! - [`cache`]: each event's settings, kept in memory for one admission tick.
//! - [`edge`]: the protective layers: request id, load shedding, deadline, per-IP rate limit, body limit.
//! - [`pow`]: the optional proof of work on join.
//! - [`identity`]: `account` events: the ticketing site's identity tokens, checked
//!   against its JWKS.
//! - [`client_ip`]: whose request it is, for the per-IP limit (trusted proxies and
//!   the header they write).
//! - [`per_fan`]: the per-fan rate limit of join, status and purchase.
//! - [`timeouts`]: the header, request and body timeouts, on one timer per connection.
//! - [`upstream`]: calls to the order service behind a bulkhead and a circuit breaker.
//! - [`config`]: the command line.
#![forbid(unsafe_code)]

pub mod access;
pub mod cache;
pub mod client_ip;
pub mod config;
pub mod edge;
pub mod events;
pub mod identity;
pub mod joins;
pub mod orders;
pub mod per_fan;
pub mod pow;
pub mod queue;
pub mod timeouts;
pub mod upstream;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use boxoffice_contract::openapi::FanSecurity;
use boxoffice_contract::redis_link::RedisLink;
use boxoffice_contract::token::KeySet;
use redis::Script;
use tokio::net::TcpListener;
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;

pub use config::Config;

/// The name the gateway's exported spans carry (`service.name`).
pub const SERVICE: &str = "boxoffice-gateway";

/// One per process, cloned into every request: one reference count, not one
/// per field (the per-request clone showed in the status poll's profile).
#[derive(Clone)]
pub struct AppState(Arc<Shared>);

impl std::ops::Deref for AppState {
    type Target = Shared;

    fn deref(&self) -> &Shared {
        &self.0
    }
}

pub struct Shared {
    pub redis: RedisLink,
    pub keys: KeySet,
    pub config: Arc<Config>,
    pub upstream: upstream::Upstream,
    pub scripts: Arc<Scripts>,
    /// The joins on their way to Redis, batched (see [`joins`]).
    pub joins: Arc<joins::Joins>,
    pub events: Arc<cache::EventCache>,
    pub per_fan: Arc<per_fan::PerFan>,
    /// The site login's keys, for `account` events (unset: such joins get 503).
    pub identity: Arc<identity::IdentityKeys>,
    /// The last readiness check: when, and whether Redis answered.
    pub readiness: tokio::sync::Mutex<Option<(std::time::Instant, bool)>>,
}

/// The Lua scripts of the hot paths, loaded once (EVALSHA after the first call).
pub struct Scripts {
    pub spend: Script,
    pub hold_over: Script,
}

impl AppState {
    pub fn new(redis: impl Into<RedisLink>, keys: KeySet, config: Config) -> anyhow::Result<Self> {
        let redis = redis.into();
        let upstream = upstream::Upstream::new(&config)?;
        let events = Arc::new(cache::EventCache::new(Duration::from_millis(
            config.event_cache_ms,
        )));
        let per_fan = Arc::new(per_fan::PerFan::new(
            config.per_fan_rate,
            config.per_fan_burst,
        ));
        // A JWKS file is read here (a broken one stops the start); a URL is
        // fetched by `serve`'s refresher, which reads either again later.
        let identity = Arc::new(identity::IdentityKeys::default());
        anyhow::ensure!(
            config.identity_jwks.is_none()
                || !(config.identity_issuer.is_empty() || config.identity_audience.is_empty()),
            "BOXOFFICE_IDENTITY_JWKS needs BOXOFFICE_IDENTITY_ISSUER and BOXOFFICE_IDENTITY_AUDIENCE"
        );
        anyhow::ensure!(
            !config.identity_jwks.as_deref().is_some_and(|s| identity::is_url(s) && !s.starts_with("https://")),
            "BOXOFFICE_IDENTITY_JWKS must be a file or an https:// URL (a JWKS fetched in clear could be swapped)"
        );
        if let Some(source) = config
            .identity_jwks
            .as_deref()
            .filter(|s| !identity::is_url(s))
        {
            let jwks = std::fs::read_to_string(source)
                .map_err(|e| anyhow::anyhow!("reading BOXOFFICE_IDENTITY_JWKS {source}: {e}"))?;
            let provider = identity::IdentityProvider::from_jwks(
                &jwks,
                &config.identity_issuer,
                &config.identity_audience,
            )?;
            identity.set(provider);
        }
        let joins = Arc::new(joins::Joins::new(redis.clone()));
        Ok(Self(Arc::new(Shared {
            identity,
            readiness: tokio::sync::Mutex::new(None),
            per_fan,
            redis,
            keys,
            events,
            config: Arc::new(config),
            upstream,
            joins,
            scripts: Arc::new(Scripts {
                spend: Script::new(include_str!("spend.lua")),
                hold_over: Script::new(include_str!("hold_over.lua")),
            }),
        })))
    }
}

/// The public API's OpenAPI document, before the routes add their paths.
#[derive(utoipa::OpenApi)]
#[openapi(
    info(
        title = "BoxOffice public API",
        description = "The waiting room and purchase API fans (and the fan page) call. Errors are RFC 9457 problem documents (`application/problem+json`) whose `type` ends in a stable slug; 429 and 503 carry `Retry-After`.",
        license(name = "Apache-2.0")
    ),
    modifiers(&FanSecurity),
    tags(
        (name = "events", description = "What is on sale"),
        (name = "queue", description = "The waiting room: join, wait, get admitted"),
        (name = "orders", description = "Buy with an access token, follow the order, download tickets"),
        (name = "tokens", description = "Keys to verify tokens"),
        (name = "pages", description = "The fan page"),
        (name = "meta", description = "Health, metrics, this document"),
    )
)]
pub struct ApiDoc;

/// Every route and the OpenAPI document built from the same list.
pub fn routes(state: &AppState) -> (Router<AppState>, utoipa::openapi::OpenApi) {
    boxoffice_contract::openapi::finish(
        OpenApiRouter::with_openapi(ApiDoc::openapi())
            .merge(events::router())
            .merge(queue::router())
            .merge(orders::router(state.keys.clone())),
    )
}

pub fn router(state: AppState) -> Router {
    let (routes, _) = routes(&state);
    boxoffice_contract::problem::with_fallbacks(routes).with_state(state)
}

/// The routes inside the protective layers: what `serve` runs.
pub fn app(
    state: AppState,
) -> impl tower::Service<
    axum::extract::Request,
    Response = axum::response::Response,
    Error = std::convert::Infallible,
    Future: Send + 'static,
> + Clone
       + Send
       + Sync
       + 'static {
    let config = state.config.clone();
    edge::protect(router(state), &config)
}

/// What [`serve`] knows of a request's connection, put in the request's
/// extensions: its peer and its timer ([`timeouts::Clock`]). One value
/// rather than axum's `ConnectInfo` and the clock apart: each value in a
/// request's extensions is a box of its own, and past seven their map is
/// built again, twice its size (`scripts/edge_cost.sh` counts it).
#[derive(Clone)]
pub struct Connection {
    pub peer: std::net::SocketAddr,
    pub clock: timeouts::Clock,
}

impl Connection {
    /// The peer of `request`: [`serve`]'s, or axum's `ConnectInfo` where
    /// the routes are served by `axum::serve` with connect info.
    pub fn peer_of<T>(request: &axum::http::Request<T>) -> Option<std::net::SocketAddr> {
        let extensions = request.extensions();
        extensions.get::<Connection>().map(|c| c.peer).or_else(|| {
            extensions
                .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
                .map(|axum::extract::ConnectInfo(peer)| *peer)
        })
    }
}

/// The routes inside their layers as one connection's hyper service: each
/// request gets its [`Connection`] and goes to this connection's own copy of
/// the stack. hyper-util's adapter (`TowerToHyperService`) clones the
/// whole stack for every request instead: a dozen reference counts, shared
/// by every core, counted up and down per request (the limiters, the
/// routers, the trusted proxies). A connection's requests come one at a time
/// (HTTP/1), so its copy is called in place; if the stack is not ready,
/// the request waits in a copy of its own, as under the adapter.
pub struct ConnectionService<S> {
    app: std::cell::RefCell<S>,
    /// What each request's extensions start as: see [`first_extensions`].
    extensions: axum::http::Extensions,
}

impl<S> ConnectionService<S> {
    pub fn new(app: S, connection: Connection) -> Self {
        Self {
            app: std::cell::RefCell::new(app),
            extensions: first_extensions(connection),
        }
    }
}

/// A request's extensions as [`ConnectionService`] hands it on: its
/// [`Connection`], in a map with room for seven values. A join or a status
/// poll gathers seven (its connection, client and trace context; the body
/// limit's; the router's matched path, path parameters and original URI; a
/// purchase one more, its access token's claims), and a map grown one value
/// at a time is built twice on the way (room for three, then for seven):
/// copied from this one, it is allocated once (about 800 instructions a
/// request fewer, `scripts/edge_cost.sh`). The map keeps its room when
/// values leave it, so three placeholders make it and go.
fn first_extensions(connection: Connection) -> axum::http::Extensions {
    #[derive(Clone, Copy)]
    struct Room<const N: u8>;
    let mut extensions = axum::http::Extensions::new();
    extensions.insert(connection);
    extensions.insert(Room::<1>);
    extensions.insert(Room::<2>);
    extensions.insert(Room::<3>);
    extensions.remove::<Room<1>>();
    extensions.remove::<Room<2>>();
    extensions.remove::<Room<3>>();
    extensions
}

impl<S, B> hyper::service::Service<axum::http::Request<B>> for ConnectionService<S>
where
    S: tower::Service<
            axum::extract::Request,
            Response = axum::response::Response,
            Error = std::convert::Infallible,
        > + Clone,
    B: axum::body::HttpBody<Data = axum::body::Bytes> + Send + 'static,
    B::Error: Into<axum::BoxError>,
{
    type Response = axum::response::Response;
    type Error = std::convert::Infallible;
    type Future =
        futures_util::future::Either<S::Future, tower::util::Oneshot<S, axum::extract::Request>>;

    fn call(&self, request: axum::http::Request<B>) -> Self::Future {
        use futures_util::future::Either;
        use tower::ServiceExt;
        let mut request = request.map(axum::body::Body::new);
        // hyper's own (an upgrade's, say) kept.
        let own = std::mem::replace(request.extensions_mut(), self.extensions.clone());
        request.extensions_mut().extend(own);
        // Not borrowed past this call: the answer's future owns what it needs.
        let mut app = self.app.borrow_mut();
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        match app.poll_ready(&mut cx) {
            std::task::Poll::Ready(Ok(())) => Either::Left(app.call(request)),
            _ => Either::Right(app.clone().oneshot(request)),
        }
    }
}

/// Serves `state` on `listener` until `shutdown` resolves, then lets the
/// requests in flight finish. Each connection must send a request's headers
/// within `header_timeout_ms` or is closed, so a client trickling bytes holds
/// a socket for seconds, never a place among the requests in flight; and one
/// address holds at most `max_connections_per_ip` sockets (trusted proxies
/// aside).
pub async fn serve(
    listener: TcpListener,
    state: AppState,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    use hyper_util::rt::TokioIo;

    let _refresher = state.config.identity_jwks.clone().map(|source| {
        AbortOnDrop(tokio::spawn(identity::keep_fresh(
            state.identity.clone(),
            source,
            state.config.identity_issuer.clone(),
            state.config.identity_audience.clone(),
            Duration::from_secs(state.config.identity_jwks_refresh_s),
        )))
    });
    let header_timeout = Duration::from_millis(state.config.header_timeout_ms.max(1));
    let proxies = client_ip::ClientIp::new(
        state.config.trusted_proxies.clone(),
        state.config.forwarded_header,
    );
    let connections = Arc::new(edge::PerClient::new(state.config.max_connections_per_ip));
    let app = app(state);
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (socket, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of file descriptors, say: wait instead of spinning.
                    tracing::warn!(%error, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let place = if proxies.is_trusted(peer.ip()) {
            None
        } else {
            match connections.enter(client_ip::key(peer.ip())) {
                Some(place) => Some(place),
                None => {
                    tracing::debug!(%peer, "too many connections from this address; closed");
                    continue;
                }
            }
        };
        socket.set_nodelay(true).ok();
        // The connection's timeouts share one timer (see `timeouts`).
        let clock = timeouts::Clock::new();
        let timer = timeouts::ConnectionTimer(clock.clone());
        let service = ConnectionService::new(app.clone(), Connection { peer, clock });
        let connection = hyper::server::conn::http1::Builder::new()
            .timer(timer)
            .header_read_timeout(header_timeout)
            .serve_connection(TokioIo::new(socket), service);
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::debug!(%error, "connection ended");
            }
            drop(place);
        });
    }
    drop(listener);
    // Within the orchestrator's grace period (30 s in k8s/): a connection
    // that stays busy past it is cut.
    if tokio::time::timeout(Duration::from_secs(20), graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("connections still open after 20 s of draining; closing them");
    }
    Ok(())
}

pub use boxoffice_contract::auth::bearer;

pub(crate) fn redis_down(error: redis::RedisError) -> boxoffice_contract::Problem {
    tracing::error!(%error, "redis error");
    boxoffice_contract::Problem::unavailable("overloaded", "the waiting room is busy; try again", 1)
}

/// Stops a background task when `serve` returns.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::task::{Context, Poll};

    use axum::body::Body;
    use axum::extract::Request;
    use axum::response::{IntoResponse, Response};

    use super::*;

    /// Answers each request with the peer its `Connection` names; counts
    /// its copies; not ready for its first `not_ready` polls.
    struct Probe {
        copies: Arc<AtomicUsize>,
        not_ready: usize,
    }

    impl Clone for Probe {
        fn clone(&self) -> Self {
            self.copies.fetch_add(1, Ordering::Relaxed);
            Self {
                copies: self.copies.clone(),
                not_ready: self.not_ready,
            }
        }
    }

    impl tower::Service<Request> for Probe {
        type Response = Response;
        type Error = Infallible;
        type Future = std::future::Ready<Result<Response, Infallible>>;

        fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            if self.not_ready > 0 {
                self.not_ready -= 1;
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, request: Request) -> Self::Future {
            assert_eq!(self.not_ready, 0, "called before it was ready");
            let extensions = request.extensions();
            let peer = extensions.get::<Connection>().map(|c| c.peer.to_string());
            let mut answer = peer.unwrap_or_default();
            if let Some(Hypers(what)) = extensions.get::<Hypers>() {
                answer = format!("{answer} {what}");
            }
            std::future::ready(Ok(answer.into_response()))
        }
    }

    /// A value hyper put in a request's extensions, which `Probe` answers
    /// with after the peer.
    #[derive(Clone)]
    struct Hypers(&'static str);

    /// A connection from 192.0.2.7:5000 to a `Probe` not ready for its
    /// first `not_ready` polls, and the count of the probe's copies.
    fn probed(not_ready: usize) -> (ConnectionService<Probe>, Arc<AtomicUsize>) {
        let copies = Arc::new(AtomicUsize::new(0));
        let probe = Probe {
            copies: copies.clone(),
            not_ready,
        };
        let connection = Connection {
            peer: std::net::SocketAddr::from(([192, 0, 2, 7], 5000)),
            clock: timeouts::Clock::new(),
        };
        (ConnectionService::new(probe, connection), copies)
    }

    async fn text(response: Response) -> String {
        let bytes = axum::body::to_bytes(response.into_body(), 1024)
            .await
            .unwrap();
        String::from_utf8(bytes.to_vec()).unwrap()
    }

    /// A connection's requests go to its own copy of the stack, with their
    /// connection in their extensions: the stack is not copied per request.
    #[tokio::test]
    async fn a_connections_requests_share_its_copy_of_the_stack() {
        let (service, copies) = probed(0);
        for _ in 0..3 {
            let response = hyper::service::Service::call(&service, Request::new(Body::empty()))
                .await
                .unwrap();
            assert_eq!(text(response).await, "192.0.2.7:5000");
        }
        assert_eq!(copies.load(Ordering::Relaxed), 0, "copies of the stack");
    }

    /// What hyper put in a request's extensions (an upgrade's handle, say)
    /// stays there beside its connection, request after request.
    #[tokio::test]
    async fn a_requests_own_extensions_are_kept_beside_its_connection() {
        let (service, _) = probed(0);
        for what in ["upgrade", "another"] {
            let mut request = Request::new(Body::empty());
            request.extensions_mut().insert(Hypers(what));
            let response = hyper::service::Service::call(&service, request)
                .await
                .unwrap();
            assert_eq!(text(response).await, format!("192.0.2.7:5000 {what}"));
        }
        let response = hyper::service::Service::call(&service, Request::new(Body::empty()))
            .await
            .unwrap();
        assert_eq!(text(response).await, "192.0.2.7:5000", "nothing left over");
    }

    /// A stack not ready yet is waited for, in a copy of its own, before
    /// it is called.
    #[tokio::test]
    async fn a_stack_not_ready_is_waited_for() {
        let (service, copies) = probed(2);
        let response = hyper::service::Service::call(&service, Request::new(Body::empty()))
            .await
            .unwrap();
        assert_eq!(text(response).await, "192.0.2.7:5000");
        assert_eq!(copies.load(Ordering::Relaxed), 1, "copies of the stack");
    }
}
