//! The worker pool of one `ticket-issuer` process.
//!
//! One dispatcher fetches; handlers run as tasks, at most `workers` at once.
//! A message whose key is already being handled waits behind it, so one key's
//! events run one at a time and in offset order, while different keys use the
//! whole pool. Offsets are tracked per partition from receipt to effect; the
//! offset committed is the lowest one not yet done (everything below it is
//! durable), every `commit_interval`, on a rebalance before partitions are
//! revoked, and at shutdown.
//!
//! Failures: transient ones (the database, the ticket store) are retried
//! after 1 s, 4 s, 16 s … (`retry_backoff_ms` × 4ⁿ, at most
//! `retry_max_backoff_ms`) until the dependency returns: an outage pauses
//! the work and keeps the offset, it never dead-letters a good message. A
//! fatal one (undecodable, unknown type, schema violation, a panic) sends the
//! message to the dead-letter topic with its reason, then it counts as done:
//! poison never stalls its partition.
//!
//! Shutdown (cancel, i.e. SIGTERM/SIGINT): fetching stops, in-flight handlers
//! get `drain_timeout` to finish, done offsets are committed, and the
//! function returns. What did not finish is not committed and will be
//! redelivered (the effect is idempotent).

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::kafka::{EnvOptions, Publisher};
use anyhow::Context;
use boxoffice_contract::otlp;
use boxoffice_contract::trace::{TraceContext, TRACEPARENT};
use rdkafka::consumer::{
    BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance, StreamConsumer,
};
use rdkafka::message::{Message, OwnedMessage};
use rdkafka::{ClientConfig, ClientContext, Offset, TopicPartitionList};
use sqlx::PgPool;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::dlq::{self, ErrorClass};
use super::{handle, HandleError, Issuer, Outcome};
use crate::health::PartitionProgress;
use crate::tickets::{TicketSigner, TicketStore};
use crate::{WorkerConfig, Workers};

/// What a run did, for tests and the log line at exit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WorkerStats {
    /// Events that took effect here.
    pub issued: u64,
    /// Events found already processed (redeliveries, duplicates).
    pub duplicates: u64,
    pub dead_lettered: u64,
    /// Most handlers running at once.
    pub max_in_flight: usize,
    /// Pool size at the end (`--workers auto` changes it as S is measured).
    pub pool_size: usize,
    /// Handlers still running when the drain timeout ran out.
    pub abandoned: usize,
}

impl WorkerStats {
    /// Counts how a message ended (also as `boxoffice_worker_events_total{outcome}`).
    fn record(&mut self, ended: &Ended) {
        let outcome = match ended {
            Ended::Effect(Outcome::Issued) => {
                self.issued += 1;
                "issued"
            }
            Ended::Effect(Outcome::Duplicate) => {
                self.duplicates += 1;
                "duplicate"
            }
            Ended::DeadLettered => {
                self.dead_lettered += 1;
                "dead_lettered"
            }
            Ended::Abandoned => return,
        };
        metrics::counter!("boxoffice_worker_events_total", "outcome" => outcome).increment(1);
    }
}

/// ceil(λ × S / utilization), at least 1 and at most `max`.
pub fn auto_size(arrival_rate: f64, service_time_s: f64, utilization: f64, max: usize) -> usize {
    let size = boxoffice_contract::capacity::workers_for(arrival_rate, service_time_s, utilization);
    (size as usize).clamp(1, max.max(1))
}

type TopicPartition = (String, i32);

/// Receipt-to-effect bookkeeping of every partition this process holds.
#[derive(Default)]
struct Offsets {
    partitions: HashMap<TopicPartition, Partition>,
}

#[derive(Default)]
struct Partition {
    /// Received and not yet done, with when they were received.
    pending: BTreeMap<i64, Instant>,
    /// Handlers running now.
    in_flight: usize,
    /// One past the highest offset received.
    next: i64,
    /// The last offset committed.
    committed: i64,
}

impl Partition {
    /// Everything below this offset is done.
    fn watermark(&self) -> i64 {
        self.pending.keys().next().copied().unwrap_or(self.next)
    }
}

impl Offsets {
    fn received(&mut self, tp: TopicPartition, offset: i64) {
        let partition = self.partitions.entry(tp).or_default();
        if partition.pending.is_empty() && partition.next == 0 {
            partition.committed = offset;
        }
        partition.pending.insert(offset, Instant::now());
        partition.next = partition.next.max(offset + 1);
    }

    fn done(&mut self, tp: &TopicPartition, offset: i64) {
        if let Some(partition) = self.partitions.get_mut(tp) {
            partition.pending.remove(&offset);
        }
    }

    /// Offsets to commit (of `only`, or of all partitions), marked as committed.
    fn take_committable(&mut self, only: Option<&[TopicPartition]>) -> TopicPartitionList {
        let mut list = TopicPartitionList::new();
        for (tp, partition) in &mut self.partitions {
            if only.is_some_and(|only| !only.contains(tp)) {
                continue;
            }
            let watermark = partition.watermark();
            if watermark > partition.committed
                && list
                    .add_partition_offset(&tp.0, tp.1, Offset::Offset(watermark))
                    .is_ok()
            {
                partition.committed = watermark;
            }
        }
        list
    }

    /// A commit of `list` failed: its partitions are committable again from
    /// the offsets they had, so the next commit retries them.
    fn commit_failed(&mut self, list: &TopicPartitionList) {
        for element in list.elements() {
            if let Some(p) = self
                .partitions
                .get_mut(&(element.topic().to_owned(), element.partition()))
            {
                p.committed = p.committed.min(element.offset().to_raw().unwrap_or(0) - 1);
            }
        }
    }

    fn is_pending(&self, tp: &TopicPartition, offset: i64) -> bool {
        self.partitions
            .get(tp)
            .is_some_and(|p| p.pending.contains_key(&offset))
    }

    fn oldest_pending(&self) -> Option<Instant> {
        self.partitions
            .values()
            .filter_map(|p| p.pending.values().min().copied())
            .min()
    }
}

/// The longest drain of a revocation this member started itself: no
/// heartbeat goes out meanwhile, so well under the 10 s session timeout.
const REJOIN_DRAIN: Duration = Duration::from_secs(3);

/// Whether this thread may block (`block_in_place` needs a multi-thread runtime).
fn may_block() -> bool {
    tokio::runtime::Handle::try_current()
        .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread)
}

/// Runs a call that blocks on librdkafka off the async worker's back (where
/// the runtime allows it).
fn blocking<T>(call: impl FnOnce() -> T) -> T {
    if may_block() {
        tokio::task::block_in_place(call)
    } else {
        call()
    }
}

/// What the dispatcher and the rebalance callback share.
struct Shared {
    offsets: Mutex<Offsets>,
    /// Signalled whenever a handler finishes.
    finished: Condvar,
    drain_timeout: Duration,
    /// This member is leaving and rejoining on its own (the orphan watch):
    /// the revocation drains for at most [`REJOIN_DRAIN`].
    rejoining: std::sync::atomic::AtomicBool,
    /// Partitions revoked since the dispatcher last looked.
    revoked: Mutex<HashSet<TopicPartition>>,
}

struct PoolContext {
    shared: Arc<Shared>,
}

impl ClientContext for PoolContext {}

impl ConsumerContext for PoolContext {
    /// Before partitions go to another member: let their in-flight handlers
    /// finish (within the drain timeout), then commit what is done.
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let Rebalance::Revoke(list) = rebalance else {
            return;
        };
        let revoked: Vec<TopicPartition> = list
            .elements()
            .iter()
            .map(|e| (e.topic().to_owned(), e.partition()))
            .collect();
        metrics::counter!("boxoffice_worker_partitions_revoked_total")
            .increment(revoked.len() as u64);
        let shared = &self.shared;
        let drain = if shared
            .rejoining
            .swap(false, std::sync::atomic::Ordering::SeqCst)
        {
            shared.drain_timeout.min(REJOIN_DRAIN)
        } else {
            shared.drain_timeout
        };
        let wait = || {
            let offsets = shared.offsets.lock().expect("offsets lock");
            let (offsets, timeout) = shared
                .finished
                .wait_timeout_while(offsets, drain, |o| {
                    revoked
                        .iter()
                        .any(|tp| o.partitions.get(tp).is_some_and(|p| p.in_flight > 0))
                })
                .expect("offsets lock");
            if timeout.timed_out() {
                tracing::error!(
                    ?revoked,
                    "rebalance drain timed out; unfinished messages will be redelivered"
                );
            }
            drop(offsets);
        };
        // Waiting blocks this thread; handlers must be able to run meanwhile.
        if may_block() {
            tokio::task::block_in_place(wait);
        } else {
            tracing::warn!("single-threaded runtime: committing at rebalance without draining");
        }
        let mut offsets = shared.offsets.lock().expect("offsets lock");
        let commit = offsets.take_committable(Some(&revoked));
        for tp in &revoked {
            offsets.partitions.remove(tp);
        }
        drop(offsets);
        if commit.count() > 0 {
            if let Err(error) = consumer.commit(&commit, CommitMode::Sync) {
                tracing::warn!(%error, "commit before revocation failed");
            }
        }
        shared
            .revoked
            .lock()
            .expect("revoked lock")
            .extend(revoked.iter().cloned());
        tracing::info!(?revoked, "partitions revoked after draining");
    }

    /// What the group left this member: every worker at none while the
    /// topic has lag is a group that has stopped (docs/operations.md).
    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, _rebalance: &Rebalance<'_>) {
        if let Ok(list) = consumer.assignment() {
            metrics::gauge!("boxoffice_worker_assigned_partitions").set(list.count() as f64);
        }
    }
}

/// What a handler needs, cheap to clone into each task.
#[derive(Clone)]
struct Handler {
    pool: PgPool,
    issuer: Issuer,
    producer: Publisher,
    group: String,
    dlq_topic: String,
    extra_service: Duration,
    retry_backoff: Duration,
    retry_max_backoff: Duration,
    cancel: CancellationToken,
}

/// How one message ended.
enum Ended {
    Effect(Outcome),
    DeadLettered,
    /// Cancelled mid-retry: not done, not to be committed.
    Abandoned,
}

impl Handler {
    async fn run(&self, message: &OwnedMessage) -> Ended {
        use tracing::Instrument;
        // The purchase's trace continues here (a new one if the relay sent none).
        let (trace, parent) = TraceContext::span_under(dlq::header(message, TRACEPARENT));
        let span = tracing::info_span!(
            "message",
            topic = message.topic(),
            partition = message.partition(),
            offset = message.offset(),
            key = message
                .key()
                .and_then(|k| std::str::from_utf8(k).ok())
                .unwrap_or(""),
            trace_id = %trace.trace_id_hex(),
            span_id = %trace.span_id_hex(),
            parent_span_id = %parent
        );
        let mut exported = if otlp::enabled() {
            otlp::Span::start(
                crate::WORKER_SERVICE,
                format!("{} process", message.topic()),
                otlp::Kind::Consumer,
                &trace,
                parent,
            )
        } else {
            otlp::Span::none()
        };
        if exported.is_recording() {
            exported.set_attribute(otlp::Attribute::new("messaging.system", "kafka"));
            exported.set_attribute(otlp::Attribute::new(
                "messaging.destination.name",
                message.topic().to_owned(),
            ));
            exported.set_attribute(otlp::Attribute::new(
                "messaging.destination.partition.id",
                message.partition().to_string(),
            ));
            exported.set_attribute(otlp::Attribute::new(
                "messaging.kafka.offset",
                message.offset(),
            ));
        }
        let ended = self.handle_with_retries(message).instrument(span).await;
        if matches!(ended, Ended::DeadLettered) {
            exported.set_status(otlp::Status::error("dead-lettered"));
        }
        ended
    }

    async fn handle_with_retries(&self, message: &OwnedMessage) -> Ended {
        let payload = message.payload().unwrap_or_default();
        let mut retry = 0;
        loop {
            if !self.extra_service.is_zero() {
                tokio::time::sleep(self.extra_service).await;
            }
            let attempt = guarded(handle(&self.pool, &self.issuer, &self.group, payload)).await;
            let (reason, class) = match attempt {
                Ok(outcome) => return Ended::Effect(outcome),
                Err(HandleError::Fatal(reason)) => (reason, ErrorClass::Fatal),
                Err(error @ (HandleError::Transient(_) | HandleError::Store(_))) => {
                    let wait = (self.retry_backoff * 4u32.saturating_pow(retry.min(10)))
                        .min(self.retry_max_backoff);
                    retry += 1;
                    metrics::counter!("boxoffice_worker_transient_retries_total").increment(1);
                    tracing::warn!(%error, retry, ?wait, "transient failure; retrying until it passes");
                    tokio::select! {
                        () = self.cancel.cancelled() => return Ended::Abandoned,
                        () = tokio::time::sleep(wait) => continue,
                    }
                }
            };
            tracing::error!(%reason, class = class.as_str(), "dead-lettering the message");
            // The partition must not stall, but the letter must not be lost:
            // keep trying the DLQ until it has it (or we are told to stop).
            loop {
                match dlq::publish(&self.producer, &self.dlq_topic, message, &reason, class).await {
                    Ok(()) => return Ended::DeadLettered,
                    Err(error) => tracing::error!(%error, "cannot reach the DLQ; retrying"),
                }
                tokio::select! {
                    () = self.cancel.cancelled() => return Ended::Abandoned,
                    () = tokio::time::sleep(Duration::from_secs(1)) => {}
                }
            }
        }
    }
}

/// Runs a handler, turning a panic into a fatal error: a panicking handler
/// must dead-letter its message like any poison, not leave its key busy and
/// its partition's commit frozen.
async fn guarded<T>(
    attempt: impl std::future::Future<Output = Result<T, HandleError>>,
) -> Result<T, HandleError> {
    use futures::FutureExt;
    match std::panic::AssertUnwindSafe(attempt).catch_unwind().await {
        Ok(result) => result,
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic".into());
            Err(HandleError::Fatal(format!("the handler panicked: {what}")))
        }
    }
}

fn key_of(message: &OwnedMessage) -> Vec<u8> {
    match message.key() {
        Some(key) => key.to_vec(),
        // Unkeyed messages have no order to keep: each is its own key.
        None => format!("\0{}/{}", message.partition(), message.offset()).into_bytes(),
    }
}

/// Consumes until `cancel`, then drains and commits. Returns what it did.
pub async fn run(
    config: WorkerConfig,
    pool: PgPool,
    cancel: CancellationToken,
) -> anyhow::Result<WorkerStats> {
    boxoffice_contract::telemetry::prometheus();
    let dlq_topic = config.dlq_topic();
    crate::kafka::ensure_topics_replicated(
        &config.kafka_brokers,
        &[&dlq_topic],
        1,
        config.replication,
    )
    .await?;
    let shared = Arc::new(Shared {
        offsets: Mutex::default(),
        finished: Condvar::new(),
        drain_timeout: Duration::from_millis(config.drain_timeout_ms),
        rejoining: Default::default(),
        revoked: Mutex::default(),
    });
    let mut client = ClientConfig::new();
    if let Some(instance) = &config.instance_id {
        client.set("group.instance.id", instance);
    }
    let static_member = config.instance_id.is_some();
    let session_timeout_ms = session_timeout_ms(static_member, config.max_poll_interval_ms);
    let consumer: StreamConsumer<PoolContext> = client
        .set("bootstrap.servers", &config.kafka_brokers)
        .set("group.id", &config.group)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .set("session.timeout.ms", session_timeout_ms.to_string())
        .set(
            "max.poll.interval.ms",
            config.max_poll_interval_ms.to_string(),
        )
        .with_env_options()
        .create_with_context(PoolContext {
            shared: shared.clone(),
        })
        .context("creating the Kafka consumer")?;
    consumer
        .subscribe(&[&config.topic])
        .context("subscribing to the order topic")?;
    let handler = Handler {
        pool,
        issuer: Issuer {
            store: TicketStore::from_url(&config.ticket_store)?,
            signer: TicketSigner::new(config.ticket_secret.as_bytes()),
        },
        producer: crate::kafka::producer(&config.kafka_brokers)?,
        group: config.group.clone(),
        dlq_topic,
        extra_service: Duration::from_millis(config.extra_service_ms),
        retry_backoff: Duration::from_millis(config.retry_backoff_ms),
        retry_max_backoff: Duration::from_millis(config.retry_max_backoff_ms.max(1)),
        cancel: cancel.clone(),
    };
    let probe =
        crate::health::BrokerProbe::new(&config.kafka_brokers, &config.group, &config.topic)?;
    let (progress_tx, mut progress_rx) = tokio::sync::mpsc::channel(1);
    let lag = tokio::spawn(report_lag(probe, progress_tx, cancel.clone()));
    let mut orphans = OrphanWatch::new(orphan_timeout(
        config.orphan_timeout_ms,
        static_member,
        session_timeout_ms,
    ));
    metrics::counter!("boxoffice_worker_resubscribes_total").increment(0);
    metrics::counter!("boxoffice_worker_partitions_revoked_total").increment(0);
    metrics::gauge!("boxoffice_worker_assigned_partitions").set(0.0);

    let mut size = match config.workers {
        Workers::Fixed(n) => n,
        Workers::Auto => auto_size(
            config.arrival_rate,
            config.service_time_ms / 1000.0,
            config.utilization,
            config.max_workers,
        ),
    };
    metrics::gauge!("boxoffice_worker_pool_size").set(size as f64);
    // Shown at 0 from the start, so "DLQ > 0" alerts have a series to watch.
    // (`exhausted` is no longer produced; older letters may carry it.)
    for class in [ErrorClass::Fatal, ErrorClass::Exhausted] {
        metrics::counter!("boxoffice_dlq_messages_total", "class" => class.as_str()).increment(0);
    }
    metrics::counter!("boxoffice_worker_transient_retries_total").increment(0);
    tracing::info!(size, workers = ?config.workers, "worker pool starting");
    let mut service_time_s = config.service_time_ms / 1000.0;
    let mut stats = WorkerStats::default();
    let mut running: JoinSet<(Vec<u8>, Ended, Duration)> = JoinSet::new();
    let mut busy: HashMap<Vec<u8>, VecDeque<OwnedMessage>> = HashMap::new();
    let mut buffered = 0usize;
    let mut commit_tick =
        tokio::time::interval(Duration::from_millis(config.commit_interval_ms.max(10)));

    // Each handler books its own end (in-flight count, done offset) as it
    // finishes, so a rebalance drain blocked in the consumer's callback sees
    // progress without the dispatcher.
    let spawn = |running: &mut JoinSet<_>, message: OwnedMessage, shared: &Arc<Shared>| {
        let tp = (message.topic().to_owned(), message.partition());
        if let Some(p) = shared
            .offsets
            .lock()
            .expect("offsets lock")
            .partitions
            .get_mut(&tp)
        {
            p.in_flight += 1;
        }
        let handler = handler.clone();
        let shared = shared.clone();
        running.spawn(async move {
            let started = Instant::now();
            let ended = handler.run(&message).await;
            let took = started.elapsed();
            {
                let mut offsets = shared.offsets.lock().expect("offsets lock");
                if let Some(p) = offsets.partitions.get_mut(&tp) {
                    p.in_flight = p.in_flight.saturating_sub(1);
                }
                if !matches!(ended, Ended::Abandoned) {
                    offsets.done(&tp, message.offset());
                }
            }
            shared.finished.notify_all();
            (key_of(&message), ended, took)
        });
    };

    let mut rejoin: Option<Vec<i32>> = None;
    loop {
        let can_fetch = running.len() < size && buffered < config.max_buffered;
        // The revocation that leaving starts is served by `recv` below, so
        // leave only when it will be polled; meanwhile librdkafka sends no
        // heartbeat, so the drain it waits for is kept short.
        if can_fetch {
            if let Some(orphaned) = rejoin.take() {
                // The group gave these partitions to a member that is gone
                // (tansu 0.6.0 keeps a dead member's assignment): leave and
                // join again, which forces a new assignment.
                tracing::warn!(?orphaned, timeout = ?orphans.timeout, "partitions behind and unmoved, not ours: rejoining the group");
                metrics::counter!("boxoffice_worker_resubscribes_total").increment(1);
                shared
                    .rejoining
                    .store(true, std::sync::atomic::Ordering::SeqCst);
                blocking(|| consumer.unsubscribe());
                if let Err(error) = blocking(|| consumer.subscribe(&[&config.topic])) {
                    tracing::error!(%error, "subscribing again failed");
                }
            }
        }
        tokio::select! {
            // Cancellation first: no new handler starts once shutdown began.
            biased;
            () = cancel.cancelled() => break,
            _ = commit_tick.tick() => {
                commit(&consumer, &shared, CommitMode::Async);
                if let Some(oldest) = shared.offsets.lock().expect("offsets lock").oldest_pending() {
                    metrics::gauge!("boxoffice_consumer_oldest_unprocessed_age_seconds").set(oldest.elapsed().as_secs_f64());
                } else {
                    metrics::gauge!("boxoffice_consumer_oldest_unprocessed_age_seconds").set(0.0);
                }
                if config.workers == Workers::Auto {
                    let next = auto_size(config.arrival_rate, service_time_s, config.utilization, config.max_workers);
                    if next != size {
                        tracing::info!(from = size, to = next, service_time_s, "resizing the pool");
                        size = next;
                        metrics::gauge!("boxoffice_worker_pool_size").set(size as f64);
                    }
                }
            }
            Some(progress) = progress_rx.recv() => {
                let ours: HashSet<i32> = blocking(|| consumer.assignment())
                    .map(|list| list.elements().iter().filter(|e| e.topic() == config.topic).map(|e| e.partition()).collect())
                    .unwrap_or_default();
                let orphaned = orphans.observe(Instant::now(), &progress, &ours);
                if !orphaned.is_empty() {
                    // Only a member that can do the work takes it over.
                    let alive = tokio::time::timeout(Duration::from_secs(2), sqlx::query_scalar!("SELECT 1 AS ping").fetch_one(&handler.pool)).await;
                    if matches!(alive, Ok(Ok(_))) {
                        rejoin = Some(orphaned);
                    } else {
                        tracing::warn!(?orphaned, "partitions look orphaned, but the database does not answer: staying put");
                    }
                }
            }
            Some(joined) = running.join_next() => {
                let Ok((key, ended, took)) = joined else { continue };
                // A moving average of S (service time), for sizing and for ops.
                service_time_s = 0.9 * service_time_s + 0.1 * took.as_secs_f64();
                metrics::gauge!("boxoffice_worker_service_time_seconds").set(service_time_s);
                stats.record(&ended);
                // The next message of the same key, unless its partition was revoked.
                let revoked = std::mem::take(&mut *shared.revoked.lock().expect("revoked lock"));
                let mut next = None;
                if let Some(queue) = busy.get_mut(&key) {
                    while let Some(message) = queue.pop_front() {
                        buffered -= 1;
                        let offsets = shared.offsets.lock().expect("offsets lock");
                        if !stale(&message, &revoked, &offsets) {
                            next = Some(message);
                            break;
                        }
                    }
                }
                match next {
                    Some(message) => spawn(&mut running, message, &shared),
                    None => { busy.remove(&key); }
                }
                if !revoked.is_empty() {
                    let offsets = shared.offsets.lock().expect("offsets lock");
                    buffered -= purge_revoked(&mut busy, &revoked, &offsets);
                }
            }
            received = consumer.recv(), if can_fetch => match received {
                Ok(message) => {
                    let message = message.detach();
                    let tp = (message.topic().to_owned(), message.partition());
                    shared.offsets.lock().expect("offsets lock").received(tp, message.offset());
                    let key = key_of(&message);
                    match busy.get_mut(&key) {
                        Some(queue) => {
                            queue.push_back(message);
                            buffered += 1;
                        }
                        None => {
                            busy.insert(key, VecDeque::new());
                            spawn(&mut running, message, &shared);
                        }
                    }
                    stats.max_in_flight = stats.max_in_flight.max(running.len());
                    metrics::gauge!("boxoffice_worker_in_flight").set(running.len() as f64);
                }
                Err(error) => {
                    tracing::warn!(%error, "consumer error");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            },
        }
        metrics::gauge!("boxoffice_worker_in_flight").set(running.len() as f64);
    }

    // Drain: no more fetching; in-flight handlers get the drain timeout.
    let in_flight = running.len();
    tracing::info!(in_flight, buffered, "draining");
    let deadline = tokio::time::Instant::now() + shared.drain_timeout;
    while !running.is_empty() {
        match tokio::time::timeout_at(deadline, running.join_next()).await {
            Ok(Some(Ok((_, ended, _)))) => {
                stats.record(&ended);
            }
            Ok(Some(Err(_))) => {}
            Ok(None) => break,
            Err(_) => {
                stats.abandoned = running.len();
                tracing::error!(
                    abandoned = stats.abandoned,
                    drain_timeout = ?shared.drain_timeout,
                    "DRAIN TIMEOUT: in-flight messages abandoned uncommitted; they will be redelivered"
                );
                running.abort_all();
                break;
            }
        }
    }
    commit(&consumer, &shared, CommitMode::Sync);
    lag.abort();
    stats.pool_size = size;
    tracing::info!(?stats, "ticket worker stopped");
    Ok(stats)
}

/// How long the group waits for a silent member. A dynamic member's session
/// is short, so a dead one is found quickly. A static member keeps its place
/// for its whole session, so it gets Kafka's default, long enough for a
/// restart: tansu 0.6.0 holds a rejoining static member's JoinGroup and
/// SyncGroup 3 s each and does not count them as contact, so a 10 s session
/// lapsed when a killed worker asked to join more than 4 s after its last
/// heartbeat, and a static member whose session lapsed there can wedge its
/// group (docs/reliability.md). librdkafka wants it no longer than the poll
/// interval.
fn session_timeout_ms(static_member: bool, max_poll_interval_ms: u64) -> u64 {
    let wanted = if static_member { 45_000 } else { 10_000 };
    wanted.min(max_poll_interval_ms)
}

/// How long another member's partitions may sit behind and unmoved before
/// this worker rejoins to take them. Static members wait out a whole session
/// and 15 s more: until then the broker keeps a restarting member's place on
/// purpose, and rejoining around it would force the very rebalance static
/// membership saves. 0 keeps the watch off.
fn orphan_timeout(configured_ms: u64, static_member: bool, session_timeout_ms: u64) -> Duration {
    let floor = if static_member && configured_ms > 0 {
        session_timeout_ms + 15_000
    } else {
        0
    };
    Duration::from_millis(configured_ms.max(floor))
}

fn commit(consumer: &StreamConsumer<PoolContext>, shared: &Shared, mode: CommitMode) {
    let list = shared
        .offsets
        .lock()
        .expect("offsets lock")
        .take_committable(None);
    if list.count() == 0 {
        return;
    }
    // rust-rdkafka 0.39 never reports the outcome of a manual asynchronous
    // commit (`commit_callback` is not called for it: rust-rdkafka issue
    // 856), so a failed one would never be retried. Where the runtime allows
    // blocking, commit synchronously and book a failure for the next tick.
    let result = if may_block() {
        tokio::task::block_in_place(|| consumer.commit(&list, CommitMode::Sync))
    } else {
        consumer.commit(&list, mode)
    };
    if let Err(error) = result {
        tracing::warn!(%error, "offset commit failed; will retry");
        shared
            .offsets
            .lock()
            .expect("offsets lock")
            .commit_failed(&list);
    }
}

/// Whether `message` was fetched before its partition was revoked: another
/// member owns it now (or this one again, fetching it anew). A message
/// fetched after the partition came back is pending in `offsets` and is not
/// stale, or its offset would hold the partition's commits back for good.
fn stale(message: &OwnedMessage, revoked: &HashSet<TopicPartition>, offsets: &Offsets) -> bool {
    let tp = (message.topic().to_owned(), message.partition());
    revoked.contains(&tp) && !offsets.is_pending(&tp, message.offset())
}

/// Drops the queued messages of revoked partitions that are [`stale`];
/// returns how many.
fn purge_revoked(
    busy: &mut HashMap<Vec<u8>, VecDeque<OwnedMessage>>,
    revoked: &HashSet<TopicPartition>,
    offsets: &Offsets,
) -> usize {
    let mut purged = 0;
    for queue in busy.values_mut() {
        let before = queue.len();
        queue.retain(|m| !stale(m, revoked, offsets));
        purged += before - queue.len();
    }
    purged
}

/// Finds partitions nobody works on: behind, their committed offset
/// unmoved for `timeout`, and not this member's, while this member has
/// partitions and none of them is behind and unmoved (if its own are stuck
/// too, a dependency is down, not a member, and a new assignment would not
/// help). A rejoin waits `timeout` after the last one, twice as long each
/// time the group still has orphans (up to 8×), back to `timeout` once it
/// has none.
struct OrphanWatch {
    /// Zero: never.
    timeout: Duration,
    /// Per partition behind: its committed offset, and since when it is unmoved.
    stuck: HashMap<i32, (i64, Instant)>,
    last_rejoin: Option<Instant>,
    /// How long after `last_rejoin` the next may come.
    rest: Duration,
}

impl OrphanWatch {
    fn new(timeout: Duration) -> Self {
        Self {
            timeout,
            stuck: HashMap::new(),
            last_rejoin: None,
            rest: timeout,
        }
    }

    /// Books a snapshot; returns the orphaned partitions when it is time to rejoin.
    fn observe(
        &mut self,
        now: Instant,
        progress: &[PartitionProgress],
        ours: &HashSet<i32>,
    ) -> Vec<i32> {
        if self.timeout.is_zero() {
            return Vec::new();
        }
        for p in progress {
            if p.lag == 0 {
                self.stuck.remove(&p.partition);
                continue;
            }
            match self.stuck.get(&p.partition) {
                Some((done, _)) if *done == p.done => {}
                _ => {
                    self.stuck.insert(p.partition, (p.done, now));
                }
            }
        }
        if self.stuck.keys().all(|p| ours.contains(p)) {
            self.rest = self.timeout;
        }
        // No partitions (more members than partitions, or mid-rebalance):
        // nothing shows this member is healthy.
        if ours.is_empty() {
            return Vec::new();
        }
        let own_stuck = self
            .stuck
            .iter()
            .any(|(p, (_, since))| ours.contains(p) && *since < now);
        if own_stuck {
            return Vec::new();
        }
        let mut orphaned: Vec<i32> = self
            .stuck
            .iter()
            .filter(|(p, (_, since))| {
                !ours.contains(p) && now.duration_since(*since) >= self.timeout
            })
            .map(|(partition, _)| *partition)
            .collect();
        let rested = self
            .last_rejoin
            .is_none_or(|at| now.duration_since(at) >= self.rest);
        if orphaned.is_empty() || !rested {
            return Vec::new();
        }
        orphaned.sort_unstable();
        // If the group still has orphans after this one, wait longer.
        self.rest = (self.rest * 2).min(self.timeout * 8);
        self.last_rejoin = Some(now);
        // Watch afresh under the new assignment.
        self.stuck.clear();
        orphaned
    }
}

/// Exports `boxoffice_consumer_lag{topic,partition}` (high watermark −
/// committed) every 5 s, and hands each snapshot to the orphan watch.
async fn report_lag(
    probe: crate::health::BrokerProbe,
    progress: tokio::sync::mpsc::Sender<Vec<PartitionProgress>>,
    cancel: CancellationToken,
) {
    while !cancel.is_cancelled() {
        if let Ok(partitions) = probe.progress().await {
            for p in &partitions {
                metrics::gauge!("boxoffice_consumer_lag", "topic" => probe.topic().to_owned(), "partition" => p.partition.to_string())
                    .set(p.lag as f64);
            }
            // For the orphan watch; a snapshot it has not read yet is simply replaced next time.
            let _ = progress.try_send(partitions);
        }
        tokio::select! {
            () = cancel.cancelled() => break,
            () = tokio::time::sleep(Duration::from_secs(5)) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_panicking_handler_is_a_fatal_error_not_a_stuck_key() {
        let ok: Result<u8, HandleError> = guarded(async { Ok(7) }).await;
        assert!(matches!(ok, Ok(7)));
        let panicked: Result<u8, HandleError> = guarded(async {
            let seats: Vec<i32> = vec![];
            Ok(u8::try_from(seats[3]).unwrap_or_default())
        })
        .await;
        match panicked {
            Err(HandleError::Fatal(reason)) => {
                assert!(
                    reason.starts_with("the handler panicked: index out of bounds"),
                    "{reason}"
                )
            }
            other => panic!("expected a fatal error, got {other:?}"),
        }
    }

    fn snapshot(parts: &[(i32, i64, i64)]) -> Vec<PartitionProgress> {
        parts
            .iter()
            .map(|&(partition, done, lag)| PartitionProgress {
                partition,
                done,
                lag,
            })
            .collect()
    }

    #[test]
    fn a_partition_behind_unmoved_and_not_ours_is_orphaned_after_the_timeout() {
        let mut watch = OrphanWatch::new(Duration::from_secs(30));
        let t0 = Instant::now();
        let ours = HashSet::from([0, 1]);
        let at = |s: u64| t0 + Duration::from_secs(s);
        // Ours move; 2 is behind and does not; 3 is caught up.
        let snapshots = [
            (0, [(0, 5, 3), (1, 5, 3), (2, 7, 4), (3, 0, 0)]),
            (20, [(0, 8, 1), (1, 8, 1), (2, 7, 4), (3, 0, 0)]),
        ];
        for (s, parts) in snapshots {
            assert!(watch.observe(at(s), &snapshot(&parts), &ours).is_empty());
        }
        let caught_up = snapshot(&[(0, 9, 0), (1, 9, 0), (2, 7, 4), (3, 0, 0)]);
        assert_eq!(watch.observe(at(30), &caught_up, &ours), [2]);
        // Still orphaned after the rejoin: the next one waits twice as long.
        let orphan = snapshot(&[(2, 7, 4)]);
        assert!(watch.observe(at(35), &orphan, &ours).is_empty());
        assert!(
            watch.observe(at(66), &orphan, &ours).is_empty(),
            "only 36 s since the rejoin"
        );
        assert_eq!(watch.observe(at(91), &orphan, &ours), [2]);
        // Once nothing is orphaned, the wait is back to the timeout.
        assert!(watch
            .observe(at(95), &snapshot(&[(2, 9, 0)]), &ours)
            .is_empty());
        assert!(watch.observe(at(100), &orphan, &ours).is_empty());
        assert_eq!(watch.observe(at(130), &orphan, &ours), [2]);
    }

    #[test]
    fn moving_caught_up_stuck_own_or_no_own_partitions_mean_no_rejoin() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let ours = HashSet::from([0]);
        // Another member's partition that moves, and one caught up.
        let mut watch = OrphanWatch::new(Duration::from_secs(30));
        for (i, s) in [0, 20, 40, 60].into_iter().enumerate() {
            let progress = snapshot(&[(0, 1, 0), (1, 10 + i as i64, 5), (2, 4, 0)]);
            assert!(watch.observe(at(s), &progress, &ours).is_empty());
        }
        // Ours is stuck as well, even for less than the timeout: a
        // dependency is down, not a member.
        let mut watch = OrphanWatch::new(Duration::from_secs(30));
        assert!(watch
            .observe(at(0), &snapshot(&[(0, 9, 0), (1, 3, 2)]), &ours)
            .is_empty());
        assert!(watch
            .observe(at(25), &snapshot(&[(0, 9, 2), (1, 3, 2)]), &ours)
            .is_empty());
        assert!(watch
            .observe(at(35), &snapshot(&[(0, 9, 2), (1, 3, 2)]), &ours)
            .is_empty());
        // No partitions of our own: nothing shows we are the healthy one.
        let mut watch = OrphanWatch::new(Duration::from_secs(30));
        for s in [0, 40, 80] {
            assert!(watch
                .observe(at(s), &snapshot(&[(1, 3, 2)]), &HashSet::new())
                .is_empty());
        }
        // Zero turns the watch off.
        let mut watch = OrphanWatch::new(Duration::ZERO);
        for s in [0, 40, 80] {
            assert!(watch
                .observe(at(s), &snapshot(&[(1, 3, 2)]), &ours)
                .is_empty());
        }
    }

    fn tp() -> TopicPartition {
        ("t".into(), 0)
    }

    #[test]
    fn the_watermark_stops_at_the_lowest_offset_not_done() {
        let mut offsets = Offsets::default();
        for offset in 10..15 {
            offsets.received(tp(), offset);
        }
        offsets.done(&tp(), 11);
        offsets.done(&tp(), 12);
        assert_eq!(offsets.take_committable(None).count(), 0, "10 is not done");
        offsets.done(&tp(), 10);
        let list = offsets.take_committable(None);
        assert_eq!(
            list.find_partition("t", 0).unwrap().offset(),
            Offset::Offset(13)
        );
        offsets.done(&tp(), 14);
        offsets.done(&tp(), 13);
        let list = offsets.take_committable(None);
        assert_eq!(
            list.find_partition("t", 0).unwrap().offset(),
            Offset::Offset(15)
        );
        assert_eq!(offsets.take_committable(None).count(), 0, "nothing new");
    }

    fn message(partition: i32, offset: i64) -> OwnedMessage {
        OwnedMessage::new(
            None,
            Some(b"k".to_vec()),
            "t".into(),
            rdkafka::Timestamp::NotAvailable,
            partition,
            offset,
            None,
        )
    }

    #[test]
    fn a_partition_handed_back_keeps_what_was_fetched_after_its_return() {
        let mut offsets = Offsets::default();
        // Fetched 3, then the partition was revoked (its offsets dropped)
        // and handed back; 5 was fetched after the return.
        offsets.received(tp(), 3);
        offsets.partitions.remove(&tp());
        offsets.received(tp(), 5);
        let revoked = HashSet::from([tp()]);
        let mut busy = HashMap::from([(
            b"k".to_vec(),
            VecDeque::from([message(0, 3), message(0, 5)]),
        )]);
        assert_eq!(purge_revoked(&mut busy, &revoked, &offsets), 1);
        let kept: Vec<i64> = busy[&b"k".to_vec()].iter().map(|m| m.offset()).collect();
        assert_eq!(kept, vec![5], "the message fetched after the return stays");
        // Processing it lets the watermark move past it.
        offsets.done(&tp(), 5);
        let list = offsets.take_committable(None);
        assert_eq!(
            list.find_partition("t", 0).unwrap().offset(),
            Offset::Offset(6)
        );
    }

    #[test]
    fn a_failed_commit_is_committed_again_at_the_next_tick() {
        let mut offsets = Offsets::default();
        offsets.received(tp(), 10);
        offsets.done(&tp(), 10);
        let list = offsets.take_committable(None);
        assert_eq!(
            list.find_partition("t", 0).unwrap().offset(),
            Offset::Offset(11)
        );
        assert_eq!(offsets.take_committable(None).count(), 0, "taken once");
        offsets.commit_failed(&list);
        let again = offsets.take_committable(None);
        assert_eq!(
            again.find_partition("t", 0).unwrap().offset(),
            Offset::Offset(11)
        );
    }

    #[test]
    fn a_static_member_keeps_its_place_through_a_restart_and_is_not_rejoined_around() {
        assert_eq!(session_timeout_ms(false, 60_000), 10_000);
        assert_eq!(session_timeout_ms(true, 60_000), 45_000);
        // librdkafka refuses a session longer than the poll interval.
        assert_eq!(session_timeout_ms(true, 15_000), 15_000);
        let secs = |s| Duration::from_secs(s);
        assert_eq!(orphan_timeout(30_000, false, 10_000), secs(30));
        assert_eq!(orphan_timeout(5_000, false, 10_000), secs(5));
        assert_eq!(orphan_timeout(30_000, true, 45_000), secs(60));
        assert_eq!(orphan_timeout(90_000, true, 45_000), secs(90));
        assert_eq!(orphan_timeout(0, true, 45_000), Duration::ZERO);
    }

    #[test]
    fn auto_size_is_littles_law_over_utilization() {
        // λ = 100/s, S = 50 ms: 5 busy workers; at 70 % utilization, 8.
        assert_eq!(auto_size(100.0, 0.05, 0.7, 64), 8);
        assert_eq!(auto_size(100.0, 0.05, 1.0, 64), 5);
        assert_eq!(auto_size(10_000.0, 1.0, 0.7, 64), 64, "capped");
        assert_eq!(auto_size(0.0, 0.05, 0.7, 64), 1, "at least one");
    }
}
