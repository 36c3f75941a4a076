//! The gateway's protective layers, in the order a request meets them:
//!
//! 1. request id, client and trace: every request gets an `x-request-id` (or
//!    keeps the caller's), echoed in the answer; its client address is found
//!    once, for the limits below ([`crate::client_ip`]); and it gets a W3C
//!    trace context (a new trace,
//!    or the `traceparent` of a trusted proxy: a client's own is dropped, so
//!    it can neither choose trace ids nor turn sampling off for its
//!    requests); both are recorded on the request's log
//!    span (`request_id`, `trace_id`) and sent on to the order service. Its
//!    telemetry counts `boxoffice_http_requests_total{route,status}` and
//!    times `boxoffice_http_request_duration_seconds`, so answers of the
//!    layers below are counted too: under `route="unmatched"` when given
//!    before the router matched a route (429, a shed 503), under the route
//!    after (a passed deadline's 503; `telemetry::MarkRoute` on the routes
//!    tells the request which it took);
//! 2. places: one address has at most `per_client_in_flight` requests in
//!    flight (429 past it), so trickled bodies from one address cannot take
//!    the global places; and at most `max_in_flight` requests are handled at
//!    once (load shedding: the next gets 503 `overloaded` with `Retry-After`
//!    at once instead of queueing);
//! 3. a deadline for the whole request: 503 `overloaded` when it passes;
//! 4. per-IP rate limit (`tower_governor`, keyed by [`crate::client_ip`]):
//!    past the quota, 429 `rate-limited` with `Retry-After`, before the
//!    routes do any work; addresses back to a full quota are forgotten every
//!    5 s;
//! 5. a body limit (larger bodies are 413 `payload-too-large`) and a body
//!    read timeout per part.
//!
//! The first three, and the body's timeout, are one service ([`Edge`]) with
//! one future, around the per-IP limit's `Governor` and the routes. A
//! request refused a place still draws on its address's quota (and past it
//! gets the per-IP limit's 429), so the quota counts every request, as if
//! the per-IP limit came first. `/healthz`, `/readyz` and
//! `/metrics` go around all of them. Headers must arrive within
//! `header_timeout_ms` (see [`crate::serve`]). The three timeouts run on one
//! timer per connection ([`crate::timeouts`]).
//!
//! The access-token check sits on the purchase route itself (see [`crate::access`]).

use std::convert::Infallible;
use std::time::Duration;

use axum::extract::DefaultBodyLimit;
use axum::http::{HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Router;
use boxoffice_contract::request_log::{self, RequestLog};
use boxoffice_contract::{telemetry, Problem};
use governor::middleware::NoOpMiddleware;
use tower::ServiceBuilder;
use tower_governor::governor::{Governor, GovernorConfigBuilder, SharedRateLimiter};
use tower_governor::GovernorError;

use crate::client_ip::{Client, ClientIp};
use crate::timeouts;
use crate::Config;

/// What orchestrators and Prometheus call: never limited, shed or counted.
const PROBES: [&str; 3] = ["/healthz", "/readyz", "/metrics"];

/// Wraps the routes in the protective layers configured in `config`.
pub fn protect(
    routes: Router,
    config: &Config,
) -> impl tower::Service<
    axum::extract::Request,
    Response = Response,
    Error = Infallible,
    Future: Send + 'static,
> + Clone
       + Send
       + Sync
       + 'static {
    // Who the client is, and whose headers are believed: the same for the
    // per-IP limit, the per-client places and the trace.
    let clients = ClientIp::new(config.trusted_proxies.clone(), config.forwarded_header);
    // tower_governor's config names the key; the limiter is ours (below),
    // set on its `Governor` in place of the config's own.
    let per_ip = GovernorConfigBuilder::default()
        .key_extractor(clients.clone())
        .finish()
        .expect("the default rate and burst");
    let per_ip_limiter = per_ip_limiter(config);
    let refused_per_ip = per_ip_limiter.clone();
    let places = std::sync::Arc::new(Places::new(
        PerClient::new(config.per_client_in_flight),
        config.max_in_flight,
    ));
    let body_timeout = Duration::from_millis(config.body_timeout_ms.max(1));
    // Probes and metrics stay outside the fans' limits: an orchestrator or
    // Prometheus behind the same address as a flood still gets its answer.
    let probes = routes.clone();
    let mut per_ip = Governor::new(
        // Around the router, not through `Router::layer`: that boxes every
        // route again, a box each request clones.
        ServiceBuilder::new()
            .layer(DefaultBodyLimit::max(config.body_limit_bytes))
            .service(routes.layer(telemetry::MarkRoute)),
        &per_ip,
    )
    .error_handler(rate_limited);
    per_ip.limiter = per_ip_limiter;
    Edge {
        probes,
        guarded: per_ip,
        per_ip: refused_per_ip,
        clients,
        places,
        timeout: Duration::from_millis(config.request_timeout_ms),
        body_timeout,
    }
}

/// The per-IP quota of `config`, in more shards than `governor`'s default
/// (see `per_fan::LIMITER_SHARDS`: every new client address is a new key),
/// swept every [`crate::per_fan::SWEEP_EVERY`].
fn per_ip_limiter(config: &Config) -> SharedRateLimiter<std::net::IpAddr, NoOpMiddleware> {
    let limiter = std::sync::Arc::new(governor::RateLimiter::new(
        governor::Quota::with_period(Duration::from_millis(
            (1000 / config.per_ip_rate.max(1)).max(1),
        ))
        .expect("a positive period")
        .allow_burst(std::num::NonZeroU32::new(config.per_ip_burst.max(1)).expect("at least one")),
        crate::per_fan::keyed_state(),
        governor::clock::DefaultClock::default(),
    ));
    crate::per_fan::sweep(&limiter, crate::per_fan::SWEEP_EVERY);
    limiter
}

/// The edge as one service: the probes steered around it by path (with no
/// router of its own: a second router's miss, fallback and boxing cost
/// every request), and for every other request, in order, its id, client
/// and trace, its telemetry, its places and its deadline, then the per-IP
/// limit and the routes. One service and one future for what were six
/// layers, each of which moved the future of the layers inside it (about a
/// thousand bytes in all) into its own.
#[derive(Clone)]
struct Edge<S> {
    probes: Router,
    /// The per-IP limit around the routes.
    guarded: S,
    /// The per-IP limit's own limiter, for requests refused a place.
    per_ip: SharedRateLimiter<std::net::IpAddr, NoOpMiddleware>,
    clients: ClientIp,
    places: std::sync::Arc<Places>,
    timeout: Duration,
    body_timeout: Duration,
}

impl<S> tower::Service<axum::extract::Request> for Edge<S>
where
    S: tower::Service<axum::extract::Request, Response = Response, Error = Infallible> + Clone,
{
    type Response = Response;
    type Error = Infallible;
    type Future = Answer<S::Future>;

    /// Ready when the guarded routes are (a router always is, so the
    /// probes need no wait). Each connection readies its own copy of the
    /// stack and calls it ([`crate::ConnectionService`]), so the request
    /// goes straight to it: cloning the whole stack again (its reference
    /// counts, shared by every core) would cost each request.
    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Infallible>> {
        self.guarded.poll_ready(cx)
    }

    fn call(&mut self, mut request: axum::extract::Request) -> Self::Future {
        if PROBES.contains(&request.uri().path()) {
            return Answer::Probe {
                future: self.probes.call(request),
            };
        }
        let (request_id, client) = self.identify(&mut request);
        let (observation, log) = telemetry::Observation::begin(
            Some(crate::SERVICE),
            &request,
            request_id.to_str().unwrap_or(""),
        );
        request.extensions_mut().insert(observation.trace());
        // What comes after is done with the request current: what it logs
        // is the request's.
        let mut log = Some(log);
        let stage = request_log::with_request(&mut log, || match self.places.take(client) {
            Ok(held) => Stage::Handled {
                clock: timeouts::Clock::of(&request),
                deadline: tokio::time::Instant::now() + self.timeout,
                routes: self
                    .guarded
                    .call(timeouts::per_part(request, self.body_timeout)),
                held,
            },
            Err(refusal) => Stage::Refused {
                answer: Some(self.refuse(client, refusal)),
            },
        });
        Answer::Guarded {
            guarded: Guarded {
                stage,
                observation: Some(observation),
                log,
                request_id: Some(request_id),
            },
        }
    }
}

impl<S> Edge<S> {
    /// The answer to a request from `client` refused a place. It still
    /// draws on its address's quota, as every request does (the per-IP
    /// limit answers those given a place): a client hammering a full
    /// gateway is held to its rate, and past it gets the per-IP limit's 429
    /// with the time to wait, as when the per-IP limit came before the
    /// places.
    fn refuse(&self, client: Option<std::net::IpAddr>, refusal: NoPlace) -> Response {
        match client.map(|client| self.per_ip.check_key(&client)) {
            Some(Err(not_until)) => {
                use governor::clock::{Clock as _, DefaultClock};
                rate_limited(GovernorError::TooManyRequests {
                    wait_time: not_until
                        .wait_time_from(DefaultClock::default().now())
                        .as_secs(),
                    headers: None,
                })
            }
            _ => refusal.answer(),
        }
    }

    /// Who the request is from and which it is, before its telemetry
    /// begins:
    ///
    /// - its client: found here once ([`Client`], also in its extensions for
    ///   the per-IP limit's key);
    /// - its trace: continued only from a trusted proxy (one that traces, in
    ///   front of the gateway). Anyone else's `traceparent` and `tracestate`
    ///   are dropped: a client that chose its own trace id could pile its
    ///   requests onto another's trace, and its sampled flag would turn
    ///   tracing off for them;
    /// - its id: the caller's `x-request-id`, or a new one, returned for
    ///   its log (where the purchase route finds it for the order service)
    ///   and its answer.
    fn identify(
        &self,
        request: &mut axum::extract::Request,
    ) -> (HeaderValue, Option<std::net::IpAddr>) {
        let request_id = match request.headers().get(&X_REQUEST_ID) {
            Some(id) => id.clone(),
            None => {
                let id = uuid::Uuid::new_v4();
                let id = HeaderValue::from_str(
                    id.hyphenated()
                        .encode_lower(&mut uuid::Uuid::encode_buffer()),
                )
                .expect("a UUID is a header value");
                // Not put in the request's headers: a handler that sends it
                // on finds it in the request's log (`request_log::request_id`).
                id
            }
        };
        let peer = crate::Connection::peer_of(request).map(|peer| peer.ip());
        let (client, trusted) = match peer {
            Some(peer) => {
                let (client, trusted) = self.clients.behind(peer, request.headers());
                request.extensions_mut().insert(Client(client));
                (Some(client), trusted)
            }
            None => (None, false),
        };
        if !trusted {
            let headers = request.headers_mut();
            headers.remove(&TRACEPARENT);
            headers.remove(&TRACESTATE);
        }
        (request_id, client)
    }
}

pin_project_lite::pin_project! {
    /// The answer of [`Edge`]: a probe's, or a guarded request's.
    #[project = AnswerProjection]
    enum Answer<F> {
        Probe { #[pin] future: axum::routing::future::RouteFuture<Infallible> },
        Guarded { #[pin] guarded: Guarded<F> },
    }
}

impl<F> std::future::Future for Answer<F>
where
    F: std::future::Future<Output = Result<Response, Infallible>>,
{
    type Output = Result<Response, Infallible>;

    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        match self.project() {
            AnswerProjection::Probe { future } => future.poll(cx),
            AnswerProjection::Guarded { guarded } => guarded.poll(cx),
        }
    }
}

pin_project_lite::pin_project! {
    /// A guarded request's answer, counted and timed when it comes, with
    /// the request's id and trace on it.
    struct Guarded<F> {
        // Until dropped, with the request current (as a span's
        // `Instrumented` does): what it logs on the way out, answered or
        // given up (the client gone), is the request's too.
        #[pin]
        stage: Stage<F>,
        observation: Option<telemetry::Observation>,
        // The request, current while the answer is polled or dropped.
        log: Option<RequestLog>,
        request_id: Option<HeaderValue>,
    }

    impl<F> PinnedDrop for Guarded<F> {
        fn drop(this: Pin<&mut Self>) {
            let mut this = this.project();
            // Answered, it was dropped then (see `poll`).
            if !matches!(this.stage.as_ref().get_ref(), Stage::Dropped) {
                request_log::with_request(this.log, || this.stage.set(Stage::Dropped));
            }
        }
    }
}

pin_project_lite::pin_project! {
    /// Where a guarded request is.
    #[project = StageProjection]
    enum Stage<F> {
        /// In the routes, its places held until it is dropped: their
        /// answer, or 503 once its deadline passes.
        Handled {
            #[pin]
            routes: F,
            held: Held,
            clock: timeouts::Clock,
            deadline: tokio::time::Instant,
        },
        /// Refused a place: this answer.
        Refused { answer: Option<Response> },
        /// Answered (the routes' future dropped as it answered), or being
        /// dropped.
        Dropped,
    }
}

impl<F> std::future::Future for Guarded<F>
where
    F: std::future::Future<Output = Result<Response, Infallible>>,
{
    type Output = Result<Response, Infallible>;

    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        use std::task::Poll;
        let this = self.project();
        let (mut stage, observation, request_id) = (this.stage, this.observation, this.request_id);
        request_log::with_request(this.log, || {
            let response = match stage.as_mut().project() {
                StageProjection::Handled {
                    routes,
                    clock,
                    deadline,
                    ..
                } => match routes.poll(cx) {
                    Poll::Ready(Ok(response)) => response,
                    Poll::Ready(Err(never)) => match never {},
                    Poll::Pending => match clock.poll_until(*deadline, cx) {
                        Poll::Ready(()) => Problem::unavailable(
                            "overloaded",
                            "the request took too long; try again",
                            1,
                        )
                        .into_response(),
                        Poll::Pending => return Poll::Pending,
                    },
                },
                StageProjection::Refused { answer } => {
                    answer.take().expect("polled after it answered")
                }
                StageProjection::Dropped => unreachable!("polled after it answered"),
            };
            // Its places given back and the routes' future dropped now,
            // with the request still current: the answer's future is
            // dropped later, and then needs the request no more.
            stage.set(Stage::Dropped);
            let observation = observation.take().expect("polled after it answered");
            let mut response = observation.finish(response);
            if let Some(id) = request_id.take() {
                response.headers_mut().insert(X_REQUEST_ID, id);
            }
            Poll::Ready(Ok(response))
        })
    }
}

// Header names made once: a `&'static str` is parsed again on each lookup.
const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");
const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");
const TRACESTATE: HeaderName = HeaderName::from_static("tracestate");

fn rate_limited(error: GovernorError) -> Response {
    match error {
        GovernorError::TooManyRequests { wait_time, .. } => Problem::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate-limited",
            "too many requests from this address",
        )
        .retry_after(wait_time)
        .into_response(),
        GovernorError::UnableToExtractKey => {
            Problem::bad_request("the peer address is unknown").into_response()
        }
        GovernorError::Other { code, msg, .. } => {
            Problem::new(code, "rate-limited", msg.unwrap_or_default())
                .retry_after(1)
                .into_response()
        }
    }
}

/// Places per client address: requests in flight (one address cannot hold
/// the global places, `max_in_flight`, with requests whose bodies trickle
/// in), and open connections (see [`crate::serve`]).
///
/// The counts are kept in a fixed table of atomic counters, an address's
/// being the one its keyed hash picks ([`SLOTS`] of them): taking a place
/// is one atomic step on one cache line, with no lock, no allocation and
/// nothing to forget afterwards. A map of addresses did the same with a
/// shard's lock, an insert and a removal for every request of a new address
/// (under the edge benchmark's spread of addresses, every request). An address
/// never holds more than its `max`; addresses that share a counter share
/// it, so one that holds all of its `max` refuses, while it does, the
/// others whose hash picks the same counter (one in 65,536 of all
/// addresses; which ones changes with the key each process draws).
pub struct PerClient {
    max: u32,
    slots: Box<[std::sync::atomic::AtomicU32]>,
    /// Drawn at random per process; fixed in tests, whose addresses then
    /// pick counters of their own every run.
    hasher: foldhash::quality::SeedableRandomState,
}

/// Counters in a [`PerClient`] table (256 KiB).
pub const SLOTS: usize = 1 << 16;

impl PerClient {
    pub fn new(max: usize) -> Self {
        Self {
            max: u32::try_from(max.max(1)).unwrap_or(u32::MAX),
            slots: (0..SLOTS).map(|_| Default::default()).collect(),
            hasher: if cfg!(test) {
                foldhash::quality::SeedableRandomState::fixed()
            } else {
                foldhash::quality::SeedableRandomState::random()
            },
        }
    }

    fn slot(&self, client: std::net::IpAddr) -> &std::sync::atomic::AtomicU32 {
        use std::hash::BuildHasher;
        &self.slots[self.hasher.hash_one(client) as usize % SLOTS]
    }

    /// A place for `client`, given back when dropped; `None` if it holds
    /// all it may.
    pub(crate) fn enter(self: &std::sync::Arc<Self>, client: std::net::IpAddr) -> Option<InFlight> {
        self.take(client).then(|| InFlight {
            owner: self.clone(),
            client,
        })
    }

    /// Takes one of `client`'s places; `false` if it holds all it may.
    fn take(&self, client: std::net::IpAddr) -> bool {
        let max = self.max;
        self.slot(client)
            .fetch_update(
                std::sync::atomic::Ordering::Relaxed,
                std::sync::atomic::Ordering::Relaxed,
                |held| (held < max).then_some(held + 1),
            )
            .is_ok()
    }

    /// Gives one of `client`'s places back.
    fn give_back(&self, client: std::net::IpAddr) {
        self.slot(client)
            .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// The places held by `client` and any address sharing its counter (for tests).
    #[cfg(test)]
    fn held(&self, client: &str) -> u32 {
        self.slot(client.parse().unwrap())
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The places held by all addresses (for tests).
    #[cfg(test)]
    fn held_in_all(&self) -> u32 {
        self.slots
            .iter()
            .map(|slot| slot.load(std::sync::atomic::Ordering::Relaxed))
            .sum()
    }
}

/// One connection's place; given back when dropped.
pub(crate) struct InFlight {
    owner: std::sync::Arc<PerClient>,
    client: std::net::IpAddr,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.owner.give_back(self.client);
    }
}

/// A place for the request: one of its client's (`per_client_in_flight`,
/// 429 past it) and one of the gateway's (`max_in_flight`: 503 `overloaded`
/// at once past it, rather than queueing), both given back when it is
/// answered. The gateway's places are a count, not a semaphore: no request
/// waits for one, and giving one back is one atomic step (a semaphore's
/// also takes its waiters' lock).
struct Places {
    per_client: PerClient,
    max: usize,
    in_flight: std::sync::atomic::AtomicUsize,
}

/// What a request holds while it is handled: its places, given back when
/// dropped.
struct Held {
    places: std::sync::Arc<Places>,
    /// The client whose place it holds; none for a request whose client is
    /// unknown.
    client: Option<std::net::IpAddr>,
}

impl Drop for Held {
    fn drop(&mut self) {
        if let Some(client) = self.client {
            self.places.per_client.give_back(client);
        }
        self.places
            .in_flight
            .fetch_sub(1, std::sync::atomic::Ordering::Release);
    }
}

/// Why a request got no place.
enum NoPlace {
    /// Its client holds all it may.
    Client,
    /// The gateway is at `max_in_flight`.
    Gateway,
}

impl NoPlace {
    fn answer(self) -> Response {
        match self {
            NoPlace::Client => Problem::new(
                StatusCode::TOO_MANY_REQUESTS,
                "rate-limited",
                "too many requests from this address at once",
            )
            .retry_after(1)
            .into_response(),
            NoPlace::Gateway => {
                Problem::unavailable("overloaded", "the gateway is at capacity; try again", 1)
                    .into_response()
            }
        }
    }
}

impl Places {
    fn new(per_client: PerClient, max: usize) -> Self {
        Self {
            per_client,
            max: max.max(1),
            in_flight: Default::default(),
        }
    }

    /// The places of a request from `client` (none where its client is
    /// unknown: a gateway place only), or why it gets none.
    fn take(
        self: &std::sync::Arc<Self>,
        client: Option<std::net::IpAddr>,
    ) -> Result<Held, NoPlace> {
        use std::sync::atomic::Ordering;
        if let Some(client) = client {
            if !self.per_client.take(client) {
                return Err(NoPlace::Client);
            }
        }
        let max = self.max;
        if self
            .in_flight
            .fetch_update(Ordering::Acquire, Ordering::Relaxed, |held| {
                (held < max).then_some(held + 1)
            })
            .is_err()
        {
            if let Some(client) = client {
                self.per_client.give_back(client);
            }
            return Err(NoPlace::Gateway);
        }
        Ok(Held {
            places: self.clone(),
            client,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;
    use std::sync::{Arc, Mutex};

    use axum::body::Body;
    use axum::extract::ConnectInfo;
    use axum::http::Request;
    use axum::routing::get;
    use tower::ServiceExt;

    use super::*;

    /// A log sink the test can read.
    #[derive(Clone, Default)]
    struct Sink(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Sink {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// The gateway's per-IP map forgets the addresses back to a full quota
    /// every 5 s, not every minute: a spike's addresses of the last few
    /// seconds are all it holds.
    #[tokio::test(start_paused = true)]
    async fn the_per_ip_map_forgets_idle_addresses_every_five_seconds() {
        let limiter = per_ip_limiter(&Config::defaults());
        for last in 1..=100u8 {
            let address = std::net::IpAddr::from([10, 0, 0, last]);
            assert!(limiter.check_key(&address).is_ok());
        }
        // One request each: a full quota again 1/rate later, on governor's
        // clock, which is the real one (tokio's is paused).
        std::thread::sleep(Duration::from_millis(100));
        tokio::time::sleep(Duration::from_millis(4_900)).await;
        assert_eq!(limiter.len(), 100, "no sweep before 5 s");
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(limiter.len(), 0, "all forgotten by the sweep at 5 s");
    }

    #[tokio::test]
    async fn log_lines_of_a_request_carry_its_request_id_and_trace_id() {
        let sink = Sink::default();
        let writer = sink.clone();
        let logs =
            boxoffice_contract::telemetry::logs("info", false, false, move || writer.clone());
        let routes = Router::new().route(
            "/hello",
            get(|| async {
                tracing::info!("handling hello");
                "hi"
            }),
        );
        // The peer is a proxy the gateway trusts: its trace is continued.
        let mut config = Config::defaults();
        config.trusted_proxies = vec!["127.0.0.1/32".parse().unwrap()];
        let app = ServiceBuilder::new()
            .layer(axum::Extension(ConnectInfo(SocketAddr::from((
                [127, 0, 0, 1],
                9,
            )))))
            .service(protect(routes, &config));
        let request = Request::get("/hello")
            .header("x-request-id", "req-42")
            .header(
                "traceparent",
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            )
            .body(Body::empty())
            .unwrap();
        let _guard = tracing::dispatcher::set_default(&logs);
        let response = app.oneshot(request).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(response.headers()["x-request-id"], "req-42");
        let answered = response.headers()["traceparent"].to_str().unwrap();
        assert!(
            answered.starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-"),
            "{answered}"
        );
        let logs = String::from_utf8(sink.0.lock().unwrap().clone()).unwrap();
        let line = logs
            .lines()
            .find(|l| l.contains("handling hello"))
            .unwrap_or_else(|| panic!("no log line: {logs}"));
        assert!(line.contains("request_id=req-42"), "{line}");
        assert!(
            line.contains("trace_id=4bf92f3577b34da6a3ce929d0e0e4736"),
            "{line}"
        );
    }

    /// A client's own `traceparent` is not continued: it cannot choose the
    /// trace id its requests are recorded under, nor unsample them.
    #[tokio::test]
    async fn a_clients_own_trace_context_is_not_continued() {
        let client = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00";
        let answered = |trusted: &'static str| async move {
            let mut config = Config::defaults();
            config.trusted_proxies = vec![trusted.parse().unwrap()];
            let app = ServiceBuilder::new()
                .layer(axum::Extension(ConnectInfo(SocketAddr::from((
                    [203, 0, 113, 7],
                    9,
                )))))
                .service(protect(
                    Router::new().route("/hello", get(|| async { "hi" })),
                    &config,
                ));
            let request = Request::get("/hello")
                .header("traceparent", client)
                .header("tracestate", "mallory=1")
                .body(Body::empty())
                .unwrap();
            let response = app.oneshot(request).await.unwrap();
            assert_eq!(response.status(), StatusCode::OK);
            response.headers()["traceparent"]
                .to_str()
                .unwrap()
                .to_owned()
        };
        // From a client: a new trace, sampled as the gateway decides.
        let own = answered("10.0.0.0/8").await;
        assert!(!own.contains("4bf92f3577b34da6a3ce929d0e0e4736"), "{own}");
        assert!(own.ends_with("-01"), "{own}");
        // The same header from a trusted proxy is the trace to continue.
        let proxied = answered("203.0.113.0/24").await;
        assert!(
            proxied.starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-"),
            "{proxied}"
        );
    }

    /// A handler's future, dropped when the edge gives its request up,
    /// logs with the request's fields, as it would while answering: cut
    /// off by the deadline's 503 (dropped as that is answered, before the
    /// answer's future is), or given up with its answer's future (the
    /// client gone).
    #[tokio::test]
    async fn a_handler_given_up_is_dropped_with_its_request_current() {
        /// Logs when dropped.
        struct Goodbye;
        impl Drop for Goodbye {
            fn drop(&mut self) {
                tracing::info!("handler dropped");
            }
        }
        use tower::Service as _;
        let sink = Sink::default();
        let writer = sink.clone();
        let logs =
            boxoffice_contract::telemetry::logs("info", false, false, move || writer.clone());
        let _guard = tracing::dispatcher::set_default(&logs);
        let app = |request_timeout_ms| {
            let routes = Router::new().route(
                "/stuck",
                get(|| async {
                    let _goodbye = Goodbye;
                    std::future::pending::<()>().await;
                }),
            );
            let mut config = Config::defaults();
            config.request_timeout_ms = request_timeout_ms;
            ServiceBuilder::new()
                .layer(axum::Extension(ConnectInfo(SocketAddr::from((
                    [203, 0, 113, 7],
                    9,
                )))))
                .service(protect(routes, &config))
        };
        let stuck = |id: &str| {
            Request::get("/stuck")
                .header("x-request-id", id)
                .body(Body::empty())
                .unwrap()
        };
        let dropped = || {
            let logs = String::from_utf8(sink.0.lock().unwrap().clone()).unwrap();
            let lines: Vec<String> = logs
                .lines()
                .filter(|l| l.contains("handler dropped"))
                .map(str::to_owned)
                .collect();
            lines
        };
        // Past the deadline: 503, the handler dropped as it is answered.
        let mut late = app(50);
        let mut answer = Box::pin(late.ready().await.unwrap().call(stuck("req-late")));
        let response = answer.as_mut().await.unwrap();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        let lines = dropped();
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(lines[0].contains("request_id=req-late"), "{lines:?}");
        drop(answer);
        // Given up by its caller, long before its deadline.
        let given_up = tokio::time::timeout(
            Duration::from_millis(50),
            app(60_000).oneshot(stuck("req-gone")),
        )
        .await;
        assert!(given_up.is_err(), "answered: {given_up:?}");
        let lines = dropped();
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert!(lines[1].contains("request_id=req-gone"), "{lines:?}");
    }

    /// A request refused a place still draws on its address's quota, as
    /// when the per-IP limit came before the places: hammering a full
    /// gateway is held to the rate, and past it answered by the per-IP
    /// limit.
    #[tokio::test]
    async fn a_request_refused_a_place_draws_on_its_addresss_quota() {
        use tower::Service as _;
        let mut config = Config::defaults();
        config.per_client_in_flight = 1;
        config.per_ip_rate = 1;
        config.per_ip_burst = 3;
        let mut app = ServiceBuilder::new()
            .layer(axum::Extension(ConnectInfo(SocketAddr::from((
                [203, 0, 113, 7],
                9,
            )))))
            .service(protect(
                Router::new()
                    .route("/stuck", get(std::future::pending::<()>))
                    .route("/hello", get(|| async { "hi" })),
                &config,
            ));
        let get = |path: &str| Request::get(path).body(Body::empty()).unwrap();
        let detail = |response: Response| async move {
            let status = response.status();
            let body = axum::body::to_bytes(response.into_body(), 4096)
                .await
                .unwrap();
            let problem: serde_json::Value = serde_json::from_slice(&body).unwrap();
            (status, problem["detail"].as_str().unwrap().to_owned())
        };
        // The address's one place held (one of its three requests' worth).
        let mut stuck = Box::pin(app.ready().await.unwrap().call(get("/stuck")));
        let polled = tokio::time::timeout(Duration::from_millis(20), stuck.as_mut()).await;
        assert!(polled.is_err(), "answered: {polled:?}");
        // Refused a place: the second of three.
        let second = app.clone().oneshot(get("/hello")).await.unwrap();
        assert_eq!(
            detail(second).await,
            (
                StatusCode::TOO_MANY_REQUESTS,
                "too many requests from this address at once".to_owned()
            )
        );
        // The third.
        let third = app.clone().oneshot(get("/hello")).await.unwrap();
        assert_eq!(third.status(), StatusCode::TOO_MANY_REQUESTS);
        // Past the quota: the per-IP limit's answer, place or none.
        let fourth = app.clone().oneshot(get("/hello")).await.unwrap();
        assert_eq!(
            detail(fourth).await,
            (
                StatusCode::TOO_MANY_REQUESTS,
                "too many requests from this address".to_owned()
            )
        );
        drop(stuck);
        let fifth = app.clone().oneshot(get("/hello")).await.unwrap();
        assert_eq!(
            detail(fifth).await,
            (
                StatusCode::TOO_MANY_REQUESTS,
                "too many requests from this address".to_owned()
            )
        );
    }

    /// A request's places are given back when it is answered, not when
    /// its answer's future is dropped (whenever its caller drops it).
    #[tokio::test]
    async fn places_are_given_back_as_the_request_is_answered() {
        let mut config = Config::defaults();
        config.per_client_in_flight = 1;
        let app = ServiceBuilder::new()
            .layer(axum::Extension(ConnectInfo(SocketAddr::from((
                [203, 0, 113, 7],
                9,
            )))))
            .service(protect(
                Router::new().route("/hello", get(|| async { "hi" })),
                &config,
            ));
        let hello = || Request::get("/hello").body(Body::empty()).unwrap();
        // Called, not `oneshot`, which drops the future as it answers.
        use tower::Service as _;
        let mut service = app.clone();
        let mut first = Box::pin(service.ready().await.unwrap().call(hello()));
        let answered = first.as_mut().await.unwrap();
        assert_eq!(answered.status(), StatusCode::OK);
        // The first answer's future not dropped yet: its place is free.
        let second = app.clone().oneshot(hello()).await.unwrap();
        assert_eq!(second.status(), StatusCode::OK);
        drop(first);
    }

    /// A client address.
    fn from(client: &str) -> Option<std::net::IpAddr> {
        Some(client.parse().unwrap())
    }

    /// Addresses whose hash picks the same counter share its places: the
    /// cost of a table with no lock and nothing to forget (one address in
    /// 65,536 shares a given address's counter). Neither ever holds more
    /// than its own `max`.
    #[test]
    fn addresses_sharing_a_counter_share_its_places() {
        let per_client = PerClient::new(2);
        let first: std::net::IpAddr = "10.0.0.1".parse().unwrap();
        let slot = per_client.slot(first) as *const _;
        let second = (1..=u32::MAX)
            .map(|i| std::net::IpAddr::from(std::net::Ipv4Addr::from(0x0b00_0000 + i)))
            .find(|a| std::ptr::eq(per_client.slot(*a), slot))
            .expect("some address shares the counter");
        assert!(per_client.take(first));
        assert!(per_client.take(second));
        assert!(!per_client.take(first), "the counter is full");
        assert!(!per_client.take(second));
        per_client.give_back(second);
        assert!(per_client.take(first));
        assert!(!per_client.take(first), "two of its own: its max");
        per_client.give_back(first);
        per_client.give_back(first);
        assert_eq!(per_client.held_in_all(), 0);
    }

    #[test]
    fn places_are_given_back_when_the_request_is_done_or_refused() {
        let places = Arc::new(Places::new(PerClient::new(1), 2));
        let slots: std::collections::HashSet<_> = ["10.0.0.1", "10.0.0.2", "10.0.0.3"]
            .map(|a| places.per_client.slot(a.parse().unwrap()) as *const _)
            .into();
        assert_eq!(slots.len(), 3, "each address has a counter of its own");
        let first = places.take(from("10.0.0.1")).ok().unwrap();
        // The client's one place is taken; the gateway has one left.
        assert!(matches!(
            places.take(from("10.0.0.1")),
            Err(NoPlace::Client)
        ));
        let second = places.take(from("10.0.0.2")).ok().unwrap();
        // The gateway's two places are taken: a third client is refused,
        // and the place its address had taken is given back.
        assert!(matches!(
            places.take(from("10.0.0.3")),
            Err(NoPlace::Gateway)
        ));
        assert_eq!(places.per_client.held_in_all(), 2);
        drop(first);
        assert_eq!(places.per_client.held("10.0.0.1"), 0);
        assert_eq!(places.per_client.held_in_all(), 1);
        // The first client's place and a gateway place are back.
        let again = places.take(from("10.0.0.1")).ok().unwrap();
        assert!(matches!(
            places.take(from("10.0.0.3")),
            Err(NoPlace::Gateway)
        ));
        drop((second, again));
        assert_eq!(places.per_client.held_in_all(), 0);
        assert_eq!(
            places.in_flight.load(std::sync::atomic::Ordering::Relaxed),
            0
        );
        // A request whose client is unknown takes a gateway place only.
        let unknown = places.take(None).ok().unwrap();
        assert_eq!(places.per_client.held_in_all(), 0);
        assert_eq!(
            places.in_flight.load(std::sync::atomic::Ordering::Relaxed),
            1
        );
        drop(unknown);
        assert_eq!(
            places.in_flight.load(std::sync::atomic::Ordering::Relaxed),
            0
        );
    }
}
