//! The command line of the gateway; every flag has an env var.

use clap::Parser;

#[derive(Debug, Clone, Parser)]
#[command(
    name = "gateway",
    version,
    about = "BoxOffice edge: public API and fan page"
)]
pub struct Config {
    /// Write logs as JSON lines, with the fields of every enclosing span.
    #[arg(long, env = "BOXOFFICE_LOG_JSON")]
    pub log_json: bool,
    #[arg(long, env = "GATEWAY_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: String,
    /// Redis: one URL, or a Redis Cluster's node URLs comma-separated.
    #[arg(
        long,
        env = "REDIS_URL",
        hide_env_values = true,
        default_value = "redis://127.0.0.1:6379"
    )]
    pub redis_url: String,
    /// First part of every Redis key (`PREFIX:{EVENT}:…`).
    #[arg(long, env = "BOXOFFICE_REDIS_PREFIX", default_value = "bo")]
    pub redis_prefix: String,
    /// Base URL of the order service's internal API.
    #[arg(
        long,
        env = "ORDER_SERVICE_URL",
        default_value = "http://127.0.0.1:8082"
    )]
    pub order_service_url: String,
    /// Ed25519 private key (PKCS#8 PEM) that signs access and order tokens.
    #[arg(long, env = "BOXOFFICE_SIGNING_KEY")]
    pub signing_key: String,
    /// Further Ed25519 PEM files still accepted (the previous key during a rotation).
    #[arg(long, env = "BOXOFFICE_VERIFY_KEYS", value_delimiter = ',')]
    pub verify_keys: Vec<String>,
    /// Shared secret (≥ 32 bytes) of the gateway fleet that signs queue tickets.
    #[arg(long, env = "BOXOFFICE_QUEUE_SECRET", hide_env_values = true)]
    pub queue_secret: String,
    #[command(flatten)]
    pub service: boxoffice_contract::auth::ServiceTokenArgs,
    /// The ticketing site's JWKS (a file, or an `https://` URL) that
    /// verifies identity tokens of `account` events; read at start and again
    /// every `--identity-jwks-refresh-s`.
    #[arg(long, env = "BOXOFFICE_IDENTITY_JWKS")]
    pub identity_jwks: Option<String>,
    /// How often the identity JWKS is read again (the site's key rotation
    /// reaches the gateway within this).
    #[arg(long, env = "BOXOFFICE_IDENTITY_JWKS_REFRESH_S", default_value_t = 300,
          value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub identity_jwks_refresh_s: u64,
    /// The `iss` identity tokens must carry.
    #[arg(long, env = "BOXOFFICE_IDENTITY_ISSUER", default_value = "")]
    pub identity_issuer: String,
    /// The `aud` identity tokens must carry (the site's id for BoxOffice).
    #[arg(long, env = "BOXOFFICE_IDENTITY_AUDIENCE", default_value = "")]
    pub identity_audience: String,
    /// `iss` of every token.
    #[arg(long, env = "BOXOFFICE_ISSUER", default_value = "boxoffice")]
    pub issuer: String,
    /// Lifetime of a queue ticket.
    #[arg(long, env = "BOXOFFICE_QUEUE_TICKET_TTL_S", default_value_t = 86_400)]
    pub queue_ticket_ttl_s: u64,
    /// Lifetime of an order token.
    #[arg(long, env = "BOXOFFICE_ORDER_TOKEN_TTL_S", default_value_t = 7 * 86_400)]
    pub order_token_ttl_s: u64,
    /// How long an event's settings are kept in memory (0: read Redis every time).
    #[arg(long, env = "BOXOFFICE_EVENT_CACHE_MS", default_value_t = 100)]
    pub event_cache_ms: u64,
    /// Proxies in front of the gateway (CIDRs, comma-separated): only from
    /// them is `Forwarded`/`X-Forwarded-For` read to find the client's
    /// address, and only their `traceparent` continued. Empty: the peer is
    /// the client.
    #[arg(long, env = "BOXOFFICE_TRUSTED_PROXIES", value_delimiter = ',')]
    pub trusted_proxies: Vec<ipnet::IpNet>,
    /// The header the trusted proxies write the client's address into; the
    /// other one is never read.
    #[arg(
        long,
        env = "BOXOFFICE_FORWARDED_HEADER",
        value_enum,
        default_value = "x-forwarded-for"
    )]
    pub forwarded_header: crate::client_ip::ForwardedHeader,
    /// Requests per second one IP address (an IPv6 /64) may make (sustained).
    #[arg(long, env = "BOXOFFICE_PER_IP_RATE", default_value_t = 50)]
    pub per_ip_rate: u64,
    /// Requests one IP address may make in a burst.
    #[arg(long, env = "BOXOFFICE_PER_IP_BURST", default_value_t = 100)]
    pub per_ip_burst: u32,
    /// Join, status and purchase requests per second one fan may make (sustained).
    #[arg(long, env = "BOXOFFICE_PER_FAN_RATE", default_value_t = 2)]
    pub per_fan_rate: u32,
    /// Such requests one fan may make in a burst.
    #[arg(long, env = "BOXOFFICE_PER_FAN_BURST", default_value_t = 10)]
    pub per_fan_burst: u32,
    /// Requests handled at once; the next is shed with 503 at once.
    #[arg(long, env = "BOXOFFICE_MAX_IN_FLIGHT", default_value_t = 4096)]
    pub max_in_flight: usize,
    /// Deadline for a whole request.
    #[arg(long, env = "BOXOFFICE_REQUEST_TIMEOUT_MS", default_value_t = 10_000)]
    pub request_timeout_ms: u64,
    /// A client must send a request's headers within this time, or the
    /// connection is closed (a slow client holds no more than a socket).
    /// It also bounds how long an idle keep-alive connection waits for its
    /// next request, so it is longer than the longest status-poll interval
    /// (30 s): a fan's pooled connection is not closed under its next poll.
    #[arg(long, env = "BOXOFFICE_HEADER_TIMEOUT_MS", default_value_t = 65_000)]
    pub header_timeout_ms: u64,
    /// Each part of a request's body must arrive within this time of the
    /// last (else a 4xx), and the whole request within the request deadline
    /// (else 503), so a trickled body cannot hold a place for long.
    #[arg(long, env = "BOXOFFICE_BODY_TIMEOUT_MS", default_value_t = 5_000)]
    pub body_timeout_ms: u64,
    /// Requests one client address (an IPv6 /64) may have in flight at once;
    /// past it, 429 `rate-limited` at once.
    #[arg(long, env = "BOXOFFICE_PER_CLIENT_IN_FLIGHT", default_value_t = 32)]
    pub per_client_in_flight: usize,
    /// Connections one address (an IPv6 /64) may hold open at once; past
    /// it a new one is closed as it is accepted, so one host cannot take
    /// the gateway's sockets with connections that send nothing (each may
    /// wait `header_timeout_ms`). Trusted proxies carry many clients each
    /// and are not counted.
    #[arg(long, env = "BOXOFFICE_MAX_CONNECTIONS_PER_IP", default_value_t = 256)]
    pub max_connections_per_ip: usize,
    /// Largest request body accepted.
    #[arg(long, env = "BOXOFFICE_BODY_LIMIT_BYTES", default_value_t = 8 * 1024)]
    pub body_limit_bytes: usize,
    /// Calls to the order service in flight at once (bulkhead); more get 503 at once.
    #[arg(long, env = "BOXOFFICE_UPSTREAM_MAX_IN_FLIGHT", default_value_t = 256)]
    pub upstream_max_in_flight: usize,
    /// Circuit breaker: the window over which the success rate is judged.
    #[arg(long, env = "BOXOFFICE_BREAKER_WINDOW_S", default_value_t = 10)]
    pub breaker_window_s: u64,
    /// Circuit breaker: calls needed in the window before it may open.
    #[arg(long, env = "BOXOFFICE_BREAKER_MIN_REQUESTS", default_value_t = 10)]
    pub breaker_min_requests: u32,
    /// Circuit breaker: first open period, at least 1 s (doubles while the service keeps failing, up to 30×).
    #[arg(long, env = "BOXOFFICE_BREAKER_OPEN_MS", default_value_t = 2_000)]
    pub breaker_open_ms: u64,
    /// Time allowed for one call to the order service.
    #[arg(long, env = "BOXOFFICE_UPSTREAM_TIMEOUT_MS", default_value_t = 3_000)]
    pub upstream_timeout_ms: u64,
}

impl Config {
    /// Every flag at its default (environment variables still apply), for
    /// embedding the gateway as a library; keys are passed to `AppState` directly.
    pub fn defaults() -> Self {
        Self::parse_from([
            "gateway",
            "--signing-key=",
            "--queue-secret=",
            "--service-token=",
        ])
    }
}
