//! Kafka consumers on [rdkafka](https://docs.rs/rdkafka) (feature `kafka`):
//! the consumer runner whose positions live in the handler's own
//! transaction. Guide: [`guide::kafka`](crate::guide::kafka).
//!
//! - **Positions in the database.** The first `#[idempotent]` (or
//!   [`Inbox`](crate::Inbox)) async call of the handler writes the
//!   position of its message's partition, `offset + 1`, to
//!   `inbox_positions` in its own transaction, behind a guard that never
//!   moves it backwards: a consumer that lost its partition and still runs
//!   a handler (a zombie) is refused, rolls back, and gets `Duplicate`.
//! - **Kafka's committed offsets follow the database**: a partition's
//!   offset is committed only after the transactions of that message and of
//!   every earlier message of the partition have committed, `offset + 1` of
//!   what completed (offsets are not contiguous). They are kept in step for
//!   lag tools; the runner trusts the database's positions, and moves to
//!   them where the two disagree.
//! - **Order.** Within a partition, messages are applied one after the
//!   other, in offset order; [`in_flight`](crate::brokers::Consumer::in_flight)
//!   partitions run at once.
//! - **The message id** is the producer's id header (`message-id`,
//!   [`id_header`](crate::brokers::Consumer::id_header)) when present, else
//!   `topic/partition/offset`. Set the header: a producer's retry without
//!   `enable.idempotence` writes the same message again at a new offset,
//!   which only the header makes a duplicate.
//!
//! ```no_run
//! # async fn start() -> Result<(), Box<dyn std::error::Error>> {
//! use diesel_async::pooled_connection::deadpool::Pool;
//! use diesel_async::AsyncPgConnection;
//! use diesel_inbox::brokers::Policy;
//! use diesel_inbox::{idempotent, InboxError};
//! use rdkafka::consumer::{Consumer as _, StreamConsumer};
//! use rdkafka::ClientConfig;
//!
//! #[idempotent(key = "id")]
//! async fn ship(conn: &mut AsyncPgConnection, id: &str, body: &[u8]) -> Result<(), InboxError> {
//!     let _ = (conn, body); // the business writes
//!     Ok(())
//! }
//!
//! # let pool: Pool<AsyncPgConnection> = todo!();
//! let consumer: StreamConsumer = ClientConfig::new()
//!     .set("bootstrap.servers", "127.0.0.1:9092")
//!     .set("group.id", "shipping")
//!     .set("enable.auto.commit", "false")
//!     .set("enable.auto.offset.store", "false")
//!     .create()?;
//! consumer.subscribe(&["orders"])?;
//! let report = diesel_inbox::kafka::Consumer::new(consumer, Policy::new(|_: &InboxError| false))
//!     .in_flight(8)
//!     .run(
//!         async |id: &str, body: &[u8]| {
//!             let Ok(mut conn) = pool.get().await else {
//!                 return Err(InboxError::InvalidArgument("no database connection"));
//!             };
//!             ship(&mut conn, id, body).await
//!         },
//!         async {
//!             let _ = tokio::signal::ctrl_c().await;
//!         },
//!     )
//!     .await?;
//! println!("{report:?}");
//! # Ok(())
//! # }
//! ```

use crate::brokers::{usable_id, BrokerError, Inbound, Policy, Settlement};
use futures_util::Stream;
use inbox_runtime::__private::{Position, Verdict};
use rdkafka::consumer::{
    CommitMode, Consumer as _, ConsumerContext, DefaultConsumerContext, StreamConsumer,
};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{BorrowedMessage, Headers, Message as _};
use rdkafka::{Offset, TopicPartitionList};
use std::collections::{HashMap, VecDeque};
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

/// The header that carries a message's id, unless
/// [`id_header`](crate::brokers::Consumer::id_header) names another (the
/// outbox's Kafka publisher writes it).
pub const ID_HEADER: &str = "message-id";

/// How many messages of one partition wait in the runner while the one
/// before them runs, before the partition is paused (librdkafka then drops
/// what it fetched past them, and fetches again from after the last one
/// when resumed).
const LANE_BUFFER: usize = 256;

/// How long a seek may take (a local operation of librdkafka's).
const SEEK_TIMEOUT: Duration = Duration::from_secs(5);

/// A Kafka consumer runner over one rdkafka [`StreamConsumer`]: the loop of
/// [`brokers::Consumer`](crate::brokers::Consumer), with each partition's
/// messages in offset order and the positions kept in the handler's
/// transaction (module docs).
pub type Consumer<E, C = DefaultConsumerContext> = crate::brokers::Consumer<Partitions<C>, E>;

impl<E, C: ConsumerContext + 'static> crate::brokers::Consumer<Partitions<C>, E> {
    /// A runner for `consumer` (configured and subscribed by you), settling
    /// as `policy` says.
    ///
    /// [`run`](crate::brokers::Consumer::run) refuses
    /// ([`BrokerError::Config`]) a consumer that has `enable.auto.commit`
    /// or `enable.auto.offset.store` on: librdkafka would then commit the
    /// offsets of messages it handed out before their transactions
    /// committed. Set both to `"false"`.
    pub fn new(consumer: StreamConsumer<C>, policy: Policy<E>) -> Self {
        crate::brokers::Consumer::with(
            Partitions {
                shared: Arc::new(Shared {
                    consumer,
                    id_header: ID_HEADER.to_owned(),
                    lanes: Mutex::new(Lanes::default()),
                }),
                opened: None,
                assigned: false,
            },
            policy,
        )
    }

    /// The header that carries the message id (default [`ID_HEADER`],
    /// `message-id`).
    pub fn id_header(mut self, name: impl Into<String>) -> Self {
        if let Some(shared) = Arc::get_mut(&mut self.source.shared) {
            shared.id_header = name.into();
        }
        self
    }
}

/// A setting of `consumer`'s configuration, as librdkafka holds it.
fn config<C: ConsumerContext>(consumer: &StreamConsumer<C>, name: &str) -> Option<String> {
    let name = std::ffi::CString::new(name).ok()?;
    let mut value = vec![0u8; 64];
    let mut size = value.len();
    // SAFETY: the client pointer is live for `consumer`'s lifetime;
    // `rd_kafka_conf` returns its configuration (owned by the client, not
    // freed here), and `rd_kafka_conf_get` writes at most `size` bytes,
    // NUL-terminated, into `value`.
    let found = unsafe {
        let conf = rdkafka::bindings::rd_kafka_conf(consumer.client().native_ptr());
        rdkafka::bindings::rd_kafka_conf_get(
            conf,
            name.as_ptr(),
            value.as_mut_ptr().cast(),
            &mut size,
        )
    };
    if found != rdkafka::bindings::rd_kafka_conf_res_t::RD_KAFKA_CONF_OK {
        return None;
    }
    let text = std::ffi::CStr::from_bytes_until_nul(&value).ok()?;
    Some(text.to_string_lossy().into_owned())
}

/// The partitions a [`Consumer`] reads: the user's consumer and the state
/// of each partition's lane.
pub struct Partitions<C: ConsumerContext + 'static = DefaultConsumerContext> {
    shared: Arc<Shared<C>>,
    /// When the runner opened it, and whether the group has assigned it a
    /// partition since: until then its backlog is unknown, not empty.
    opened: Option<std::time::Instant>,
    assigned: bool,
}

/// How long a runner with [`exit_when_idle`](crate::brokers::Consumer::exit_when_idle)
/// waits for its group to assign it a partition before it counts an empty
/// assignment as nothing left (a group with more members than partitions
/// leaves some without any). A first join, or one after a member left
/// without leaving the group, can take the group's session timeout (45 s
/// by default).
pub const GROUP_JOIN_WAIT: Duration = Duration::from_secs(60);

impl<C: ConsumerContext> std::fmt::Debug for Partitions<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Partitions")
            .field("id_header", &self.shared.id_header)
            .finish_non_exhaustive()
    }
}

struct Shared<C: ConsumerContext + 'static> {
    consumer: StreamConsumer<C>,
    id_header: String,
    lanes: Mutex<Lanes>,
}

impl<C: ConsumerContext> Shared<C> {
    fn lanes(&self) -> MutexGuard<'_, Lanes> {
        self.lanes.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn pause(&self, topic: &str, partition: i32, pause: bool) {
        let mut list = TopicPartitionList::new();
        list.add_partition(topic, partition);
        let done = match pause {
            true => self.consumer.pause(&list),
            false => self.consumer.resume(&list),
        };
        if let Err(e) = done {
            tracing::debug!(target: "diesel_inbox", topic, partition, error = %e, "diesel-inbox: pausing or resuming a partition failed (revoked?)");
        }
    }

    /// Commits `next` as the partition's offset in Kafka (for lag tools),
    /// without waiting.
    fn commit(&self, topic: &str, partition: i32, next: i64) {
        let mut list = TopicPartitionList::new();
        if list
            .add_partition_offset(topic, partition, Offset::Offset(next))
            .is_err()
        {
            return;
        }
        if let Err(e) = self.consumer.commit(&list, CommitMode::Async) {
            tracing::debug!(target: "diesel_inbox", topic, partition, next, error = %e, "diesel-inbox: committing the Kafka offset failed (the database's position stands)");
        }
    }

    /// Sets the lag gauge of the partition from librdkafka's cached high
    /// watermark (no request to the broker), `next` being the runner's
    /// position.
    #[cfg(feature = "metrics")]
    fn lag(&self, topic: &str, partition: i32, next: i64) {
        let Ok(name) = std::ffi::CString::new(topic) else {
            return;
        };
        let (mut low, mut high) = (-1i64, -1i64);
        // SAFETY: the client pointer is live for the consumer's lifetime,
        // `name` is NUL-terminated, and the two outputs are written by
        // librdkafka under its own lock.
        let found = unsafe {
            rdkafka::bindings::rd_kafka_get_watermark_offsets(
                self.consumer.client().native_ptr(),
                name.as_ptr(),
                partition,
                &mut low,
                &mut high,
            )
        };
        if found == rdkafka::bindings::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR && high >= 0
        {
            inbox_runtime::__private::kafka_lag(topic, partition, (high - next).max(0));
        }
    }

    fn seek(&self, topic: &str, partition: i32, to: i64) {
        if let Err(e) = self
            .consumer
            .seek(topic, partition, Offset::Offset(to), SEEK_TIMEOUT)
        {
            tracing::warn!(target: "diesel_inbox", topic, partition, offset = to, error = %e, "diesel-inbox: seeking the partition to the database's position failed (revoked?)");
        }
    }
}

/// Every partition's lane, and the messages ready to hand out.
#[derive(Default)]
struct Lanes {
    lanes: HashMap<(Arc<str>, i32), Lane>,
    /// The next message of lanes that are free, oldest lane first.
    ready: VecDeque<Arc<Record>>,
    /// The stream's task, woken when a message becomes ready.
    waker: Option<Waker>,
}

/// One partition: at most one message handed out at a time.
#[derive(Default)]
struct Lane {
    /// A message of this partition is being handled.
    busy: bool,
    /// Messages received while it was, in offset order (at most
    /// [`LANE_BUFFER`]: the partition is paused then).
    pending: VecDeque<Arc<Record>>,
    paused: bool,
    /// The offset of the last message received.
    received: Option<i64>,
    /// Where the current contiguous run of received messages began (the
    /// first message received, or where the runner sought to): the lowest
    /// stored position the fence accepts.
    start: Option<i64>,
}

/// A received message, owned.
#[derive(Debug)]
struct Record {
    topic: Arc<str>,
    partition: i32,
    offset: i64,
    payload: Vec<u8>,
    id: Result<String, String>,
    deliveries: u32,
    /// The trace context's headers (feature `otel`).
    #[cfg(feature = "otel")]
    trace: Vec<(String, String)>,
}

/// The message's id: the `header`'s value when the message has it, else
/// `topic/partition/offset`; a valid inbox key either way.
pub fn message_id(message: &BorrowedMessage<'_>, header: &str) -> Result<String, BrokerError> {
    id_of(message, header).map_err(|why| BrokerError::NoMessageId { why })
}

fn id_of(message: &BorrowedMessage<'_>, header: &str) -> Result<String, String> {
    let from_header = message.headers().and_then(|headers| {
        headers
            .iter()
            .find(|h| h.key == header)
            .map(|h| h.value.map(|v| String::from_utf8(v.to_vec())))
    });
    match from_header {
        Some(Some(Ok(id))) => usable_id(Some(&id), &format!("{header} header")),
        Some(Some(Err(_))) => Err(format!("the {header} header is not UTF-8")),
        Some(None) => Err(format!("the {header} header has no value")),
        None => usable_id(
            Some(&format!(
                "{}/{}/{}",
                message.topic(),
                message.partition(),
                message.offset()
            )),
            "topic, partition and offset",
        ),
    }
}

/// A message handed to the runner.
pub struct Delivery<C: ConsumerContext + 'static = DefaultConsumerContext> {
    record: Arc<Record>,
    floor: Option<i64>,
    verdict: Mutex<Option<Verdict>>,
    shared: Arc<Shared<C>>,
}

impl<C: ConsumerContext> std::fmt::Debug for Delivery<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Delivery")
            .field("record", &self.record)
            .finish_non_exhaustive()
    }
}

impl<C: ConsumerContext> crate::brokers::Sealed for Delivery<C> {}

impl<C: ConsumerContext + 'static> Inbound for Delivery<C> {
    // Kafka has no redelivery of one message: the runner holds a retry
    // for its backoff, then hands it out again.
    const HOLDS_RETRIES: bool = true;
    // A dead letter skips the message: only permanent errors do.
    const LIMITS_DELIVERIES: bool = false;

    fn message_id(&self) -> Result<String, BrokerError> {
        self.record
            .id
            .clone()
            .map_err(|why| BrokerError::NoMessageId { why })
    }

    fn deliveries(&self) -> u32 {
        self.record.deliveries
    }

    fn body(&self) -> &[u8] {
        &self.record.payload
    }

    fn origin(&self) -> String {
        format!("{}/{}", self.record.topic, self.record.partition)
    }

    #[cfg(feature = "otel")]
    const SYSTEM: &'static str = "kafka";

    #[cfg(feature = "otel")]
    fn destination(&self) -> String {
        self.record.topic.to_string()
    }

    #[cfg(feature = "otel")]
    fn group(&self) -> Option<String> {
        config(&self.shared.consumer, "group.id")
    }

    #[cfg(feature = "otel")]
    fn headers_named(&self, names: &[String]) -> Vec<(String, String)> {
        let mut found = self.record.trace.clone();
        found.retain(|(name, _)| names.iter().any(|n| n.eq_ignore_ascii_case(name)));
        found
    }

    fn position(&self) -> Option<Position> {
        Some(Position {
            topic: self.record.topic.to_string(),
            partition: self.record.partition,
            offset: self.record.offset,
            floor: self.floor,
        })
    }

    fn fenced(&self, verdict: Option<Verdict>) {
        *self.verdict.lock().unwrap_or_else(|e| e.into_inner()) = verdict;
    }

    async fn settle(&self, settlement: Settlement, _delay: Duration) -> Result<(), BrokerError> {
        let verdict = self
            .verdict
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        let record = &self.record;
        let (topic, partition) = (&*record.topic, record.partition);
        let shared = &self.shared;
        let mut lanes = shared.lanes();
        let Lanes {
            lanes: all,
            ready,
            waker,
        } = &mut *lanes;
        let lane = all.entry((record.topic.clone(), partition)).or_default();
        lane.busy = false;
        match (settlement, verdict) {
            (Settlement::Retry, _) => {
                // Handed out again, first.
                lane.pending.push_front(Arc::new(Record {
                    topic: record.topic.clone(),
                    partition,
                    offset: record.offset,
                    payload: record.payload.clone(),
                    id: record.id.clone(),
                    deliveries: record.deliveries.saturating_add(1),
                    #[cfg(feature = "otel")]
                    trace: record.trace.clone(),
                }));
            }
            // The stored position is elsewhere: continue from it. What was
            // received past this message came from before the seek.
            (Settlement::Ack, Some(Verdict::Passed(to) | Verdict::Behind(to))) => {
                lane.pending.clear();
                lane.received = None;
                lane.start = Some(to);
                shared.seek(topic, partition, to);
                if matches!(verdict, Some(Verdict::Passed(_))) {
                    shared.commit(topic, partition, to);
                }
                tracing::debug!(target: "diesel_inbox", topic, partition, offset = record.offset, stored = to, "diesel-inbox: the stored position is elsewhere; continuing from it");
            }
            // Applied, a duplicate, or dead-lettered: the partition moves on.
            (Settlement::Ack | Settlement::DeadLetter, _) => {
                if settlement == Settlement::DeadLetter {
                    tracing::warn!(target: "diesel_inbox", topic, partition, offset = record.offset, "diesel-inbox: the partition moves past a dead-lettered message; it stays in Kafka at this offset");
                }
                shared.commit(topic, partition, record.offset + 1);
                #[cfg(feature = "metrics")]
                shared.lag(topic, partition, record.offset + 1);
            }
        }
        match lane.pending.pop_front() {
            Some(next) => {
                lane.busy = true;
                ready.push_back(next);
            }
            None if lane.paused => {
                lane.paused = false;
                shared.pause(topic, partition, false);
            }
            None => {}
        }
        if let Some(waker) = waker.take() {
            waker.wake();
        }
        Ok(())
    }
}

/// The messages of [`Partitions`], as the runner reads them: each
/// partition's next message only once the one before it is settled.
#[doc(hidden)]
pub struct Deliveries<C: ConsumerContext + 'static = DefaultConsumerContext> {
    shared: Arc<Shared<C>>,
    next: Pin<Box<dyn std::future::Future<Output = Result<Arc<Record>, KafkaError>> + Send>>,
}

/// Receives the next message and owns it.
fn receive<C: ConsumerContext + 'static>(
    shared: Arc<Shared<C>>,
) -> Pin<Box<dyn std::future::Future<Output = Result<Arc<Record>, KafkaError>> + Send>> {
    Box::pin(async move {
        let message = shared.consumer.recv().await?;
        Ok(Arc::new(Record {
            topic: Arc::from(message.topic()),
            partition: message.partition(),
            offset: message.offset(),
            payload: message.payload().unwrap_or_default().to_vec(),
            id: id_of(&message, &shared.id_header),
            deliveries: 1,
            #[cfg(feature = "otel")]
            trace: trace_headers(&message),
        }))
    })
}

/// The headers of the trace context (the global propagator's fields) a
/// message carries, as text.
#[cfg(feature = "otel")]
fn trace_headers(message: &BorrowedMessage<'_>) -> Vec<(String, String)> {
    let Some(headers) = message.headers() else {
        return Vec::new();
    };
    let names = inbox_runtime::__private::otel::fields();
    headers
        .iter()
        .filter(|h| names.iter().any(|n| n.eq_ignore_ascii_case(h.key)))
        .filter_map(|h| {
            let value = std::str::from_utf8(h.value?).ok()?;
            Some((h.key.to_owned(), value.to_owned()))
        })
        .collect()
}

impl<C: ConsumerContext + 'static> Deliveries<C> {
    fn deliver(&self, record: Arc<Record>, floor: Option<i64>) -> Delivery<C> {
        Delivery {
            record,
            floor,
            verdict: Mutex::new(None),
            shared: self.shared.clone(),
        }
    }
}

impl<C: ConsumerContext + 'static> Stream for Deliveries<C> {
    type Item = Result<Delivery<C>, BrokerError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        loop {
            {
                let mut lanes = self.shared.lanes();
                if let Some(record) = lanes.ready.pop_front() {
                    let floor = lanes
                        .lanes
                        .get(&(record.topic.clone(), record.partition))
                        .and_then(|lane| lane.start);
                    drop(lanes);
                    return Poll::Ready(Some(Ok(self.deliver(record, floor))));
                }
                lanes.waker = Some(cx.waker().clone());
            }
            let received = match self.next.as_mut().poll(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(received) => received,
            };
            self.next = receive(self.shared.clone());
            let record = match received {
                Ok(record) => record,
                Err(KafkaError::MessageConsumptionFatal(code)) => {
                    return Poll::Ready(Some(Err(BrokerError::Broker(
                        KafkaError::MessageConsumptionFatal(code).into(),
                    ))));
                }
                Err(KafkaError::PartitionEOF(_)) => continue,
                Err(e) if e.rdkafka_error_code() == Some(RDKafkaErrorCode::Fatal) => {
                    return Poll::Ready(Some(Err(BrokerError::Broker(e.into()))));
                }
                Err(e) => {
                    tracing::warn!(target: "diesel_inbox", error = %e, "diesel-inbox: the Kafka consumer reported an error; going on");
                    continue;
                }
            };
            let shared = self.shared.clone();
            let mut lanes = shared.lanes();
            let lane = lanes
                .lanes
                .entry((record.topic.clone(), record.partition))
                .or_default();
            // Behind what was received before: the partition was assigned
            // again (from the committed offset), or librdkafka delivered
            // an offset twice. What waits from before is stale.
            if lane.received.is_some_and(|last| record.offset <= last) {
                lane.pending.retain(|r| r.offset < record.offset);
                lane.start = Some(record.offset);
            }
            if lane.start.is_none() {
                lane.start = Some(record.offset);
            }
            lane.received = Some(record.offset);
            if lane.busy {
                lane.pending.push_back(record.clone());
                if lane.pending.len() >= LANE_BUFFER && !lane.paused {
                    lane.paused = true;
                    shared.pause(&record.topic, record.partition, true);
                }
                continue;
            }
            lane.busy = true;
            let floor = lane.start;
            drop(lanes);
            return Poll::Ready(Some(Ok(self.deliver(record, floor))));
        }
    }
}

impl<C: ConsumerContext> crate::brokers::Sealed for Partitions<C> {}

impl<C: ConsumerContext + 'static> crate::brokers::Source for Partitions<C> {
    type Message = Delivery<C>;
    type Deliveries = Deliveries<C>;

    fn name(&self) -> String {
        let topics: Vec<String> = match self.shared.consumer.subscription() {
            Ok(list) => list
                .elements()
                .iter()
                .map(|e| e.topic().to_owned())
                .collect(),
            Err(_) => Vec::new(),
        };
        format!("kafka:{}", topics.join(","))
    }

    async fn open(&mut self, _prefetch: usize) -> Result<Deliveries<C>, BrokerError> {
        for setting in ["enable.auto.commit", "enable.auto.offset.store"] {
            match config(&self.shared.consumer, setting).as_deref() {
                Some("false") => {}
                found => {
                    return Err(BrokerError::Config(format!(
                        "the Kafka consumer has `{setting}` = {}: the runner commits each partition's offset itself, after the database; set `{setting}` to \"false\"",
                        found.unwrap_or("(unreadable)")
                    )))
                }
            }
        }
        self.opened.get_or_insert_with(std::time::Instant::now);
        Ok(Deliveries {
            shared: self.shared.clone(),
            next: receive(self.shared.clone()),
        })
    }

    async fn stop(&mut self, _deliveries: &mut Deliveries<C>) {
        // The consumer is yours: it leaves its group when you drop it.
    }

    async fn backlog(&mut self) -> Result<u64, BrokerError> {
        let shared = self.shared.clone();
        let (left, assigned) = tokio::task::spawn_blocking(move || backlog(&shared))
            .await
            .map_err(|e| BrokerError::Broker(e.into()))??;
        self.assigned |= assigned;
        let subscribed = self
            .shared
            .consumer
            .subscription()
            .is_ok_and(|list| list.count() > 0);
        let joining = self
            .opened
            .is_some_and(|opened| opened.elapsed() < GROUP_JOIN_WAIT);
        match !self.assigned && subscribed && joining {
            // Not assigned yet: what is left is unknown, not nothing.
            true => Ok(left.max(1)),
            false => Ok(left),
        }
    }

    fn can_reconnect(&self) -> bool {
        true
    }

    async fn reconnect(&mut self) -> Result<(), BrokerError> {
        // librdkafka reconnects by itself.
        Ok(())
    }
}

/// Messages of the assigned partitions not handled yet: the high
/// watermark less the position, per partition (transaction markers count);
/// and whether any partition is assigned.
fn backlog<C: ConsumerContext + 'static>(shared: &Shared<C>) -> Result<(u64, bool), BrokerError> {
    let consumer = &shared.consumer;
    let broker = |e: KafkaError| BrokerError::Broker(e.into());
    let positions = consumer.position().map_err(broker)?;
    let waiting: u64 = shared
        .lanes()
        .lanes
        .values()
        .map(|lane| lane.pending.len() as u64)
        .sum();
    let mut left = waiting;
    for element in positions.elements() {
        let (low, high) = consumer
            .fetch_watermarks(element.topic(), element.partition(), Duration::from_secs(5))
            .map_err(broker)?;
        let at = match element.offset() {
            Offset::Offset(at) => at,
            _ => low,
        };
        let lag = (high - at).max(0);
        inbox_runtime::__private::kafka_lag(element.topic(), element.partition(), lag);
        left += lag as u64;
    }
    Ok((left, positions.count() > 0))
}
