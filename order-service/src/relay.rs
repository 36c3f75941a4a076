//! The outbox relay: publishes rows written by the saga to Kafka.
//!
//! A batch is claimed with `FOR UPDATE SKIP LOCKED` inside a transaction, so
//! several relays share the table without publishing the same row in the
//! normal path. SKIP LOCKED alone would let a second relay publish an
//! aggregate's row n+1 while the first still holds row n; so of each
//! aggregate a batch publishes only the rows before the first unpublished
//! row it does not hold, and competing relays never reorder one aggregate's
//! events. Rows are sent in id order, keyed by `aggregate_id` (the order
//! id, so one order's events stay in one partition, in order), and marked
//! published only after every send is acknowledged by all in-sync replicas.
//! A relay that dies between publish and mark publishes the batch again after
//! restart: delivery is at-least-once and consumers deduplicate on the
//! CloudEvent id, which was made once when the row was written.
//!
//! One failing partition must not stall the rest: each acknowledged row is
//! marked on its own, and an aggregate whose send failed is left out of the
//! claims for a while ([`Blocked`]), so its rows do not fill every batch.
//! Within that aggregate nothing after the failed row is marked, so its
//! events are sent again in order when it is retried.
//!
//! An empty outbox is not polled: every statement inserting into it sends a
//! notification on the channel [`CHANNEL`] (a trigger, delivered at commit),
//! and an idle relay waits on it with `LISTEN`, so a confirmed order is
//! published at once. The relay still looks every [`RelayConfig::idle`]
//! (a notification lost with the listening connection), and when a blocked
//! aggregate's pause ends.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use boxoffice_contract::trace::TRACEPARENT;
use futures::future::join_all;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::FutureRecord;
use sqlx::postgres::PgListener;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use crate::kafka::Publisher;
use crate::ServeConfig;

#[derive(Debug, Clone)]
pub struct RelayConfig {
    pub topic: String,
    pub batch: i64,
    pub retention: Duration,
    /// The longest wait when the outbox is empty: a notification on
    /// [`CHANNEL`] ends it sooner (the fallback poll).
    pub idle: Duration,
    /// Abort the process after the first publish, before the mark (crash tests).
    pub crash_after_publish: bool,
}

impl From<&ServeConfig> for RelayConfig {
    fn from(config: &ServeConfig) -> Self {
        Self {
            topic: config.topic.clone(),
            batch: config.relay_batch,
            retention: Duration::from_secs(config.outbox_retention_s.max(0) as u64),
            idle: FALLBACK_POLL,
            crash_after_publish: config.crash_after_publish,
        }
    }
}

/// The notification channel the outbox's insert trigger signals (migration 0011).
pub const CHANNEL: &str = "outbox";

/// How often an idle relay looks at the outbox without being notified.
pub const FALLBACK_POLL: Duration = Duration::from_secs(5);

struct Row {
    id: i64,
    aggregate_id: String,
    event_type: String,
    payload: serde_json::Value,
    /// The purchase's W3C trace context, sent on as the `traceparent` header.
    traceparent: Option<String>,
}

/// Aggregates whose last send failed, each left out of the claims until
/// its time: the rest of the outbox keeps flowing past a failing partition.
#[derive(Debug, Default)]
pub struct Blocked {
    until: HashMap<String, tokio::time::Instant>,
}

impl Blocked {
    /// How long an aggregate waits after a failed send.
    const PAUSE: Duration = Duration::from_secs(2);

    fn block(&mut self, aggregate: &str) {
        self.until.insert(
            aggregate.to_owned(),
            tokio::time::Instant::now() + Self::PAUSE,
        );
    }

    /// The aggregates still blocked now (the others are forgotten).
    fn current(&mut self) -> Vec<String> {
        let now = tokio::time::Instant::now();
        self.until.retain(|_, until| *until > now);
        self.until.keys().cloned().collect()
    }

    /// When the first pause still running ends.
    fn next_end(&self) -> Option<tokio::time::Instant> {
        self.until.values().min().copied()
    }
}

/// What wakes an idle relay: notifications on [`CHANNEL`], when it could
/// listen. Without a listening connection the relay only polls, and tries to
/// listen again on its next wait.
struct Wakeup {
    pool: PgPool,
    listener: Option<PgListener>,
}

impl Wakeup {
    async fn new(pool: &PgPool) -> Self {
        let mut wakeup = Self {
            pool: pool.clone(),
            listener: None,
        };
        wakeup.listen().await;
        wakeup
    }

    async fn listen(&mut self) {
        if self.listener.is_some() {
            return;
        }
        let listener = async {
            let mut listener = PgListener::connect_with(&self.pool).await?;
            listener.listen(CHANNEL).await?;
            Ok::<_, sqlx::Error>(listener)
        };
        match listener.await {
            Ok(listener) => self.listener = Some(listener),
            Err(error) => {
                tracing::warn!(%error, "cannot listen for outbox notifications; polling the outbox")
            }
        }
    }

    /// Waits for a notification, at most `pause`. Returns early too when the
    /// listening connection was lost (notifications may have been missed).
    async fn wait(&mut self, pause: Duration) {
        self.listen().await;
        let Some(listener) = &mut self.listener else {
            tokio::time::sleep(pause).await;
            return;
        };
        match tokio::time::timeout(pause, listener.try_recv()).await {
            Err(_elapsed) => {}
            // Several commits may have notified meanwhile: one batch serves them all.
            Ok(Ok(Some(_))) => while listener.next_buffered().is_some() {},
            Ok(Ok(None)) => tracing::info!("outbox listening connection lost; reconnected"),
            Ok(Err(error)) => {
                tracing::warn!(%error, "outbox listening failed; polling the outbox");
                self.listener = None;
            }
        }
    }
}

/// Whether the relay's producer is usable, for readiness: after a fatal
/// librdkafka error (an idempotence sequence broken, a fenced producer)
/// every send fails until the producer is rebuilt.
#[derive(Debug, Clone, Default)]
pub struct RelayHealth(Arc<Mutex<Option<String>>>);

impl RelayHealth {
    /// Why the producer is unusable, while it is.
    pub fn fatal(&self) -> Option<String> {
        self.0.lock().expect("relay health lock").clone()
    }

    pub fn set_fatal(&self, reason: Option<String>) {
        *self.0.lock().expect("relay health lock") = reason;
    }
}

/// Relays until cancelled. Errors are logged and retried with a pause. A
/// producer that failed fatally is replaced by `rebuild`'s; while that
/// fails, `health` says so.
pub async fn run(
    pool: PgPool,
    mut producer: Publisher,
    config: RelayConfig,
    health: RelayHealth,
    rebuild: impl Fn() -> anyhow::Result<Publisher>,
    cancel: CancellationToken,
) {
    let mut last_cleanup = tokio::time::Instant::now();
    let mut blocked = Blocked::default();
    // Listening before the first look: no row committed after it goes unnoticed.
    let mut wakeup = Wakeup::new(&pool).await;
    while !cancel.is_cancelled() {
        if let Some((code, reason)) = producer.client().fatal_error() {
            let why = format!("{code:?}: {reason}");
            tracing::error!(error = %why, "the outbox producer failed fatally; rebuilding it");
            health.set_fatal(Some(why));
            match rebuild() {
                Ok(fresh) => {
                    producer = fresh;
                    health.set_fatal(None);
                    metrics::counter!("boxoffice_relay_producer_rebuilds_total").increment(1);
                }
                Err(error) => {
                    tracing::error!(%error, "could not rebuild the outbox producer");
                    tokio::select! {
                        () = cancel.cancelled() => break,
                        () = tokio::time::sleep(Duration::from_secs(1)) => continue,
                    }
                }
            }
        }
        let idle = match relay_batch(&pool, &producer, &config, &mut blocked).await {
            Ok(0) => true,
            Ok(_) => false,
            Err(error) => {
                tracing::warn!(%error, "outbox relay batch failed; will retry");
                tokio::select! {
                    () = cancel.cancelled() => break,
                    () = tokio::time::sleep(Duration::from_secs(1)) => {}
                }
                false
            }
        };
        if last_cleanup.elapsed() > Duration::from_secs(60) {
            last_cleanup = tokio::time::Instant::now();
            if let Err(error) = delete_published(&pool, config.retention).await {
                tracing::warn!(%error, "outbox cleanup failed");
            }
        }
        if !idle {
            continue;
        }
        // Nothing to send: wait for a commit's notification, the end of a
        // blocked aggregate's pause, or the fallback poll.
        let now = tokio::time::Instant::now();
        let pause = blocked.next_end().map_or(config.idle, |end| {
            config.idle.min(end.saturating_duration_since(now))
        });
        tokio::select! {
            () = cancel.cancelled() => break,
            () = wakeup.wait(pause) => {}
        }
    }
}

/// Publishes one batch; returns how many rows it published. Rows whose send
/// failed stay unpublished and their aggregates are blocked for a while.
pub async fn relay_batch(
    pool: &PgPool,
    producer: &Publisher,
    config: &RelayConfig,
    blocked: &mut Blocked,
) -> anyhow::Result<usize> {
    let started = std::time::Instant::now();
    let mut tx = pool.begin().await?;
    let rows: Vec<Row> = sqlx::query_as!(
        Row,
        "SELECT id, aggregate_id, event_type, payload, traceparent FROM outbox
         WHERE published_at IS NULL AND NOT (aggregate_id = ANY($2))
         ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED",
        config.batch,
        &blocked.current(),
    )
    .fetch_all(&mut *tx)
    .await?;
    let rows = in_order_per_aggregate(&mut tx, rows).await?;
    if rows.is_empty() {
        return Ok(0);
    }
    let bodies: Vec<Vec<u8>> = rows
        .iter()
        .map(|r| serde_json::to_vec(&r.payload))
        .collect::<Result<_, _>>()?;
    // Sends are queued in id order; the idempotent producer keeps that order per partition.
    let sends = rows.iter().zip(&bodies).map(|(row, body)| {
        let mut headers = OwnedHeaders::new()
            .insert(Header {
                key: "ce_type",
                value: Some(row.event_type.as_str()),
            })
            .insert(Header {
                key: "content-type",
                value: Some("application/cloudevents+json"),
            });
        if let Some(traceparent) = &row.traceparent {
            headers = headers.insert(Header {
                key: TRACEPARENT,
                value: Some(traceparent.as_str()),
            });
        }
        let record = FutureRecord::to(&config.topic)
            .key(row.aggregate_id.as_bytes())
            .payload(body.as_slice())
            .headers(headers);
        let send = producer.send(record, Duration::from_secs(30));
        async move { send.await.map_err(|(error, _)| error) }
    });
    let claimed = started.elapsed();
    let results = join_all(sends).await;
    let published = started.elapsed();
    if config.crash_after_publish {
        tracing::error!("crash_after_publish: aborting between publish and mark");
        std::process::abort();
    }
    // Mark every acknowledged row, except those after a failed row of the
    // same aggregate (they go again, in order, with it).
    let mut failed: HashSet<&str> = HashSet::new();
    let mut ids: Vec<i64> = Vec::with_capacity(rows.len());
    for (row, result) in rows.iter().zip(&results) {
        match result {
            Ok(_) if !failed.contains(row.aggregate_id.as_str()) => ids.push(row.id),
            Ok(_) => {}
            Err(error) => {
                if failed.insert(row.aggregate_id.as_str()) {
                    tracing::warn!(%error, aggregate_id = %row.aggregate_id, "outbox send failed; that aggregate waits, the rest goes on");
                    blocked.block(&row.aggregate_id);
                }
            }
        }
    }
    if ids.is_empty() {
        tx.rollback().await?;
        anyhow::bail!(
            "every send of the batch failed ({} aggregates)",
            failed.len()
        );
    }
    sqlx::query!(
        "UPDATE outbox SET published_at = now() WHERE id = ANY($1)",
        &ids
    )
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    tracing::debug!(
        count = ids.len(),
        first = ids[0],
        ?claimed,
        ?published,
        marked = ?started.elapsed(),
        "outbox batch published"
    );
    Ok(ids.len())
}

/// Drops the claimed rows that would overtake an earlier unpublished row of
/// their aggregate held by another relay: of each aggregate, only the rows
/// before the first one this batch does not hold are kept (they stay locked
/// until the batch ends, then the next claim takes them in order).
async fn in_order_per_aggregate(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    mut rows: Vec<Row>,
) -> sqlx::Result<Vec<Row>> {
    if rows.is_empty() {
        return Ok(rows);
    }
    let mut aggregates: Vec<&str> = rows.iter().map(|r| r.aggregate_id.as_str()).collect();
    aggregates.sort_unstable();
    aggregates.dedup();
    let unpublished: Vec<(String, i64)> = sqlx::query!(
        "SELECT aggregate_id, id FROM outbox
         WHERE published_at IS NULL AND aggregate_id = ANY($1) ORDER BY aggregate_id, id",
        &aggregates as &[&str],
    )
    .fetch_all(&mut **tx)
    .await?
    .into_iter()
    .map(|r| (r.aggregate_id, r.id))
    .collect();
    let claimed: HashSet<i64> = rows.iter().map(|r| r.id).collect();
    let mut keep = HashSet::new();
    let mut blocked = HashSet::new();
    for (aggregate, id) in &unpublished {
        if blocked.contains(aggregate) {
            continue;
        }
        if claimed.contains(id) {
            keep.insert(*id);
        } else {
            blocked.insert(aggregate.clone());
        }
    }
    rows.retain(|r| keep.contains(&r.id));
    Ok(rows)
}

async fn delete_published(pool: &PgPool, retention: Duration) -> sqlx::Result<u64> {
    let done = sqlx::query!(
        "DELETE FROM outbox WHERE published_at IS NOT NULL
         AND published_at < now() - make_interval(secs => $1)",
        retention.as_secs_f64(),
    )
    .execute(pool)
    .await?;
    Ok(done.rows_affected())
}
