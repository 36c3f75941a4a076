//! What the BoxOffice services must agree on, and nothing else.
//!
//! Every binary (gateway, admission, order service, ticket worker, load
//! test) links this crate, so that a token, a problem document, a Redis key
//! or an event on Kafka means the same on both sides of a call. Nothing here
//! knows about one service's business.
//!
//! - [`auth`]: bearer tokens, the internal plane's service token, secrets checked at start.
//! - [`capacity`]: Little's law for sizing workers and partitions.
//! - [`token`]: the JWT claims every service reads (queue tickets, access
//!   tokens, order tokens), the key set that signs and verifies them, and JWKS.
//! - [`page`]: the security headers of HTML pages (CSP by hash, no framing).
//! - [`problem`]: RFC 9457 problem documents, the only error body any service returns.
//! - [`extract`]: JSON and path extractors that reject with problem documents.
//! - [`header_number`]: small numbers as header values, without an allocation.
//! - [`envelope`]: the CloudEvents 1.0 envelope of `order-events` and its payloads.
//! - [`event`]: an event's settings as stored in Redis, and its lifecycle state.
//! - [`otlp`]: span export over OTLP/HTTP when `OTEL_EXPORTER_OTLP_ENDPOINT` is set.
//! - [`openapi`]: security schemes and shared operations of the OpenAPI documents.
//! - [`keys`]: the Redis key layout, one hash tag per event.
//! - [`log_fields`]: the JSON logs' span fields, written in place (cheaper per request).
//! - [`request_log`]: the request being answered, in every line logged while it is
//!   (its `request` span, without a `tracing` span per request).
//! - [`redis_link`]: the one Redis connection each service uses, reconnecting
//!   within a second and timing commands out.
//! - [`schema`]: the rules an event schema change must keep (additive only), and
//!   whether an event matches its schema.
//! - [`shutdown`]: the SIGTERM/SIGINT future every binary hands to its server.
//! - [`telemetry`]: logs, the HTTP span and metrics, `/metrics`, the same in every binary.
//! - [`trace`]: W3C `traceparent`, so one purchase is one trace across services and Kafka.
#![forbid(unsafe_code)]

pub mod auth;
pub mod capacity;
pub mod envelope;
pub mod event;
pub mod extract;
pub mod header_number;
pub mod keys;
pub mod log_fields;
pub mod openapi;
pub mod otlp;
pub mod page;
pub mod problem;
pub mod redis_link;
pub mod request_log;
pub mod schema;
pub mod shutdown;
pub mod telemetry;
pub mod token;
pub mod trace;

pub use problem::Problem;
