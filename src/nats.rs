//! NATS JetStream consumers on [async-nats](https://docs.rs/async-nats)
//! (feature `nats`): the message id from the `Nats-Msg-Id` header (or the
//! stream and its sequence), the handler, then the ack, and only then.
//!
//! **Without `Nats-Msg-Id`**, the id is `<stream>:<stream sequence>`. That
//! deduplicates JetStream's own redeliveries of a stored message, but a
//! producer that retries a publish stores a second message with a new
//! sequence, which is then a new id: set `Nats-Msg-Id` on publish (JetStream
//! also drops such a retry within the stream's duplicate window, and the
//! inbox catches it after the window).
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use diesel_async::AsyncPgConnection;
//! use diesel_inbox::brokers::Policy;
//! use diesel_inbox::{idempotent, InboxError};
//! use futures_lite::StreamExt;
//! use std::time::Duration;
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
//! # let (consumer, mut conn): (async_nats::jetstream::consumer::PullConsumer, AsyncPgConnection) = todo!();
//! let policy = Policy::new(|e: &AppError| matches!(e, AppError::BadPayload))
//!     .max_deliveries(5)
//!     .retry_delay(Duration::from_millis(500));
//! let mut messages = consumer.messages().await?;
//! while let Some(message) = messages.next().await {
//!     let handled = diesel_inbox::nats::handle(message?, &policy, async |id, body| {
//!         ship(&mut conn, id, body).await
//!     })
//!     .await;
//!     let _ = handled;
//! }
//! # Ok(())
//! # }
//! ```

use crate::brokers::{
    usable_id, BrokerError, Context, Handled, HasInboxError, Holds, Inbound, Policy, Settlement,
};
use crate::Outcome;
use async_nats::jetstream::message::{AckKind, Message};
use std::time::Duration;

/// The message's id: its `Nats-Msg-Id` header, else
/// `<stream>:<stream sequence>`; a valid inbox key either way.
pub fn message_id(message: &Message) -> Result<String, BrokerError> {
    let header = message
        .headers
        .as_ref()
        .and_then(|headers| headers.get("Nats-Msg-Id"))
        .map(|id| id.as_str());
    let id = match header {
        Some(id) => usable_id(Some(id), "Nats-Msg-Id header"),
        None => message
            .info()
            .map_err(|e| format!("no Nats-Msg-Id header and no JetStream metadata: {e}"))
            .and_then(|info| {
                usable_id(
                    Some(&format!("{}:{}", info.stream, info.stream_sequence)),
                    "stream and sequence",
                )
            }),
    };
    id.map_err(|why| BrokerError::NoMessageId { why })
}

/// Says once per stream and process, as a WARN with the fix, where a
/// JetStream stream may lose messages it acknowledged: memory storage, or
/// a single replica (whose server, by default, syncs to disk only every
/// two minutes). Read with the stream's info (bounded; a failure is
/// logged at DEBUG): by the runner at its first delivery, by the relay's
/// publisher at its first confirm from each stream.
pub(crate) async fn check_stream(context: async_nats::jetstream::Context, stream: String) {
    static CHECKED: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    {
        let mut checked = CHECKED
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if checked.contains(&stream) {
            return;
        }
        checked.push(stream.clone());
    }
    let info = match tokio::time::timeout(Duration::from_secs(5), context.get_stream(&stream)).await
    {
        Ok(Ok(found)) => found.cached_info().config.clone(),
        Ok(Err(e)) => {
            tracing::debug!(target: crate::TRACING_TARGET, stream, error = %e, "diesel-inbox: the JetStream stream's configuration could not be read");
            return;
        }
        Err(_) => {
            tracing::debug!(target: crate::TRACING_TARGET, stream, "diesel-inbox: the JetStream stream's configuration did not arrive within 5 s");
            return;
        }
    };
    for said in stream_durability(&info)
        .iter()
        .filter(|p| p.verdict == crate::Verdict::Warn)
    {
        tracing::warn!(
            target: crate::TRACING_TARGET,
            stream,
            setting = said.name.as_str(),
            value = said.value.as_str(),
            fix = said.fix.as_deref().unwrap_or(""),
            "diesel-inbox: {}",
            said.detail
        );
    }
}

/// What a JetStream stream's configuration means for the messages it
/// acknowledged: its storage and its replicas, each ok or WARN with the fix
/// (the server's `sync_interval` is not readable by a client). The runner
/// and the relay's publisher log the WARNs once per stream; `diesel-inbox
/// doctor --nats URL --stream NAME` prints them all.
///
/// ```
/// use async_nats::jetstream::stream::{Config, StorageType};
/// use diesel_inbox::Verdict;
///
/// let single = Config { name: "orders".into(), storage: StorageType::File, num_replicas: 1, ..Default::default() };
/// let said = diesel_inbox::nats::stream_durability(&single);
/// assert!(said.iter().any(|p| p.name == "num_replicas" && p.verdict == Verdict::Warn));
/// let three = Config { num_replicas: 3, ..single };
/// assert!(diesel_inbox::nats::stream_durability(&three).iter().all(|p| p.verdict == Verdict::Ok));
/// ```
pub fn stream_durability(
    config: &async_nats::jetstream::stream::Config,
) -> Vec<crate::Prerequisite> {
    use crate::{Prerequisite, Verdict};
    use async_nats::jetstream::stream::StorageType;
    let storage = match config.storage {
        StorageType::Memory => Prerequisite::new(
            "storage",
            "memory",
            Verdict::Warn,
            "the JetStream stream keeps its messages in memory: a server restart loses messages it acknowledged",
            Some("a stream with storage: file (a stream's storage cannot be changed in place)".into()),
        ),
        StorageType::File => Prerequisite::new(
            "storage",
            "file",
            Verdict::Ok,
            "the stream keeps its messages on disk",
            None,
        ),
    };
    let replicas = config.num_replicas.to_string();
    let replicated = match config.num_replicas {
        0 | 1 => Prerequisite::new(
            "num_replicas",
            replicas,
            Verdict::Warn,
            "the JetStream stream has one replica: a crash or power loss of its server can lose messages it acknowledged (by default a server syncs to disk every two minutes), and while that server is down nothing is delivered",
            Some("num_replicas: 3 on a cluster of three or more servers, and sync_interval: always in each server's jetstream configuration".into()),
        ),
        _ => Prerequisite::new(
            "num_replicas",
            replicas,
            Verdict::Ok,
            "a message is acknowledged once a majority of the stream's replicas have it: the loss of a minority of its servers loses nothing",
            None,
        ),
    };
    vec![storage, replicated]
}

/// How often JetStream has delivered the message, this time included.
pub fn deliveries(message: &Message) -> u32 {
    message
        .info()
        .ok()
        .and_then(|info| u32::try_from(info.delivered).ok())
        .unwrap_or(1)
        .max(1)
}

/// Runs `handler` on the message's id and payload, then settles the
/// message as `policy` says: `Ack` after `Applied` or `Duplicate`, `Nak`
/// with the policy's backoff ([`Policy::retry_delay_for`]) after a transient error, `Term` after a
/// permanent one or at the delivery limit.
///
/// The ack is sent only after the handler has returned, that is after its
/// transaction committed: this function owns the message, so nothing can
/// ack it earlier. A message without a usable id is terminated, and
/// [`BrokerError::NoMessageId`] says so.
pub async fn handle<O, E, F>(
    message: Message,
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
        message,
        policy,
        context,
        async move |m: &crate::brokers::Message<'_>| handler(m.id(), m.body()).await,
    )
    .await
}

impl crate::brokers::Sealed for Message {}

impl Inbound for Message {
    // `Nak(delay)`: JetStream waits out the delay itself.
    const HOLDS_RETRIES: bool = false;

    fn message_id(&self) -> Result<String, BrokerError> {
        message_id(self)
    }

    fn deliveries(&self) -> u32 {
        deliveries(self)
    }

    /// With its headers (a header with several values, once per value).
    fn view<'a>(&'a self, id: &'a str) -> crate::brokers::Message<'a> {
        let headers = self
            .headers
            .as_ref()
            .map(|headers| {
                headers
                    .iter()
                    .flat_map(|(name, values)| {
                        let name: &str = name.as_ref();
                        values
                            .iter()
                            .map(move |value| (name, value.as_str().as_bytes()))
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
        &self.payload
    }

    fn origin(&self) -> String {
        match self.info() {
            Ok(info) => format!("{}/{}", info.stream, info.consumer),
            Err(_) => self.subject.to_string(),
        }
    }

    #[cfg(feature = "otel")]
    const SYSTEM: &'static str = "nats";

    #[cfg(feature = "otel")]
    fn destination(&self) -> String {
        self.subject.to_string()
    }

    #[cfg(feature = "otel")]
    fn group(&self) -> Option<String> {
        self.info().ok().map(|info| info.consumer.to_owned())
    }

    #[cfg(feature = "otel")]
    fn headers_named(&self, names: &[String]) -> Vec<(String, String)> {
        let Some(headers) = self.headers.as_ref() else {
            return Vec::new();
        };
        headers
            .iter()
            .filter(|(name, _)| names.iter().any(|n| n.eq_ignore_ascii_case(name.as_ref())))
            .filter_map(|(name, values)| {
                let value = values.first()?;
                Some((name.to_string(), value.as_str().to_owned()))
            })
            .collect()
    }

    async fn in_progress(&self) -> Result<(), BrokerError> {
        self.ack_with(AckKind::Progress)
            .await
            .map_err(BrokerError::Settle)
    }

    async fn settle(
        &self,
        settlement: Settlement,
        retry_delay: Duration,
    ) -> Result<(), BrokerError> {
        let done = match settlement {
            Settlement::Ack => self.ack().await,
            Settlement::Retry => self.ack_with(AckKind::Nak(Some(retry_delay))).await,
            Settlement::DeadLetter => self.ack_with(AckKind::Term).await,
        };
        done.map_err(BrokerError::Settle)
    }
}

/// A NATS JetStream consumer runner over one pull consumer: the loop of
/// [`brokers::Consumer`](crate::brokers::Consumer), pulling batches of its
/// `in_flight` messages (set the consumer's `max_ack_pending` at least as
/// high). async-nats reconnects by itself: a missed heartbeat while it
/// does is logged and the stream goes on.
///
/// ```no_run
/// # async fn start() -> Result<(), Box<dyn std::error::Error>> {
/// use diesel_async::pooled_connection::deadpool::Pool;
/// use diesel_async::AsyncPgConnection;
/// use diesel_inbox::brokers::Policy;
/// use diesel_inbox::{idempotent, InboxError};
///
/// #[idempotent(key = "id")]
/// async fn ship(conn: &mut AsyncPgConnection, id: &str, body: &[u8]) -> Result<(), InboxError> {
///     let _ = (conn, body); // the business writes
///     Ok(())
/// }
///
/// # let (consumer, pool): (async_nats::jetstream::consumer::PullConsumer, Pool<AsyncPgConnection>) = todo!();
/// let report = diesel_inbox::nats::Consumer::new(consumer, Policy::new(|_: &InboxError| false))
///     .in_flight(8)
///     .run(
///         async |id: &str, body: &[u8]| {
///             let Ok(mut conn) = pool.get().await else {
///                 return Err(InboxError::InvalidArgument("no database connection"));
///             };
///             ship(&mut conn, id, body).await
///         },
///         async {
///             let _ = tokio::signal::ctrl_c().await;
///         },
///     )
///     .await?;
/// println!("{report:?}");
/// # Ok(())
/// # }
/// ```
pub type Consumer<E> = crate::brokers::Consumer<Pull, E>;

/// The pull consumer a [`Consumer`] reads.
pub struct Pull {
    consumer: async_nats::jetstream::consumer::PullConsumer,
}

impl std::fmt::Debug for Pull {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pull").finish_non_exhaustive()
    }
}

impl<E> crate::brokers::Consumer<Pull, E> {
    /// A runner for `consumer`, settling as `policy` says.
    pub fn new(consumer: async_nats::jetstream::consumer::PullConsumer, policy: Policy<E>) -> Self {
        crate::brokers::Consumer::with(Pull { consumer }, policy)
    }
}

impl crate::brokers::Sealed for Pull {}

/// The messages of a [`Pull`], as the runner reads them: a missed
/// heartbeat or a failed pull (the client reconnecting) is logged and
/// skipped; any other error of the stream ends the run.
#[doc(hidden)]
pub struct Messages {
    inner: std::pin::Pin<Box<async_nats::jetstream::consumer::pull::Stream>>,
    /// Whether the stream's durability was checked ([`check_stream`], at
    /// the first delivery).
    checked: bool,
}

impl futures_util::Stream for Messages {
    type Item = Result<Message, BrokerError>;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        use async_nats::jetstream::consumer::pull::MessagesErrorKind;
        use std::task::Poll;
        loop {
            let error = match self.inner.as_mut().poll_next(cx) {
                Poll::Ready(Some(Ok(message))) => {
                    if !self.checked {
                        self.checked = true;
                        if let Ok(info) = message.info() {
                            let stream = info.stream.to_owned();
                            tokio::spawn(check_stream(message.context.clone(), stream));
                        }
                    }
                    return Poll::Ready(Some(Ok(message)));
                }
                Poll::Ready(Some(Err(e))) => e,
                Poll::Ready(None) => return Poll::Ready(None),
                Poll::Pending => return Poll::Pending,
            };
            if !matches!(
                error.kind(),
                MessagesErrorKind::MissingHeartbeat | MessagesErrorKind::Pull
            ) {
                return Poll::Ready(Some(Err(BrokerError::Broker(error.into()))));
            }
            tracing::warn!(target: crate::TRACING_TARGET, error = %error, "diesel-inbox: the JetStream pull stream reported an error; going on");
        }
    }
}

impl crate::brokers::Source for Pull {
    type Message = Message;
    type Deliveries = Messages;

    fn name(&self) -> String {
        let info = self.consumer.cached_info();
        format!("{}/{}", info.stream_name, info.name)
    }

    async fn backlog(&mut self) -> Result<u64, BrokerError> {
        // Pending: not yet delivered; ack pending: delivered and not acked,
        // a `Nak(delay)`ed message waiting out its delay included.
        let info = self
            .consumer
            .get_info()
            .await
            .map_err(|e| BrokerError::Broker(e.into()))?;
        Ok(info.num_pending + info.num_ack_pending as u64)
    }

    async fn open(&mut self, prefetch: usize) -> Result<Messages, BrokerError> {
        let inner = self
            .consumer
            .stream()
            .max_messages_per_batch(prefetch)
            .messages()
            .await
            .map_err(|e| BrokerError::Broker(e.into()))?;
        Ok(Messages {
            inner: Box::pin(inner),
            checked: false,
        })
    }

    fn lease(&self) -> Option<Duration> {
        // Zero: the server's default, 30 s.
        let ack_wait = self.consumer.cached_info().config.ack_wait;
        Some(match ack_wait.is_zero() {
            true => Duration::from_secs(30),
            false => ack_wait,
        })
    }

    async fn stop(&mut self, _messages: &mut Messages) {
        // A pull consumer has nothing to cancel: no further pull is sent
        // once the runner stops reading.
    }

    fn can_reconnect(&self) -> bool {
        true
    }

    async fn reconnect(&mut self) -> Result<(), BrokerError> {
        // The client reconnects by itself; `open` pulls again.
        Ok(())
    }
}
