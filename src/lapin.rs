//! RabbitMQ consumers on [lapin](https://docs.rs/lapin) (feature `lapin`):
//! the message id from the AMQP `message_id` property, the handler, then
//! the ack, and only then.
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use diesel_async::AsyncPgConnection;
//! use diesel_inbox::brokers::Policy;
//! use diesel_inbox::{idempotent, InboxError};
//! use futures_lite::StreamExt;
//! use lapin::options::BasicConsumeOptions;
//! use lapin::types::FieldTable;
//!
//! #[derive(Debug)]
//! enum AppError { Db(diesel::result::Error), Inbox(InboxError), BadPayload }
//! # impl From<diesel::result::Error> for AppError { fn from(e: diesel::result::Error) -> Self { AppError::Db(e) } }
//! # impl From<InboxError> for AppError { fn from(e: InboxError) -> Self { AppError::Inbox(e) } }
//! impl diesel_inbox::brokers::HasInboxError for AppError {
//!     fn inbox_error(&self) -> Option<&InboxError> {
//!         if let AppError::Inbox(e) = self { Some(e) } else { None }
//!     }
//! }
//!
//! #[idempotent(key = "id")]
//! async fn ship(conn: &mut AsyncPgConnection, id: &str, body: &[u8]) -> Result<(), AppError> {
//!     let _ = (conn, body); // the business writes
//!     Ok(())
//! }
//!
//! # let (channel, mut conn): (lapin::Channel, AsyncPgConnection) = todo!();
//! let policy = Policy::new(|e: &AppError| matches!(e, AppError::BadPayload)).max_deliveries(5);
//! let mut deliveries = channel
//!     .basic_consume("orders".into(), "shipper".into(), BasicConsumeOptions::default(), FieldTable::default())
//!     .await?;
//! while let Some(delivery) = deliveries.next().await {
//!     let handled = diesel_inbox::lapin::handle(delivery?, &policy, async |id, body| {
//!         ship(&mut conn, id, body).await
//!     })
//!     .await;
//!     // Ok: acked, requeued or dead-lettered as `handled.settlement` says.
//!     let _ = handled;
//! }
//! # Ok(())
//! # }
//! ```
//!
//! Delivery counts come from the `x-delivery-count` header that quorum
//! queues set on redeliveries (the first delivery has none: count 1). On a
//! classic queue only the `redelivered` flag exists: a redelivered message
//! counts as delivered twice, however often it really was, so
//! [`Policy::max_deliveries`](crate::brokers::Policy::max_deliveries) needs
//! a quorum queue to be exact. Dead-lettering is `basic.reject` without
//! requeue: the queue's `x-dead-letter-exchange` receives the message (without
//! one, RabbitMQ drops it).

use crate::brokers::{
    usable_id, BrokerError, Context, Handled, HasInboxError, Holds, Inbound, Policy, Settlement,
};
use crate::Outcome;
use lapin::message::Delivery;
use lapin::options::{BasicAckOptions, BasicNackOptions, BasicRejectOptions};
use lapin::types::AMQPValue;
use std::time::Duration;

/// The message's id: its AMQP `message_id` property, a valid inbox key.
pub fn message_id(delivery: &Delivery) -> Result<String, BrokerError> {
    let id = delivery
        .properties
        .message_id()
        .as_ref()
        .map(|id| id.as_str());
    usable_id(id, "message_id property").map_err(|why| BrokerError::NoMessageId { why })
}

/// Says once per process, as a WARN, that the runner consumes a classic
/// queue when a redelivery comes without the `x-delivery-count` header,
/// which quorum queues set on every redelivery (AMQP gives a consumer no
/// other way to read a queue's type).
fn classic_queue_warning(delivery: &Delivery) {
    static SAID: std::sync::Once = std::sync::Once::new();
    let counted = delivery
        .properties
        .headers()
        .as_ref()
        .is_some_and(|headers| headers.inner().contains_key("x-delivery-count"));
    if delivery.redelivered && !counted {
        SAID.call_once(|| {
            tracing::warn!(
                target: crate::TRACING_TARGET,
                exchange = delivery.exchange.as_str(),
                routing_key = delivery.routing_key.as_str(),
                fix = "declare the queue with x-queue-type = quorum",
                "diesel-inbox: a redelivery without x-delivery-count: the queue looks like a classic queue (RabbitMQ 4.3 and later also leave a quorum queue's count unchanged by a requeue), which lives on one node. While that node is down nothing is delivered, and what publishers send to the queue meanwhile is confirmed to them and dropped (unless published mandatory): the inbox never sees it. A quorum queue keeps both across the loss of a node"
            );
        });
    }
}

/// How often the broker has delivered the message, this time included:
/// `x-delivery-count` + 1 on a quorum queue; on a classic queue 2 if
/// `redelivered`, else 1.
pub fn deliveries(delivery: &Delivery) -> u32 {
    let counted = delivery
        .properties
        .headers()
        .as_ref()
        .and_then(|headers| headers.inner().get("x-delivery-count"))
        .and_then(|count| match count {
            AMQPValue::LongLongInt(n) => u32::try_from(*n).ok(),
            AMQPValue::LongInt(n) => u32::try_from(*n).ok(),
            AMQPValue::LongUInt(n) => Some(*n),
            AMQPValue::ShortInt(n) => u32::try_from(*n).ok(),
            AMQPValue::ShortUInt(n) => Some(u32::from(*n)),
            _ => None,
        });
    match counted {
        Some(previous) => previous.saturating_add(1),
        None if delivery.redelivered => 2,
        None => 1,
    }
}

/// Runs `handler` on the message's id and body, then settles the message
/// as `policy` says: ack after `Applied` or `Duplicate`, `nack` with requeue
/// after a transient error (held for the policy's backoff first,
/// [`Policy::retry_delay_for`](crate::brokers::Policy::retry_delay_for)), reject without requeue (to the dead-letter
/// exchange) after a permanent one or at the delivery limit.
///
/// The ack is sent only after the handler has returned, that is after its
/// transaction committed: this function owns the delivery, so nothing can
/// ack it earlier. A message without a usable id is rejected without
/// requeue, and [`BrokerError::NoMessageId`] says so.
pub async fn handle<O, E, F>(
    delivery: Delivery,
    policy: &Policy<E>,
    handler: F,
) -> Result<Handled<O, E>, BrokerError>
where
    O: Outcome,
    E: HasInboxError + std::fmt::Debug,
    F: AsyncFnOnce(&str, &[u8]) -> Result<O, E>,
{
    let context = Context {
        consumer: None,
        holds: &Holds::none(),
        transient: None,
    };
    crate::brokers::handle(
        delivery,
        policy,
        context,
        async move |m: &crate::brokers::Message<'_>| handler(m.id(), m.body()).await,
    )
    .await
}

impl crate::brokers::Sealed for Delivery {}

impl Inbound for Delivery {
    // AMQP has no delayed requeue: the delivery is held (the channel's
    // prefetch bounds how many), then requeued.
    const HOLDS_RETRIES: bool = true;

    fn message_id(&self) -> Result<String, BrokerError> {
        message_id(self)
    }

    fn deliveries(&self) -> u32 {
        deliveries(self)
    }

    /// With its headers whose values are strings.
    fn view<'a>(&'a self, id: &'a str) -> crate::brokers::Message<'a> {
        let headers = self
            .properties
            .headers()
            .as_ref()
            .map(|headers| {
                headers
                    .inner()
                    .iter()
                    .filter_map(|(name, value)| match value {
                        AMQPValue::LongString(text) => Some((name.as_str(), text.as_bytes())),
                        AMQPValue::ShortString(text) => {
                            Some((name.as_str(), text.as_str().as_bytes()))
                        }
                        _ => None,
                    })
                    .collect()
            })
            .unwrap_or_default();
        crate::brokers::Message {
            deliveries: self.deliveries(),
            headers,
            ..crate::brokers::Message::new(id, self.body())
        }
    }

    fn body(&self) -> &[u8] {
        &self.data
    }

    fn origin(&self) -> String {
        format!("{}/{}", self.exchange, self.routing_key)
    }

    #[cfg(feature = "otel")]
    const SYSTEM: &'static str = "rabbitmq";

    #[cfg(feature = "otel")]
    fn destination(&self) -> String {
        self.exchange.to_string()
    }

    #[cfg(feature = "otel")]
    fn routing_key(&self) -> Option<String> {
        Some(self.routing_key.to_string())
    }

    #[cfg(feature = "otel")]
    fn headers_named(&self, names: &[String]) -> Vec<(String, String)> {
        let Some(headers) = self.properties.headers().as_ref() else {
            return Vec::new();
        };
        headers
            .inner()
            .iter()
            .filter(|(name, _)| names.iter().any(|n| n.eq_ignore_ascii_case(name.as_str())))
            .filter_map(|(name, value)| match value {
                AMQPValue::LongString(text) => std::str::from_utf8(text.as_bytes())
                    .ok()
                    .map(|text| (name.to_string(), text.to_owned())),
                AMQPValue::ShortString(text) => Some((name.to_string(), text.to_string())),
                _ => None,
            })
            .collect()
    }

    async fn ack_batch(batch: &[&Self]) -> Result<(), BrokerError> {
        // Every ack sent at once, not one after the other's turn; not one
        // `multiple` ack, which would also ack deliveries of another
        // consumer on a channel of yours (`Consumer::new`).
        let acks = batch
            .iter()
            .map(|delivery| delivery.acker.ack(BasicAckOptions::default()));
        let acked = tokio::time::timeout(SETTLE_TIMEOUT, futures_util::future::join_all(acks))
            .await
            .map_err(|_| settle_timed_out())?;
        for acked in acked {
            acked.map_err(|e| BrokerError::Settle(e.into()))?;
        }
        Ok(())
    }

    async fn settle(&self, settlement: Settlement, _held: Duration) -> Result<(), BrokerError> {
        let acker = &self.acker;
        let done = async {
            match settlement {
                Settlement::Ack => acker.ack(BasicAckOptions::default()).await,
                Settlement::Retry => {
                    acker
                        .nack(BasicNackOptions {
                            requeue: true,
                            ..BasicNackOptions::default()
                        })
                        .await
                }
                Settlement::DeadLetter => acker.reject(BasicRejectOptions { requeue: false }).await,
            }
        };
        tokio::time::timeout(SETTLE_TIMEOUT, done)
            .await
            .map_err(|_| settle_timed_out())?
            .map(drop)
            .map_err(|e| BrokerError::Settle(e.into()))
    }
}

/// How long an ack, nack or reject may take: lapin was seen not to
/// answer one sent as its node died (the connection reset) until the
/// process stopped, and a runner at its `in_flight` waits for it, without
/// reading the stream that reports the connection's failure. Then the
/// settlement counts as failed (unsettled): the runner reads on, meets
/// the failure and connects again, and the broker redelivers what it did
/// not take (the inbox absorbs a redelivery of an ack that did arrive).
const SETTLE_TIMEOUT: Duration = Duration::from_secs(10);

fn settle_timed_out() -> BrokerError {
    BrokerError::Settle(
        format!("RabbitMQ did not answer the settlement within {SETTLE_TIMEOUT:?}").into(),
    )
}

/// A RabbitMQ consumer runner over one queue: the loop of
/// [`brokers::Consumer`](crate::brokers::Consumer), with the channel's
/// prefetch (`basic.qos`) set to its `in_flight`.
///
/// ```no_run
/// # async fn start() -> Result<(), Box<dyn std::error::Error>> {
/// use diesel_async::pooled_connection::deadpool::{Pool, PoolError};
/// use diesel_async::{AsyncPgConnection, RunQueryDsl};
/// use diesel_inbox::brokers::Policy;
/// use diesel_inbox::{idempotent, InboxError};
///
/// #[derive(Debug)]
/// enum AppError { Inbox(InboxError), Db(diesel::result::Error), Pool(PoolError) }
/// # impl From<InboxError> for AppError { fn from(e: InboxError) -> Self { AppError::Inbox(e) } }
/// # impl From<diesel::result::Error> for AppError { fn from(e: diesel::result::Error) -> Self { AppError::Db(e) } }
/// # impl From<PoolError> for AppError { fn from(e: PoolError) -> Self { AppError::Pool(e) } }
///
/// // Where the inbox's refusals (KeyReused, AttemptsExhausted) travel: the
/// // runner dead-letters them.
/// impl diesel_inbox::brokers::HasInboxError for AppError {
///     fn inbox_error(&self) -> Option<&InboxError> {
///         if let AppError::Inbox(e) = self { Some(e) } else { None }
///     }
/// }
///
/// #[idempotent(key = "id")]
/// async fn ship(conn: &mut AsyncPgConnection, id: &str, body: &[u8]) -> Result<(), AppError> {
///     let _ = (conn, body); // the business writes
///     Ok(())
/// }
///
/// # let pool: Pool<AsyncPgConnection> = todo!();
/// // Nothing of the application's own is permanent here.
/// let policy = Policy::new(|_: &AppError| false);
/// let probe = pool.clone();
/// // `connect`: the runner owns its connection and makes it again when it
/// // drops.
/// let report = diesel_inbox::lapin::Consumer::connect("amqp://127.0.0.1:5672/%2f", "orders", policy)
///     .in_flight(8)
///     .health_probe(move || {
///         let pool = probe.clone();
///         async move {
///             let Ok(mut conn) = pool.get().await else { return false };
///             diesel::sql_query("SELECT 1").execute(&mut conn).await.is_ok()
///         }
///     })
///     .run(
///         async |id: &str, body: &[u8]| ship(&mut *pool.get().await?, id, body).await,
///         async {
///             let _ = tokio::signal::ctrl_c().await;
///         },
///     )
///     .await?;
/// println!("{report:?}");
/// # Ok(())
/// # }
/// ```
pub type Consumer<E> = crate::brokers::Consumer<Queue, E>;

/// The queue a [`Consumer`] reads.
#[derive(Debug)]
pub struct Queue {
    channel: Option<lapin::Channel>,
    /// Where to connect again (`Consumer::connect`, `connect_any`), and
    /// the connection made there.
    nodes: Option<Nodes>,
    connection: Option<lapin::Connection>,
    queue: String,
    tag: String,
    consumer: Option<String>,
}

impl Queue {
    fn of(channel: Option<lapin::Channel>, nodes: Option<Nodes>, queue: String) -> Self {
        Queue {
            channel,
            nodes,
            connection: None,
            queue,
            tag: String::new(),
            consumer: None,
        }
    }

    fn channel(&self) -> Result<&lapin::Channel, BrokerError> {
        self.channel
            .as_ref()
            .ok_or_else(|| BrokerError::Broker("not connected".into()))
    }
}

impl<E> crate::brokers::Consumer<Queue, E> {
    /// A runner for `queue` on `channel`, settling as `policy` says. It
    /// cannot connect again when the channel fails: `run` then returns
    /// [`BrokerError::Broker`]. [`connect`](Self::connect) can.
    pub fn new(channel: lapin::Channel, queue: impl Into<String>, policy: Policy<E>) -> Self {
        crate::brokers::Consumer::with(Queue::of(Some(channel), None, queue.into()), policy)
    }

    /// A runner for `queue` on a connection of its own to `url` (made when
    /// `run` starts), which it makes again, with a backoff, whenever the
    /// connection fails.
    pub fn connect(url: impl Into<String>, queue: impl Into<String>, policy: Policy<E>) -> Self {
        Self::connect_any([url], queue, policy)
    }

    /// [`connect`](Self::connect) to the first of a cluster's nodes that
    /// answers (`urls`, in order, from the one that answered last), and to
    /// the next one that does whenever the connection fails: the runner
    /// goes on through the loss of the node it was connected to (with a
    /// quorum queue, whose messages the other nodes have). Each attempt is
    /// bounded ([`NODE_CONNECT_TIMEOUT`]); no URL is an error at `run`.
    ///
    /// ```no_run
    /// # fn consumer(policy: diesel_inbox::brokers::Policy<diesel_inbox::InboxError>) {
    /// let nodes = ["amqp://rabbit-1:5672/%2f", "amqp://rabbit-2:5672/%2f", "amqp://rabbit-3:5672/%2f"];
    /// let consumer = diesel_inbox::lapin::Consumer::connect_any(nodes, "orders", policy);
    /// # }
    /// ```
    pub fn connect_any(
        urls: impl IntoIterator<Item = impl Into<String>>,
        queue: impl Into<String>,
        policy: Policy<E>,
    ) -> Self {
        crate::brokers::Consumer::with(
            Queue::of(None, Some(Nodes::new(urls)), queue.into()),
            policy,
        )
    }

    /// The consumer tag (default: the broker names it).
    pub fn consumer_tag(mut self, tag: impl Into<String>) -> Self {
        self.source.tag = tag.into();
        self
    }
}

impl crate::brokers::Sealed for Queue {}

fn broker(e: lapin::Error) -> BrokerError {
    BrokerError::Broker(e.into())
}

/// The deliveries of a [`Queue`], as the runner reads them.
#[doc(hidden)]
pub type Deliveries = futures_util::stream::Map<
    lapin::Consumer,
    fn(Result<Delivery, lapin::Error>) -> Result<Delivery, BrokerError>,
>;

impl crate::brokers::Source for Queue {
    type Message = Delivery;
    type Deliveries = Deliveries;

    fn name(&self) -> String {
        self.queue.clone()
    }

    async fn backlog(&mut self) -> Result<u64, BrokerError> {
        use lapin::options::QueueDeclareOptions;
        // Passive: only asks; the ready messages (ours in flight are unacked).
        let queue = self
            .channel()?
            .queue_declare(
                self.queue.as_str().into(),
                QueueDeclareOptions {
                    passive: true,
                    ..QueueDeclareOptions::default()
                },
                lapin::types::FieldTable::default(),
            )
            .await
            .map_err(broker)?;
        Ok(u64::from(queue.message_count()))
    }

    async fn open(&mut self, prefetch: usize) -> Result<Deliveries, BrokerError> {
        use futures_util::StreamExt;
        use lapin::options::{BasicConsumeOptions, BasicQosOptions};
        if self.channel.is_none() {
            self.reconnect().await?;
        }
        let prefetch = u16::try_from(prefetch).unwrap_or(u16::MAX);
        let channel = self.channel()?;
        channel
            .basic_qos(prefetch, BasicQosOptions::default())
            .await
            .map_err(broker)?;
        let consumer = channel
            .basic_consume(
                self.queue.as_str().into(),
                self.tag.as_str().into(),
                BasicConsumeOptions::default(),
                lapin::types::FieldTable::default(),
            )
            .await
            .map_err(broker)?;
        self.consumer = Some(consumer.tag().to_string());
        let map: fn(Result<Delivery, lapin::Error>) -> Result<Delivery, BrokerError> = |next| {
            if let Ok(delivery) = &next {
                classic_queue_warning(delivery);
            }
            next.map_err(broker)
        };
        Ok(consumer.map(map))
    }

    async fn stop(&mut self, _deliveries: &mut Deliveries) {
        use lapin::options::BasicCancelOptions;
        if let (Some(tag), Some(channel)) = (self.consumer.take(), &self.channel) {
            let _ = channel
                .basic_cancel(tag.as_str().into(), BasicCancelOptions::default())
                .await;
        }
    }

    fn can_reconnect(&self) -> bool {
        self.nodes.is_some()
    }

    async fn reconnect(&mut self) -> Result<(), BrokerError> {
        let nodes = self
            .nodes
            .as_mut()
            .ok_or_else(|| BrokerError::Broker("a channel of the caller's own".into()))?;
        let connection = nodes
            .connect()
            .await
            .map_err(|e| BrokerError::Broker(e.into()))?;
        self.channel = Some(connection.create_channel().await.map_err(broker)?);
        self.connection = Some(connection);
        Ok(())
    }
}

/// How long one attempt to connect to a node may take (a node that is
/// down but whose address still routes may not answer at all): then the
/// next node is tried.
pub const NODE_CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// A cluster's nodes, by URL, and the one that answered last: where a
/// consumer or a publisher of its own connection connects (again).
#[derive(Debug)]
pub(crate) struct Nodes {
    urls: Vec<String>,
    /// The node tried first: the last that answered.
    next: usize,
}

impl Nodes {
    pub(crate) fn new(urls: impl IntoIterator<Item = impl Into<String>>) -> Self {
        Nodes {
            urls: urls.into_iter().map(Into::into).collect(),
            next: 0,
        }
    }

    /// The node that answered last (its URL without the password).
    pub(crate) fn current(&self) -> String {
        self.urls
            .get(self.next)
            .map(|url| redacted(url))
            .unwrap_or_default()
    }

    /// Whether no URL was given.
    pub(crate) fn is_empty(&self) -> bool {
        self.urls.is_empty()
    }

    /// A connection to the first node that answers, each tried once from
    /// the last that answered; the errors of all when none does. A node
    /// that fails is passed over by the next call too (it starts after
    /// it), also when this call is dropped while it waits.
    pub(crate) async fn connect(&mut self) -> Result<lapin::Connection, String> {
        if self.urls.is_empty() {
            return Err(NO_URL.into());
        }
        let mut failed = Vec::new();
        for _ in 0..self.urls.len() {
            let at = self.next % self.urls.len();
            // Past it, unless it answers.
            self.next = at + 1;
            let url = &self.urls[at];
            let attempt = lapin::Connection::connect(url, lapin::ConnectionProperties::default());
            match tokio::time::timeout(NODE_CONNECT_TIMEOUT, attempt).await {
                Ok(Ok(connection)) => {
                    self.next = at;
                    return Ok(connection);
                }
                Ok(Err(e)) => failed.push(format!(
                    "{}: {}",
                    redacted(url),
                    e.to_string().replace(url.as_str(), &redacted(url))
                )),
                Err(_) => failed.push(format!(
                    "{}: no answer within {NODE_CONNECT_TIMEOUT:?}",
                    redacted(url)
                )),
            }
        }
        Err(failed.join("; "))
    }
}

/// The error of a `connect_any` without a URL.
pub(crate) const NO_URL: &str = "no RabbitMQ URL was given (connect_any with an empty list)";

/// An AMQP URL without its password, for messages.
fn redacted(url: &str) -> String {
    match (url.split_once("://"), url.rfind('@')) {
        (Some((scheme, rest)), Some(at)) if at > scheme.len() + 3 => {
            let user = rest[..at - scheme.len() - 3]
                .split(':')
                .next()
                .unwrap_or("");
            format!("{scheme}://{user}:***{}", &url[at..])
        }
        (None, Some(at)) => format!("***{}", &url[at..]),
        _ => url.to_owned(),
    }
}

#[cfg(test)]
mod node_tests {
    use super::*;

    #[test]
    fn a_url_in_an_error_has_no_password() {
        assert_eq!(
            redacted("amqp://guest:secret@127.0.0.1:5672/%2f"),
            "amqp://guest:***@127.0.0.1:5672/%2f"
        );
        assert_eq!(redacted("amqp://127.0.0.1:5672"), "amqp://127.0.0.1:5672");
        assert_eq!(redacted("amqp:guest:secret@host"), "***@host");
    }
}
