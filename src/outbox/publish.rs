//! What a [`Relay`](super::Relay) publishes through: a broker of the
//! relay's ([`Publish`]), and how a publish failed ([`PublishError`]).

use inbox_runtime::outbox::OutboxMessage;
use std::future::Future;

/// A broker a [`Relay`](super::Relay) publishes to: `outbox::lapin::Publisher`
/// (RabbitMQ), `outbox::nats::Publisher` (NATS JetStream), or one of
/// your own.
///
/// `publish` sends every message of a batch and waits for the broker's
/// confirm of each: the result at `i` is that of `messages[i]`. A
/// message counts as published only once the broker confirmed it.
///
/// A publisher of your own needs only the feature `relay` (no broker
/// client) and a backend. This one records what it gets; a webhook or a
/// Kafka producer would send it, and answer `Unavailable` while its
/// endpoint is down:
///
/// ```
/// # #[cfg(feature = "sqlite")]
/// # mod example {
/// use diesel::prelude::*;
/// use diesel_async::pooled_connection::deadpool::Pool;
/// use diesel_async::pooled_connection::AsyncDieselConnectionManager;
/// use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
/// use diesel_inbox::outbox::{self, OutboxMessage, Outgoing, Publish, PublishError, Relay};
/// use std::sync::Mutex;
///
/// /// Every message it was given: (destination, payload).
/// #[derive(Default)]
/// pub struct Recorder(pub Mutex<Vec<(String, Vec<u8>)>>);
///
/// impl Publish for Recorder {
///     async fn publish(&self, messages: &[OutboxMessage]) -> Vec<Result<(), PublishError>> {
///         let mut sent = self.0.lock().expect("not poisoned");
///         messages
///             .iter()
///             .map(|m| {
///                 sent.push((m.destination.clone(), m.payload.clone()));
///                 Ok(())
///             })
///             .collect()
///     }
/// }
///
/// pub async fn relay_once() -> Result<(), Box<dyn std::error::Error>> {
///     type Conn = SyncConnectionWrapper<SqliteConnection>;
///     let file = std::env::temp_dir().join(format!("relay-doc-{}.db", std::process::id()));
///     let url = file.to_string_lossy().into_owned();
///     let pool: Pool<Conn> = Pool::builder(AsyncDieselConnectionManager::new(url.clone())).build()?;
///     {
///         let mut conn = SqliteConnection::establish(&url)?;
///         diesel_inbox::migrate(&mut conn)?;
///         conn.transaction(|conn| outbox::enqueue(conn, Outgoing::new("stock.reserve", "7")))?;
///     }
///     let relay = Relay::new(pool, Recorder::default());
///     let report = relay.run_once().await?;
///     assert_eq!(report.published, 1);
///     let _ = std::fs::remove_file(&file);
///     Ok(())
/// }
/// # }
/// # #[cfg(feature = "sqlite")]
/// # #[tokio::main]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> { example::relay_once().await }
/// # #[cfg(not(feature = "sqlite"))]
/// # fn main() {}
/// ```
pub trait Publish: Send + Sync {
    /// Publishes `messages`, one result per message, in order.
    fn publish<'a>(
        &'a self,
        messages: &'a [OutboxMessage],
    ) -> impl Future<Output = Vec<Result<(), PublishError>>> + Send + 'a;

    /// The broker, as the OpenTelemetry messaging conventions name it
    /// (`messaging.system`: `rabbitmq`, `nats`, `kafka`, ...) on the
    /// relay's producer spans (feature `otel`). `None` (the default)
    /// leaves the attribute out.
    fn messaging_system(&self) -> Option<&str> {
        None
    }

    /// Where a message for `destination` goes, as the messaging
    /// conventions name it on the relay's producer spans (feature
    /// `otel`): `messaging.destination.name` and RabbitMQ's routing key.
    /// By default `destination` itself and no routing key; RabbitMQ's
    /// publisher says its exchange and `destination` as the routing key,
    /// as its consumers' spans do.
    fn messaging_route<'a>(&'a self, destination: &'a str) -> (&'a str, Option<&'a str>) {
        (destination, None)
    }
}

/// Why a message was not published. Each variant keeps the error that
/// caused it as its [`source`](std::error::Error::source) (and says it in
/// its text, as sqlx's and lapin's errors do); build one from an error or
/// a message with [`refused`](Self::refused),
/// [`unavailable`](Self::unavailable) or [`closed`](Self::closed).
///
/// ```
/// use diesel_inbox::outbox::PublishError;
/// use std::error::Error;
///
/// let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "connection refused");
/// let e = PublishError::unavailable(io);
/// assert_eq!(e.to_string(), "the broker is unavailable: connection refused");
/// assert_eq!(e.source().unwrap().to_string(), "connection refused");
/// assert!(matches!(PublishError::refused("422 from the webhook"), PublishError::Refused(_)));
/// ```
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum PublishError {
    /// The broker refused this message (unroutable, no stream for the
    /// subject, too large, nacked): counted against the relay's
    /// `max_publish_attempts`, retried with backoff, then dead.
    #[error("the broker refused the message: {0}")]
    Refused(#[source] ErrorSource),
    /// The broker could not be reached or did not confirm in time: the
    /// message is given back uncounted and the relay backs off. An outage
    /// never makes a message dead.
    #[error("the broker is unavailable: {0}")]
    Unavailable(#[source] ErrorSource),
    /// The publisher cannot publish again (its channel closed and it
    /// cannot open another): the relay stops with [`RelayError::Publisher`](super::RelayError::Publisher).
    #[error("the publisher cannot publish any more: {0}")]
    Closed(#[source] ErrorSource),
}

/// The cause a [`PublishError`] keeps: shared, so that one failure can
/// stand for every message of a batch.
pub type ErrorSource = std::sync::Arc<dyn std::error::Error + Send + Sync + 'static>;

impl PublishError {
    /// [`PublishError::Refused`], from an error or a message.
    pub fn refused(cause: impl Into<Box<dyn std::error::Error + Send + Sync + 'static>>) -> Self {
        PublishError::Refused(cause.into().into())
    }

    /// [`PublishError::Unavailable`], from an error or a message.
    pub fn unavailable(
        cause: impl Into<Box<dyn std::error::Error + Send + Sync + 'static>>,
    ) -> Self {
        PublishError::Unavailable(cause.into().into())
    }

    /// [`PublishError::Closed`], from an error or a message.
    pub fn closed(cause: impl Into<Box<dyn std::error::Error + Send + Sync + 'static>>) -> Self {
        PublishError::Closed(cause.into().into())
    }
}
