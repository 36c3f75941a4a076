//! [`Publisher`]: rdkafka's `FutureProducer` without its busy idle.
//!
//! A librdkafka producer must be polled for its delivery reports. rdkafka's
//! `FutureProducer` does that on a thread that calls `BaseProducer::poll`
//! with a 100 ms window, and every window ends in about a millisecond of busy
//! polling: the window's remainder is handed to librdkafka in whole
//! milliseconds, so its last fraction of a millisecond becomes a run of 0 ms
//! polls until the deadline passes (rdkafka 0.39, `BaseProducer::poll` and
//! `Timeout::as_millis`). That is about 1 % of a core for each idle producer.
//!
//! The `Publisher` sends the same records with the same result. Its own
//! polling thread uses one-second windows, so the tail costs a tenth as
//! much, and the thread wakes at once for a delivery report as before.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::client::Client;
use rdkafka::config::{FromClientConfig, FromClientConfigAndContext};
use rdkafka::error::{KafkaError, KafkaResult};
use rdkafka::message::{DeliveryResult, Message, OwnedHeaders, OwnedMessage, ToBytes};
use rdkafka::producer::future_producer::{Delivery, OwnedDeliveryResult};
use rdkafka::producer::{BaseProducer, BaseRecord, FutureRecord, Producer, ProducerContext};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::util::Timeout;
use rdkafka::{ClientConfig, ClientContext, Timestamp};
use tokio::sync::oneshot;

/// How long the polling thread waits for a delivery report in one call.
/// It also bounds how long the thread outlives the last `Publisher` clone.
const POLL_WINDOW: Duration = Duration::from_secs(1);

/// Numbers the polling threads, whose names tell them apart (in `top -H`,
/// a profile, a test).
static THREADS: AtomicU32 = AtomicU32::new(0);

/// An asynchronous producer: [`send`](Self::send) resolves once the broker
/// has acknowledged the record (or it failed). Clones share one librdkafka
/// producer. The polling thread stops within [`POLL_WINDOW`] after the last
/// clone is dropped, and the producer is then closed as rdkafka closes its
/// own: records still queued (of sends no longer awaited) are purged.
#[derive(Clone)]
pub struct Publisher {
    shared: Arc<Shared>,
}

struct Shared {
    producer: Arc<BaseProducer<Completes>>,
    stop: Arc<AtomicBool>,
    thread: String,
}

impl Drop for Shared {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Completes each record's send with its delivery report.
struct Completes;

impl ClientContext for Completes {}

impl ProducerContext for Completes {
    type DeliveryOpaque = Box<oneshot::Sender<OwnedDeliveryResult>>;

    fn delivery(&self, result: &DeliveryResult<'_>, tx: Self::DeliveryOpaque) {
        let owned = match result {
            Ok(message) => Ok(Delivery {
                partition: message.partition(),
                offset: message.offset(),
                timestamp: message.timestamp(),
            }),
            Err((error, message)) => Err((error.clone(), message.detach())),
        };
        // The send may have been dropped; then nobody waits for the report.
        let _ = tx.send(owned);
    }
}

impl FromClientConfig for Publisher {
    fn from_config(config: &ClientConfig) -> KafkaResult<Self> {
        let producer = Arc::new(BaseProducer::from_config_and_context(config, Completes)?);
        let stop = Arc::new(AtomicBool::new(false));
        let polled = (Arc::clone(&producer), Arc::clone(&stop));
        // Linux keeps 15 bytes of a thread's name: room for 99,999 of them.
        let thread = format!(
            "kafka-pub-{}",
            THREADS.fetch_add(1, Ordering::Relaxed) % 100_000
        );
        std::thread::Builder::new()
            .name(thread.clone())
            .spawn(move || {
                let (producer, stop) = polled;
                while !stop.load(Ordering::Relaxed) {
                    producer.poll(POLL_WINDOW);
                }
            })
            .map_err(|error| {
                KafkaError::ClientCreation(format!("starting the polling thread: {error}"))
            })?;
        Ok(Self {
            shared: Arc::new(Shared {
                producer,
                stop,
                thread,
            }),
        })
    }
}

impl Publisher {
    /// Sends `record` and waits for its delivery report, as rdkafka's
    /// `FutureProducer::send` does: while librdkafka's queue is full it
    /// retries every 100 ms for up to `queue_timeout`, then fails with
    /// `QueueFull`. The record is queued when the future is first polled,
    /// so futures polled in order queue their records in that order.
    #[allow(
        clippy::result_large_err,
        reason = "rdkafka's own result type, as its FutureProducer returns it"
    )]
    pub async fn send<K, P>(
        &self,
        record: FutureRecord<'_, K, P>,
        queue_timeout: impl Into<Timeout>,
    ) -> OwnedDeliveryResult
    where
        K: ToBytes + ?Sized,
        P: ToBytes + ?Sized,
    {
        let started = Instant::now();
        let queue_timeout = queue_timeout.into();
        let topic = record.topic;
        let (tx, rx) = oneshot::channel();
        let mut base = BaseRecord {
            topic: record.topic,
            partition: record.partition,
            payload: record.payload,
            key: record.key,
            timestamp: record.timestamp,
            headers: record.headers,
            delivery_opaque: Box::new(tx),
        };
        loop {
            match self.shared.producer.send(base) {
                Ok(()) => {
                    // Every record given to a producer is reported, and our
                    // `Arc` keeps the producer; were the report lost anyway,
                    // the send fails rather than wait forever.
                    return rx.await.unwrap_or_else(|_| {
                        Err((
                            KafkaError::Canceled,
                            unsent(topic, None, None, None, None, None),
                        ))
                    });
                }
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back))
                    if match queue_timeout {
                        Timeout::Never => true,
                        Timeout::After(limit) => started.elapsed() < limit,
                    } =>
                {
                    base = back;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err((error, back)) => {
                    let message = unsent(
                        back.topic,
                        back.payload.map(|p| p.to_bytes().to_vec()),
                        back.key.map(|k| k.to_bytes().to_vec()),
                        back.timestamp,
                        back.partition,
                        back.headers,
                    );
                    return Err((error, message));
                }
            }
        }
    }

    /// The librdkafka client, for its fatal error and metadata.
    pub fn client(&self) -> &Client<impl ClientContext> {
        self.shared.producer.client()
    }

    /// The name of the polling thread.
    pub fn poll_thread(&self) -> &str {
        &self.shared.thread
    }
}

/// A record that never reached the producer, as a failed send returns it.
fn unsent(
    topic: &str,
    payload: Option<Vec<u8>>,
    key: Option<Vec<u8>>,
    timestamp: Option<i64>,
    partition: Option<i32>,
    headers: Option<OwnedHeaders>,
) -> OwnedMessage {
    let timestamp = timestamp.map_or(Timestamp::NotAvailable, Timestamp::CreateTime);
    let partition = partition.unwrap_or(-1);
    OwnedMessage::new(
        payload,
        key,
        topic.to_owned(),
        timestamp,
        partition,
        0,
        headers,
    )
}
