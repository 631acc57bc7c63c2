//! What a transaction enqueues: [`Outgoing`], and [`enqueue`] /
//! [`enqueue_async`] that write it in the caller's transaction.

use super::headers::encode_headers;
use super::id::uuid_v7;
#[cfg(feature = "async")]
use crate::backend::asynchronous::{AsAsyncConnection, AsyncInboxConnection};
use crate::backend::outbox::{Answer, NewRow, Op};
use crate::backend::transaction;
use crate::backend::Internals;
use crate::backend::Statements;
use crate::error::InboxError;
use crate::key::{validate_key, InboxKey};
use crate::ops::ops_error;
use crate::transaction::InboxConnection;
use diesel::connection::LoadConnection;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A message to publish after the commit: a destination (the routing key
/// on the relay's exchange for RabbitMQ, the subject for NATS), a payload,
/// and optionally an ordering key, headers and an id of your own.
///
/// ```
/// use diesel_inbox::outbox::Outgoing;
///
/// let message = Outgoing::new("stock.reserve", b"{}".to_vec())
///     .ordering_key("customer-42")
///     .header("content-type", "application/json")
///     .id("reserve-order-7");
/// assert_eq!(message.destination(), "stock.reserve");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outgoing {
    destination: String,
    payload: Vec<u8>,
    ordering_key: Option<String>,
    headers: Vec<(String, String)>,
    id: Option<String>,
    deliver: Deliver,
}

/// When a message may be published.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Deliver {
    /// After the commit.
    Now,
    /// This long after the enqueuing transaction's time, by the
    /// database's clock.
    After(Duration),
    /// At this time, by the database's clock.
    At(SystemTime),
}

/// The longest delay (and the latest time) a message may have: its time
/// in microseconds stays far from `i64`'s end, so the database's `now +
/// delay` never overflows.
const LATEST_MICROS: u128 = (i64::MAX / 4) as u128;

impl Outgoing {
    /// A message to `destination` with `payload`.
    pub fn new(destination: impl Into<String>, payload: impl Into<Vec<u8>>) -> Self {
        Outgoing {
            destination: destination.into(),
            payload: payload.into(),
            ordering_key: None,
            headers: Vec::new(),
            id: None,
            deliver: Deliver::Now,
        }
    }

    /// The ordering key: messages with the same key are published in
    /// enqueue order, one at a time; a failed one holds back the later
    /// ones of its key until it is published or dead. Messages without a
    /// key have no order. (Not the inbox's deduplication key: that is the
    /// message [`id`](Self::id).)
    pub fn ordering_key<K: InboxKey + ?Sized>(mut self, key: &K) -> Self {
        self.ordering_key = Some(key.inbox_key().into_owned());
        self
    }

    /// A header, copied to the AMQP message's headers or the NATS
    /// message's headers. Names are unique: a second value replaces the
    /// first.
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        let (name, value) = (name.into(), value.into());
        self.headers.retain(|(have, _)| *have != name);
        self.headers.push((name, value));
        self
    }

    /// The message id the broker and the consumers see (AMQP `message_id`,
    /// NATS `Nats-Msg-Id`). The default is a new UUIDv7 in its text form.
    /// An id of a message not yet published is refused (a unique
    /// violation, the transaction fails). An id reused after its message
    /// was published is not caught here: a consumer deduplicating on it
    /// reports the new message `Duplicate` (a fingerprint on the consumer
    /// turns that into `KeyReused`). Derive ids from what makes the message
    /// unique, e.g. the order it announces.
    pub fn id(mut self, id: impl Into<String>) -> Self {
        self.id = Some(id.into());
        self
    }

    /// Publishes the message no earlier than `delay` after the enqueuing
    /// transaction's time, by the database's clock (not the
    /// application's). The relay finds it at its first poll after that
    /// (within [`Relay::poll_interval`](https://docs.rs/diesel-inbox/latest/diesel_inbox/outbox/struct.Relay.html#method.poll_interval), 1 s by default).
    /// Until then [`status`](super::status) counts it as `scheduled`, not `pending`.
    ///
    /// **Order.** A delayed message keeps its place in the order of its
    /// [`ordering_key`](Self::ordering_key): the later messages of that
    /// key wait for it, as they wait for a message being retried. Give a
    /// delayed message no ordering key (or one of its own) when the
    /// others should not wait.
    ///
    /// A delay of more than about 73,000 years is refused at enqueue
    /// ([`InboxError::InvalidOutgoing`]). The last of `deliver_after` and
    /// [`deliver_at`](Self::deliver_at) counts.
    ///
    /// ```
    /// use diesel_inbox::outbox::Outgoing;
    /// use std::time::Duration;
    ///
    /// let reminder = Outgoing::new("cart.reminder", b"{}".to_vec())
    ///     .deliver_after(Duration::from_secs(600));
    /// # let _ = reminder;
    /// ```
    pub fn deliver_after(mut self, delay: Duration) -> Self {
        self.deliver = Deliver::After(delay);
        self
    }

    /// Publishes the message no earlier than `time`, by the database's
    /// clock; a time already past publishes it at once. Otherwise as
    /// [`deliver_after`](Self::deliver_after) (the order of its key, the
    /// status). A time before 1970 or after about 73,000 years from then is
    /// refused at enqueue.
    ///
    /// ```
    /// use diesel_inbox::outbox::Outgoing;
    /// use std::time::{Duration, SystemTime};
    ///
    /// let at = SystemTime::now() + Duration::from_secs(3600);
    /// let invoice = Outgoing::new("invoice.send", b"{}".to_vec()).deliver_at(at);
    /// # let _ = invoice;
    /// ```
    pub fn deliver_at(mut self, time: SystemTime) -> Self {
        self.deliver = Deliver::At(time);
        self
    }

    /// Where it goes.
    pub fn destination(&self) -> &str {
        &self.destination
    }

    /// The row to insert, checked; its id.
    #[cfg_attr(not(feature = "otel"), allow(unused_mut))]
    fn row(mut self) -> Result<NewRow, InboxError> {
        #[cfg(feature = "otel")]
        crate::otel::capture(&mut self.headers);
        let invalid = |what: &str, why: crate::key::InvalidKey| {
            InboxError::InvalidOutgoing(format!("its {what}: {why}").into())
        };
        validate_key(&self.destination).map_err(|e| invalid("destination", e))?;
        if let Some(key) = &self.ordering_key {
            validate_key(key).map_err(|e| invalid("ordering key", e))?;
        }
        let id = match self.id {
            Some(id) => {
                validate_key(&id).map_err(|e| invalid("id", e))?;
                id
            }
            None => uuid_v7(),
        };
        for (name, value) in &self.headers {
            let bad = |c: char| c.is_control() || c == ':';
            if name.is_empty() || name.chars().any(bad) {
                return Err(InboxError::InvalidOutgoing(
                    format!("header name {name:?} is empty or has a control character or ':'")
                        .into(),
                ));
            }
            if value.chars().any(|c| c == '\r' || c == '\n' || c == '\0') {
                return Err(InboxError::InvalidOutgoing(
                    format!("the value of header {name:?} has a line break or NUL").into(),
                ));
            }
        }
        let too_late = |what: String| {
            InboxError::InvalidOutgoing(
                format!("{what} is too far in the future (at most about 73,000 years)").into(),
            )
        };
        let (after, at) = match self.deliver {
            Deliver::Now => (0, None),
            Deliver::After(delay) => match delay.as_micros() {
                micros if micros <= LATEST_MICROS => (micros as i64, None),
                _ => return Err(too_late(format!("its delay {delay:?}"))),
            },
            Deliver::At(time) => match time.duration_since(UNIX_EPOCH) {
                Err(_) => {
                    return Err(InboxError::InvalidOutgoing(
                        format!("its delivery time {time:?} is before 1970").into(),
                    ))
                }
                Ok(since) if since.as_micros() <= LATEST_MICROS => {
                    (0, Some(since.as_micros() as i64))
                }
                Ok(_) => return Err(too_late(format!("its delivery time {time:?}"))),
            },
        };
        Ok(NewRow {
            id,
            destination: self.destination,
            key: self.ordering_key,
            payload: self.payload,
            headers: encode_headers(&self.headers),
            after,
            at,
            notify: super::notify::enqueue_notifies(),
        })
    }
}

/// Writes `message` into the outbox in the caller's transaction and
/// returns its id. The message is published after the commit; a rollback
/// takes it back. Outside a transaction it is refused
/// ([`InboxError::NotInTransaction`]). See the module's example.
pub fn enqueue<C>(conn: &mut C, message: Outgoing) -> Result<String, InboxError>
where
    C: InboxConnection + LoadConnection,
{
    if !transaction::transaction_open(conn) {
        return Err(InboxError::NotInTransaction {
            operation: "outbox::enqueue",
        });
    }
    let row = message.row()?;
    let id = row.id.clone();
    let op = op_of::<C::Backend>(row)?;
    let wal = matches!(op, Op::Emit { .. });
    let answer = C::Backend::outbox(conn, op).map_err(|e| {
        crate::observe::remember_refusal_of(conn.instrumentation(), &e);
        ops_error::<C::Backend>(e)
    })?;
    written(wal, answer)?;
    crate::wake::enqueued();
    Ok(id)
}

/// The async twin of [`enqueue`], on the connection of an `async fn`
/// handler (or of your own transaction).
///
/// ```
/// # #[cfg(feature = "sqlite")]
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use diesel::SqliteConnection;
/// use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
/// use diesel_async::AsyncConnection;
/// use diesel_inbox::outbox::{self, Outgoing};
/// use diesel_inbox::{idempotent, Processed};
///
/// #[idempotent(key = "order_id")]
/// async fn place(
///     conn: &mut SyncConnectionWrapper<SqliteConnection>,
///     order_id: i64,
/// ) -> diesel::QueryResult<()> {
///     outbox::enqueue_async(conn, Outgoing::new("stock.reserve", "{}").ordering_key(&order_id)).await?;
///     Ok(())
/// }
///
/// let mut conn = SyncConnectionWrapper::<SqliteConnection>::establish(":memory:").await?;
/// diesel_inbox::migrate_async(&mut conn).await?;
/// assert_eq!(place(&mut conn, 7).await?, Processed::Applied(()));
/// assert_eq!(outbox::status_async(&mut conn).await?.pending, 1);
/// # Ok(())
/// # }
/// # #[cfg(not(feature = "sqlite"))]
/// # fn main() {}
/// ```
#[cfg(feature = "async")]
pub async fn enqueue_async<P, C, Via>(conn: &mut P, message: Outgoing) -> Result<String, InboxError>
where
    P: AsAsyncConnection<C, Via>,
    C: AsyncInboxConnection,
{
    let conn = conn.connection();
    if !transaction::transaction_open_async(conn) {
        return Err(InboxError::NotInTransaction {
            operation: "outbox::enqueue_async",
        });
    }
    let row = message.row()?;
    let id = row.id.clone();
    let op = op_of::<C::Backend>(row)?;
    let wal = matches!(op, Op::Emit { .. });
    let answer = conn.inbox_outbox(op).await.map_err(|e| {
        crate::observe::remember_refusal_of(conn.instrumentation(), &e);
        ops_error::<C::Backend>(e)
    })?;
    written(wal, answer)?;
    crate::wake::enqueued();
    Ok(id)
}

/// The enqueue of `row`: into the table, or (with the WAL outbox on, on a
/// backend that has it) into the WAL.
fn op_of<B: Internals>(row: NewRow) -> Result<Op, InboxError> {
    if !(B::WAL && super::wal::enqueue_to_wal()) {
        return Ok(Op::Enqueue(row));
    }
    Ok(Op::Emit {
        record: super::wal::record(&row)?,
        notify: row.notify,
    })
}

/// Checks what the enqueue answered: the WAL's emit writes nothing
/// (`Count(0)`) where the database has no usable slot.
fn written(wal: bool, answer: Answer) -> Result<(), InboxError> {
    match answer {
        Answer::Count(0) if wal => Err(InboxError::NoWalOutbox(
            "this database has no usable WAL outbox slot (create it with \
             diesel_inbox::outbox::wal::create; a slot the server invalidated must be \
             dropped and created again), so nothing would publish the message; nothing was \
             written"
                .into(),
        )),
        _ => Ok(()),
    }
}

/// Wakes the relays of this process: call it after committing a
/// transaction of your own that enqueued, so that they publish at once
/// rather than at their next poll. An `#[idempotent]` call that enqueued
/// does this itself after its commit.
pub fn wake() {
    crate::wake::wake();
}
