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

use crate::brokers::{usable_id, BrokerError, Handled, Inbound, Policy, Settlement};
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
    E: std::fmt::Debug,
    F: AsyncFnOnce(&str, &[u8]) -> Result<O, E>,
{
    crate::brokers::handle(message, policy, handler).await
}

impl Inbound for Message {
    fn message_id(&self) -> Result<String, BrokerError> {
        message_id(self)
    }

    fn deliveries(&self) -> u32 {
        deliveries(self)
    }

    fn body(&self) -> &[u8] {
        &self.payload
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
        done.map_err(|e| BrokerError::Settle(e.to_string()))
    }
}
