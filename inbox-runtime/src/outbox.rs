//! The transactional outbox: messages written in the same transaction as
//! the change they announce (and, in an `#[idempotent]` body, as the inbox
//! claim), published after the commit by a relay, at least once and with a
//! stable id.
//!
//! - [`enqueue`] / `enqueue_async` write an [`Outgoing`] message in the
//!   caller's transaction and return its id; outside a transaction they
//!   are refused ([`InboxError::NotInTransaction`]).
//! - The relay (`diesel_inbox::outbox::Relay`, features `lapin` / `nats`)
//!   publishes committed rows and deletes each once the broker confirmed
//!   it. A message that fails [`Relay::max_publish_attempts`] times becomes dead:
//!   kept, listed by [`dead`], replayed by [`retry`], deleted by [`purge`].
//! - [`status`] counts pending and dead messages per destination.
//!
//! ```
//! use diesel::prelude::*;
//! use diesel_inbox::outbox::{self, Outgoing};
//! use diesel_inbox::{idempotent, Processed};
//!
//! #[idempotent(key = "order_id")]
//! fn place(conn: &mut SqliteConnection, order_id: i64) -> QueryResult<String> {
//!     // ... the order's own rows ...
//!     let id = outbox::enqueue(
//!         conn,
//!         Outgoing::new("stock.reserve", format!("{{\"order\":{order_id}}}"))
//!             .ordering_key(&order_id)
//!             .header("content-type", "application/json"),
//!     )?;
//!     Ok(id)
//! }
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let mut conn = SqliteConnection::establish(":memory:")?;
//! diesel_inbox::migrate(&mut conn)?;
//! let Processed::Applied(id) = place(&mut conn, 7)? else { panic!() };
//! assert_eq!(id.len(), 36); // a UUIDv7
//! assert_eq!(place(&mut conn, 7)?, Processed::Duplicate); // nothing enqueued twice
//! assert_eq!(outbox::status(&mut conn)?.pending, 1);
//!
//! // Outside a transaction, an outbox row would be a plain publish.
//! let refused = outbox::enqueue(&mut conn, Outgoing::new("stock.reserve", "{}"));
//! assert!(matches!(refused, Err(diesel_inbox::InboxError::NotInTransaction { .. })));
//! # Ok(())
//! # }
//! ```
//!
//! [`Relay::max_publish_attempts`]: https://docs.rs/diesel-inbox/latest/diesel_inbox/outbox/struct.Relay.html#method.max_publish_attempts

#[cfg(feature = "async")]
use crate::backend::asynchronous::{AsAsyncConnection, AsyncInboxConnection};
#[cfg(feature = "async")]
use crate::backend::outbox::ClaimedRow;
use crate::backend::outbox::{Answer, DeadRow, NewRow, Op, StatusRow};
use crate::backend::transaction;
use crate::backend::{Internals, Statements};
use crate::error::InboxError;
use crate::key::{validate_key, InboxKey};
use crate::ops::PurgeReport;
use crate::ops::{ops_error, short_transaction, PurgeLoop, PurgeStep};
use crate::transaction::InboxConnection;
use diesel::connection::LoadConnection;
use diesel::result::Error;
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
    /// Until then [`status`] counts it as `scheduled`, not `pending`.
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
            notify: NOTIFY.load(std::sync::atomic::Ordering::Relaxed),
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
    C::Backend::outbox(conn, Op::Enqueue(row)).map_err(ops_error::<C::Backend>)?;
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
    conn.inbox_outbox(Op::Enqueue(row))
        .await
        .map_err(ops_error::<C::Backend>)?;
    crate::wake::enqueued();
    Ok(id)
}

/// Wakes the relays of this process: call it after committing a
/// transaction of your own that enqueued, so that they publish at once
/// rather than at their next poll. An `#[idempotent]` call that enqueued
/// does this itself after its commit.
pub fn wake() {
    crate::wake::wake();
}

/// What the outbox holds: see [`status`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct OutboxStatus {
    /// Messages due and not yet published (nor dead): waiting for the
    /// relay, or for a retry after a failed publish.
    pub pending: u64,
    /// Messages not yet due: delayed by
    /// [`deliver_after`](Outgoing::deliver_after) or
    /// [`deliver_at`](Outgoing::deliver_at).
    pub scheduled: u64,
    /// Dead messages ([`dead`]).
    pub dead: u64,
    /// How long the oldest pending message has waited since it became
    /// due (its enqueue, its delivery time, or its replay by [`retry`]), by
    /// the database's clock; `None` when nothing is pending.
    pub oldest_pending_age: Option<Duration>,
    /// How long until the next scheduled message is due; `None` when
    /// nothing is scheduled.
    pub next_scheduled_in: Option<Duration>,
    /// The same per destination, in name order.
    pub destinations: Vec<DestinationStatus>,
}

/// One destination's part of an [`OutboxStatus`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DestinationStatus {
    /// The destination (routing key or subject).
    pub destination: String,
    /// Pending messages.
    pub pending: u64,
    /// Scheduled messages (not yet due).
    pub scheduled: u64,
    /// Dead messages.
    pub dead: u64,
    /// The age of its oldest pending message.
    pub oldest_pending_age: Option<Duration>,
    /// How long until its next scheduled message is due.
    pub next_scheduled_in: Option<Duration>,
}

fn status_of(rows: Vec<StatusRow>) -> OutboxStatus {
    let mut status = OutboxStatus::default();
    for row in rows {
        let age = row.oldest_pending.map(|t| micros(row.now - t));
        let next = row.next_scheduled.map(|t| micros(t - row.now));
        status.pending += row.pending as u64;
        status.scheduled += row.scheduled as u64;
        status.dead += row.dead as u64;
        status.oldest_pending_age = status.oldest_pending_age.max(age);
        status.next_scheduled_in = match (status.next_scheduled_in, next) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        status.destinations.push(DestinationStatus {
            destination: row.destination,
            pending: row.pending as u64,
            scheduled: row.scheduled as u64,
            dead: row.dead as u64,
            oldest_pending_age: age,
            next_scheduled_in: next,
        });
    }
    crate::telemetry::outbox_status(
        status.pending,
        status.scheduled,
        status.dead,
        status.oldest_pending_age.unwrap_or_default(),
    );
    status
}

/// Pending, scheduled and dead messages, in all and per destination, the
/// age of the oldest pending one and when the next scheduled one is due.
/// With the `metrics` feature it also sets the gauges
/// `diesel_inbox.outbox.pending`, `diesel_inbox.outbox.scheduled`,
/// `diesel_inbox.outbox.dead` and
/// `diesel_inbox.outbox.oldest_pending_age` (seconds); a relay calls it
/// every few seconds.
///
/// ```
/// use diesel::prelude::*;
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let mut conn = SqliteConnection::establish(":memory:")?;
/// diesel_inbox::migrate(&mut conn)?;
/// let status = diesel_inbox::outbox::status(&mut conn)?;
/// assert_eq!((status.pending, status.scheduled, status.dead), (0, 0, 0));
/// assert_eq!((status.oldest_pending_age, status.next_scheduled_in), (None, None));
/// # Ok(())
/// # }
/// ```
pub fn status<C>(conn: &mut C) -> Result<OutboxStatus, InboxError>
where
    C: InboxConnection + LoadConnection,
{
    match C::Backend::outbox(conn, Op::Status).map_err(ops_error::<C::Backend>)? {
        Answer::Status(rows) => Ok(status_of(rows)),
        other => Err(unexpected(other)),
    }
}

/// The async twin of [`status`].
#[cfg(feature = "async")]
pub async fn status_async<P, C, Via>(conn: &mut P) -> Result<OutboxStatus, InboxError>
where
    P: AsAsyncConnection<C, Via>,
    C: AsyncInboxConnection,
{
    match conn.connection().inbox_outbox(Op::Status).await {
        Ok(Answer::Status(rows)) => Ok(status_of(rows)),
        Ok(other) => Err(unexpected(other)),
        Err(e) => Err(ops_error::<C::Backend>(e)),
    }
}

/// A dead message: it failed to publish as often as the relay's
/// `max_publish_attempts` allows. It stays until [`retry`] or [`purge`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeadMessage {
    /// The message id.
    pub id: String,
    /// The destination.
    pub destination: String,
    /// The ordering key, if any.
    pub ordering_key: Option<String>,
    /// Failed publishes.
    pub attempts: u32,
    /// The last failure's error.
    pub last_error: String,
    /// When it was enqueued.
    pub enqueued_at: SystemTime,
    /// When it became dead.
    pub dead_at: SystemTime,
}

fn dead_of(rows: Vec<DeadRow>) -> Vec<DeadMessage> {
    rows.into_iter()
        .map(|row| DeadMessage {
            id: row.id,
            destination: row.destination,
            ordering_key: row.ordering_key,
            attempts: row.attempts.max(0) as u32,
            last_error: row.last_error.unwrap_or_default(),
            enqueued_at: time(row.created_at),
            dead_at: time(row.dead_at),
        })
        .collect()
}

/// The dead messages, oldest first, at most `limit` (1 to 100,000).
///
/// ```
/// use diesel::prelude::*;
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let mut conn = SqliteConnection::establish(":memory:")?;
/// diesel_inbox::migrate(&mut conn)?;
/// assert!(diesel_inbox::outbox::dead(&mut conn, 100)?.is_empty());
/// # Ok(())
/// # }
/// ```
pub fn dead<C>(conn: &mut C, limit: usize) -> Result<Vec<DeadMessage>, InboxError>
where
    C: InboxConnection + LoadConnection,
{
    let limit = checked_limit(limit)?;
    match C::Backend::outbox(conn, Op::Dead { limit }).map_err(ops_error::<C::Backend>)? {
        Answer::Dead(rows) => Ok(dead_of(rows)),
        other => Err(unexpected(other)),
    }
}

/// The async twin of [`dead`].
#[cfg(feature = "async")]
pub async fn dead_async<P, C, Via>(
    conn: &mut P,
    limit: usize,
) -> Result<Vec<DeadMessage>, InboxError>
where
    P: AsAsyncConnection<C, Via>,
    C: AsyncInboxConnection,
{
    let limit = checked_limit(limit)?;
    match conn.connection().inbox_outbox(Op::Dead { limit }).await {
        Ok(Answer::Dead(rows)) => Ok(dead_of(rows)),
        Ok(other) => Err(unexpected(other)),
        Err(e) => Err(ops_error::<C::Backend>(e)),
    }
}

/// Every dead message, for [`retry`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AllDead;

/// What [`retry`] replays: one dead message by id (`&str`, `String`), or
/// [`AllDead`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RetryTarget {
    /// The dead message with this id.
    Id(String),
    /// Every dead message.
    AllDead,
}

impl From<&str> for RetryTarget {
    fn from(id: &str) -> Self {
        RetryTarget::Id(id.to_owned())
    }
}

impl From<String> for RetryTarget {
    fn from(id: String) -> Self {
        RetryTarget::Id(id)
    }
}

impl From<&String> for RetryTarget {
    fn from(id: &String) -> Self {
        RetryTarget::Id(id.clone())
    }
}

impl From<AllDead> for RetryTarget {
    fn from(_: AllDead) -> Self {
        RetryTarget::AllDead
    }
}

impl RetryTarget {
    fn op(self) -> Op {
        Op::Retry {
            id: match self {
                RetryTarget::Id(id) => Some(id),
                RetryTarget::AllDead => None,
            },
        }
    }
}

/// Makes dead messages pending again, with their attempts reset: one by
/// id, or [`AllDead`]. Returns how many. A replayed message is published
/// as soon as a relay finds it; a message of an ordering key that was
/// published past goes out after the later ones of its key.
///
/// ```
/// use diesel::prelude::*;
/// use diesel_inbox::outbox::{self, AllDead};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let mut conn = SqliteConnection::establish(":memory:")?;
/// diesel_inbox::migrate(&mut conn)?;
/// assert_eq!(outbox::retry(&mut conn, "no-such-id")?, 0);
/// assert_eq!(outbox::retry(&mut conn, AllDead)?, 0);
/// # Ok(())
/// # }
/// ```
pub fn retry<C>(conn: &mut C, which: impl Into<RetryTarget>) -> Result<u64, InboxError>
where
    C: InboxConnection + LoadConnection,
{
    let replayed = C::Backend::outbox(conn, which.into().op()).map_err(ops_error::<C::Backend>)?;
    crate::wake::wake();
    count_of(replayed)
}

/// The async twin of [`retry`].
#[cfg(feature = "async")]
pub async fn retry_async<P, C, Via>(
    conn: &mut P,
    which: impl Into<RetryTarget>,
) -> Result<u64, InboxError>
where
    P: AsAsyncConnection<C, Via>,
    C: AsyncInboxConnection,
{
    let replayed = conn
        .connection()
        .inbox_outbox(which.into().op())
        .await
        .map_err(ops_error::<C::Backend>)?;
    crate::wake::wake();
    count_of(replayed)
}

/// Deletes the messages dead for longer than `older_than`, in batches of
/// `batch_size` (1 to 100,000), each in a short transaction of its own,
/// with the inbox purge's duty cycle (a pause of
/// [`DEFAULT_SLEEP_COEF`](crate::DEFAULT_SLEEP_COEF) times each batch's
/// time). Published messages need no purge: the relay deletes each row
/// once the broker confirmed it. Refused inside a transaction.
///
/// ```
/// use diesel::prelude::*;
/// use std::time::Duration;
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let mut conn = SqliteConnection::establish(":memory:")?;
/// diesel_inbox::migrate(&mut conn)?;
/// let report = diesel_inbox::outbox::purge(&mut conn, Duration::from_secs(7 * 24 * 3600), 1_000)?;
/// assert_eq!(report.rows, 0);
/// # Ok(())
/// # }
/// ```
pub fn purge<C>(
    conn: &mut C,
    older_than: Duration,
    batch_size: usize,
) -> Result<PurgeReport, InboxError>
where
    C: InboxConnection + LoadConnection,
{
    let (older_than, limit) = purge_args(older_than, batch_size)?;
    if transaction::transaction_open(conn) {
        return Err(InboxError::InTransaction {
            operation: "outbox::purge",
        });
    }
    let mut purge = PurgeLoop::outbox(limit);
    loop {
        let batch = short_transaction(conn, |conn| {
            C::Backend::outbox(conn, Op::PurgeDead { older_than, limit }).and_then(counted)
        });
        match purge.next(batch, C::Backend::is_transient) {
            PurgeStep::Again => {}
            PurgeStep::Sleep(delay) => std::thread::sleep(delay),
            PurgeStep::Done(report) => return report.map_err(ops_error::<C::Backend>),
        }
    }
}

/// The async twin of [`purge`].
#[cfg(feature = "async")]
pub async fn purge_async<P, C, Via>(
    conn: &mut P,
    older_than: Duration,
    batch_size: usize,
) -> Result<PurgeReport, InboxError>
where
    P: AsAsyncConnection<C, Via>,
    C: AsyncInboxConnection,
{
    let conn = conn.connection();
    let (older_than, limit) = purge_args(older_than, batch_size)?;
    if transaction::transaction_open_async(conn) {
        return Err(InboxError::InTransaction {
            operation: "outbox::purge_async",
        });
    }
    let mut purge = PurgeLoop::outbox(limit);
    loop {
        let batch = short_transaction_async(conn, Op::PurgeDead { older_than, limit })
            .await
            .and_then(counted);
        match purge.next(batch, <C::Backend as Internals>::is_transient) {
            PurgeStep::Again => {}
            PurgeStep::Sleep(delay) => tokio::time::sleep(delay).await,
            PurgeStep::Done(report) => return report.map_err(ops_error::<C::Backend>),
        }
    }
}

fn purge_args(older_than: Duration, batch_size: usize) -> Result<(i64, i64), InboxError> {
    if older_than > Duration::from_secs(100 * 366 * 24 * 3600) {
        return Err(InboxError::InvalidArgument(
            "an outbox purge's older_than must be at most 100 years",
        ));
    }
    if batch_size == 0 || batch_size > crate::ops::MAX_PURGE_BATCH {
        return Err(InboxError::InvalidArgument(
            "the purge batch size must be between 1 and 100000",
        ));
    }
    Ok((older_than.as_micros() as i64, batch_size as i64))
}

/// A message a relay claimed, as its publisher sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct OutboxMessage {
    /// The message id: AMQP `message_id`, NATS `Nats-Msg-Id`.
    pub id: String,
    /// The routing key (RabbitMQ) or subject (NATS).
    pub destination: String,
    /// The ordering key, if any.
    pub ordering_key: Option<String>,
    /// The body.
    pub payload: Vec<u8>,
    /// The headers, in the order they were set.
    pub headers: Vec<(String, String)>,
    /// Failed publishes before this one.
    pub attempts: u32,
    /// When it was enqueued (the database's clock).
    pub enqueued_at: SystemTime,
}

#[cfg(feature = "async")]
/// What a relay's claim holds: the messages, and the lease under which
/// they are the relay's until it settles them.
#[doc(hidden)]
#[derive(Debug)]
pub struct Claim {
    token: String,
    seqs: Vec<i64>,
    created: Vec<i64>,
    /// The claimed messages, oldest first; at most one per ordering key.
    pub messages: Vec<OutboxMessage>,
}

#[cfg(feature = "async")]
impl Claim {
    fn of(token: String, rows: Vec<ClaimedRow>) -> Self {
        let mut claim = Claim {
            token,
            seqs: Vec::with_capacity(rows.len()),
            created: Vec::with_capacity(rows.len()),
            messages: Vec::with_capacity(rows.len()),
        };
        for row in rows {
            claim.seqs.push(row.seq);
            claim.created.push(row.created_at);
            claim.messages.push(OutboxMessage {
                id: row.id,
                destination: row.destination,
                ordering_key: row.ordering_key,
                payload: row.payload,
                headers: decode_headers(row.headers.as_deref()),
                attempts: row.attempts.max(0) as u32,
                enqueued_at: time(row.created_at),
            });
        }
        claim
    }
}

#[cfg(feature = "async")]
/// How one claimed message's publish ended.
#[doc(hidden)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PublishOutcome {
    /// The broker confirmed it: the row is deleted.
    Published,
    /// The broker refused this message (unroutable, no stream, too
    /// large): counted; due again after `retry_in`; dead at
    /// `max_publish_attempts`.
    Failed {
        error: String,
        retry_in: Duration,
        max_publish_attempts: u32,
    },
    /// Not published, through no fault of the message (the broker is
    /// down, the relay stops): given back uncounted.
    Released,
}

#[cfg(feature = "async")]
/// What settling a claim did.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Settled {
    pub published: u64,
    pub failed: u64,
    pub dead: u64,
    pub released: u64,
}

/// What a relay's [`step_async`] did: the settlements' counts, and the
/// next batch when it claimed one that is not empty.
#[doc(hidden)]
#[cfg(feature = "async")]
#[derive(Debug, Default)]
pub struct Stepped {
    pub settled: Settled,
    pub claim: Option<Claim>,
}

/// One step of a relay, in one short transaction: settles each
/// `(claim, outcomes)` of `settle` (`outcomes[i]` is how
/// `claim.messages[i]`'s publish ended; a row another relay took over
/// after the lease ran out is left to it), then, with `next = Some((limit,
/// lease))`, claims up to `limit` due messages, the oldest of each
/// ordering key that is not dead, skipping rows other relays hold (`FOR
/// UPDATE SKIP LOCKED`; SQLite's immediate transaction serializes claims),
/// each held for `lease`. The claim sees the settlements before it: a
/// published message lets its key's next one through.
///
/// Reports published, failed and dead messages to telemetry (the
/// commit-to-confirm latency of each published one, a WARN per dead one).
#[doc(hidden)]
#[cfg(feature = "async")]
pub async fn step_async<C: AsyncInboxConnection>(
    conn: &mut C,
    settle: &[(&Claim, &[PublishOutcome])],
    next: Option<(usize, Duration)>,
) -> Result<Stepped, InboxError> {
    let mut ops = Vec::new();
    let plans: Vec<SettlePlan> = settle
        .iter()
        .map(|(claim, outcomes)| SettlePlan::of(claim, outcomes, &mut ops))
        .collect();
    let token = next.map(|(limit, lease)| {
        let token = uuid_v7();
        ops.push(Op::Claim {
            limit: limit.clamp(1, 100_000) as i64,
            lease: lease.as_micros() as i64,
            token: token.clone(),
        });
        token
    });
    if ops.is_empty() {
        return Ok(Stepped::default());
    }
    let mut answers = relay_transaction(conn, ops)
        .await
        .map_err(ops_error::<C::Backend>)?
        .into_iter();
    let mut stepped = Stepped::default();
    for ((claim, _), plan) in settle.iter().zip(plans) {
        plan.read(claim, &mut answers, &mut stepped.settled)?;
    }
    if let Some(token) = token {
        match answers.next() {
            Some(Answer::Claimed(rows)) => {
                stepped.claim = (!rows.is_empty()).then(|| Claim::of(token, rows));
            }
            Some(other) => return Err(unexpected(other)),
            None => return Err(unexpected_end()),
        }
    }
    Ok(stepped)
}

/// The statements of one claim's settlement, and where their answers go.
#[cfg(feature = "async")]
struct SettlePlan {
    /// The failed messages' indexes, errors and attempt limits, one
    /// statement each.
    failed: Vec<(usize, String, u32)>,
    /// The published messages' indexes, one delete.
    published: Vec<usize>,
    /// Whether one update gives rows back.
    released: bool,
}

#[cfg(feature = "async")]
impl SettlePlan {
    /// Pushes the settlement's statements onto `ops`: the failures'
    /// counts, the published rows' delete, the given-back rows' release.
    fn of(claim: &Claim, outcomes: &[PublishOutcome], ops: &mut Vec<Op>) -> Self {
        let mut plan = SettlePlan {
            failed: Vec::new(),
            published: Vec::new(),
            released: false,
        };
        let mut released = Vec::new();
        for (i, outcome) in outcomes.iter().enumerate().take(claim.seqs.len()) {
            let seq = claim.seqs[i];
            match outcome {
                PublishOutcome::Published => plan.published.push(i),
                PublishOutcome::Released => released.push(seq),
                PublishOutcome::Failed {
                    error,
                    retry_in,
                    max_publish_attempts,
                } => {
                    plan.failed.push((i, error.clone(), *max_publish_attempts));
                    ops.push(Op::Failed {
                        token: claim.token.clone(),
                        seq,
                        error: error.clone(),
                        delay: retry_in.as_micros() as i64,
                        max_attempts: (*max_publish_attempts).min(i32::MAX as u32) as i32,
                    });
                }
            }
        }
        if !plan.published.is_empty() {
            ops.push(Op::Published {
                token: claim.token.clone(),
                seqs: plan.published.iter().map(|&i| claim.seqs[i]).collect(),
            });
        }
        if !released.is_empty() {
            plan.released = true;
            ops.push(Op::Released {
                token: claim.token.clone(),
                seqs: released,
            });
        }
        plan
    }

    /// Reads the settlement's answers off `answers`, in the order [`of`]
    /// pushed its statements, counts them into `settled` and reports them
    /// to telemetry.
    ///
    /// [`of`]: SettlePlan::of
    fn read(
        self,
        claim: &Claim,
        answers: &mut impl Iterator<Item = Answer>,
        settled: &mut Settled,
    ) -> Result<(), InboxError> {
        let (failed, dead) = (settled.failed, settled.dead);
        for (i, error, max_attempts) in self.failed {
            let updated = count_of(answers.next().ok_or_else(unexpected_end)?)?;
            let message = &claim.messages[i];
            if updated == 1 && message.attempts + 1 >= max_attempts {
                settled.dead += 1;
                tracing::warn!(
                    target: crate::telemetry::TARGET,
                    id = %message.id,
                    destination = %message.destination,
                    attempts = message.attempts + 1,
                    error = %error,
                    "diesel-inbox: outbox message is dead"
                );
            } else {
                settled.failed += updated;
            }
        }
        if !self.published.is_empty() {
            settled.published += count_of(answers.next().ok_or_else(unexpected_end)?)?;
            let now = now_micros();
            let latencies: Vec<Duration> = self
                .published
                .iter()
                .map(|&i| micros(now - claim.created[i]))
                .collect();
            crate::telemetry::outbox_published(&latencies);
        }
        if self.released {
            settled.released += count_of(answers.next().ok_or_else(unexpected_end)?)?;
        }
        crate::telemetry::outbox_failed(settled.failed - failed, settled.dead - dead);
        Ok(())
    }
}

#[cfg(feature = "async")]
fn unexpected_end() -> InboxError {
    InboxError::Database(Error::QueryBuilderError(
        "an outbox settlement returned fewer answers than statements".into(),
    ))
}

/// Whether enqueues notify the relays of other processes at commit.
static NOTIFY: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

/// Whether an enqueue wakes the relays of **other processes** at its
/// transaction's commit (default: on). On PostgreSQL the enqueue then
/// notifies the channel `diesel_inbox_outbox` (once per transaction
/// however many messages it enqueued: the server folds equal
/// notifications), and a running [`Relay`] listens on a connection of its
/// own and claims at once instead of at its next poll. MySQL/MariaDB and
/// SQLite have no notifications: their relays poll, and this changes
/// nothing.
///
/// `NOTIFY` takes a lock at commit that serializes the committing
/// transactions that notified; turn it off when no relay runs in another
/// process and the commit rate is high (docs/performance.md has the
/// figures). The relays of the enqueuing process wake at the commit either
/// way. It applies to the enqueues that follow, in the whole process.
///
/// ```
/// diesel_inbox::outbox::set_notify(false);
/// # diesel_inbox::outbox::set_notify(true);
/// ```
///
/// [`Relay`]: https://docs.rs/diesel-inbox/latest/diesel_inbox/outbox/struct.Relay.html
pub fn set_notify(on: bool) {
    NOTIFY.store(on, std::sync::atomic::Ordering::Relaxed);
}

/// How a relay hears of the enqueues of other processes
/// ([`listen_async`]).
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listening {
    /// At each commit that enqueued (PostgreSQL's `LISTEN`).
    Notified,
    /// The backend has no notifications: the relay polls.
    Polls,
    /// The backend has them, but a notification sent to this connection
    /// did not arrive within the wait: a connection proxy in transaction
    /// mode (PgBouncer's `pool_mode = transaction`) keeps no session for
    /// `LISTEN`. The relay polls.
    Unreachable,
}

/// Listens on `listener`, a connection kept for it alone, for the
/// enqueues of every process, and checks that it hears: it notifies a
/// probe channel of its own through `notifier` (another connection, as an
/// enqueue's would be) and waits up to `wait` for it on `listener`. An
/// enqueue's notification that arrives meanwhile wakes the relays.
#[cfg(feature = "async")]
#[doc(hidden)]
pub async fn listen_async<C: AsyncInboxConnection>(
    listener: &mut C,
    notifier: &mut C,
    wait: Duration,
) -> Result<Listening, InboxError> {
    static PROBES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let probe = format!(
        "diesel_inbox_probe_{}_{}",
        std::process::id(),
        PROBES.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    );
    if !listener.outbox_listen(&probe).await? {
        return Ok(Listening::Polls);
    }
    notifier.outbox_notify(&probe).await?;
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        match tokio::time::timeout_at(deadline, listener.outbox_notified()).await {
            Err(_) => return Ok(Listening::Unreachable),
            Ok(None) => return Err(listener_gone()),
            Ok(Some(Err(e))) => return Err(e.into()),
            Ok(Some(Ok(channel))) if channel == probe => return Ok(Listening::Notified),
            Ok(Some(Ok(_))) => crate::wake::wake(),
        }
    }
}

/// Whether relays on `C` can hear enqueues ([`listen_async`]) rather
/// than only poll.
#[cfg(feature = "async")]
#[doc(hidden)]
pub fn notifies<C: AsyncInboxConnection>() -> bool {
    <C as crate::backend::asynchronous::AsyncInternals>::NOTIFIES
}

/// Waits on a connection [`listen_async`] made listen for the next
/// notification, and wakes the relays of this process. An error once the
/// connection is gone.
#[cfg(feature = "async")]
#[doc(hidden)]
pub async fn notified_async<C: AsyncInboxConnection>(listener: &mut C) -> Result<(), InboxError> {
    match listener.outbox_notified().await {
        None => Err(listener_gone()),
        Some(Err(e)) => Err(e.into()),
        Some(Ok(_)) => {
            crate::wake::wake();
            Ok(())
        }
    }
}

#[cfg(feature = "async")]
fn listener_gone() -> InboxError {
    InboxError::Database(Error::DatabaseError(
        diesel::result::DatabaseErrorKind::ClosedConnection,
        Box::new("the relay's listening connection closed".to_string()),
    ))
}

/// The wake-ups so far: [`woken`] waits for the next.
#[doc(hidden)]
pub fn wake_generation() -> u64 {
    crate::wake::generation()
}

/// Resolves at the first [`wake`] after [`wake_generation`] returned
/// `seen`.
#[doc(hidden)]
pub fn woken(seen: u64) -> impl std::future::Future<Output = ()> + Send {
    crate::wake::Woken { seen }
}

/// One short transaction of an [`Op`] on an async connection: the
/// backend's isolation for short batches, its `BEGIN`, the operation,
/// `COMMIT` (a failure rolls back).
#[cfg(feature = "async")]
async fn short_transaction_async<C: AsyncInboxConnection>(
    conn: &mut C,
    op: Op,
) -> diesel::QueryResult<Answer> {
    let mut answers = transaction_of(conn, vec![op], None).await?;
    answers
        .pop()
        .ok_or_else(|| Error::QueryBuilderError("an outbox statement returned nothing".into()))
}

/// A relay's claim or settlement: [`short_transaction_async`] of `ops`,
/// with the backend's setting for the relay's transactions
/// (the backend's `RELAY_SETUP`).
#[cfg(feature = "async")]
async fn relay_transaction<C: AsyncInboxConnection>(
    conn: &mut C,
    ops: Vec<Op>,
) -> diesel::QueryResult<Vec<Answer>> {
    transaction_of(conn, ops, <C::Backend as Internals>::RELAY_SETUP).await
}

#[cfg(feature = "async")]
async fn transaction_of<C: AsyncInboxConnection>(
    conn: &mut C,
    ops: Vec<Op>,
    setup: Option<&str>,
) -> diesel::QueryResult<Vec<Answer>> {
    if let Some(isolation) = <C::Backend as Internals>::PURGE_ISOLATION {
        diesel_async::SimpleAsyncConnection::batch_execute(conn, isolation).await?;
    }
    conn.inbox_begin().await.map_err(|(_, e)| e)?;
    let mut answers = Vec::with_capacity(ops.len());
    let mut failed = match setup {
        Some(sql) => diesel_async::SimpleAsyncConnection::batch_execute(conn, sql)
            .await
            .err(),
        None => None,
    };
    for op in ops {
        if failed.is_some() {
            break;
        }
        match conn.inbox_outbox(op).await {
            Ok(answer) => answers.push(answer),
            Err(e) => failed = Some(e),
        }
    }
    match failed {
        None => conn
            .inbox_commit(crate::backend::transaction::Scope::TopLevel)
            .await
            .map(|()| answers),
        Some(e) => {
            conn.inbox_rollback().await;
            Err(e)
        }
    }
}

fn counted(answer: Answer) -> diesel::QueryResult<usize> {
    match answer {
        Answer::Count(n) => Ok(n),
        other => Err(mismatch(other)),
    }
}

fn count_of(answer: Answer) -> Result<u64, InboxError> {
    counted(answer)
        .map(|n| n as u64)
        .map_err(InboxError::Database)
}

fn unexpected(answer: Answer) -> InboxError {
    InboxError::Database(mismatch(answer))
}

/// An answer of another kind than the operation's (a bug, not a state).
fn mismatch(answer: Answer) -> Error {
    Error::QueryBuilderError(format!("an outbox statement returned {answer:?}").into())
}

fn checked_limit(limit: usize) -> Result<i64, InboxError> {
    match limit {
        1..=100_000 => Ok(limit as i64),
        _ => Err(InboxError::InvalidArgument(
            "the limit must be between 1 and 100000",
        )),
    }
}

fn micros(us: i64) -> Duration {
    Duration::from_micros(us.max(0) as u64)
}

fn time(us: i64) -> SystemTime {
    UNIX_EPOCH + micros(us)
}

#[cfg(feature = "async")]
fn now_micros() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or_default()
}

/// Headers as stored: each name and value as a 4-byte little-endian length
/// and its UTF-8 bytes; `None` without headers.
fn encode_headers(headers: &[(String, String)]) -> Option<Vec<u8>> {
    if headers.is_empty() {
        return None;
    }
    let mut out = Vec::new();
    for (name, value) in headers {
        for part in [name, value] {
            out.extend_from_slice(&(part.len() as u32).to_le_bytes());
            out.extend_from_slice(part.as_bytes());
        }
    }
    Some(out)
}

#[cfg(feature = "async")]
fn decode_headers(bytes: Option<&[u8]>) -> Vec<(String, String)> {
    let mut rest = bytes.unwrap_or_default();
    let mut take = || -> Option<String> {
        let len = u32::from_le_bytes(rest.get(..4)?.try_into().ok()?) as usize;
        let text = String::from_utf8_lossy(rest.get(4..4 + len)?).into_owned();
        rest = &rest[4 + len..];
        Some(text)
    };
    let mut headers = Vec::new();
    while let (Some(name), Some(value)) = (take(), take()) {
        headers.push((name, value));
    }
    headers
}

/// A new UUIDv7 (RFC 9562) in its text form: 48 bits of Unix milliseconds,
/// then 74 random bits (SipHash of a process-wide counter and the clock,
/// keyed at random per process), so ids sort by creation time.
pub(crate) fn uuid_v7() -> String {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::OnceLock;
    static KEYS: OnceLock<std::collections::hash_map::RandomState> = OnceLock::new();
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let keys = KEYS.get_or_init(std::collections::hash_map::RandomState::new);
    let random = |salt: u64| {
        let mut hasher = keys.build_hasher();
        hasher.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
        hasher.write_u128(since.as_nanos());
        hasher.write_u64(salt);
        hasher.finish()
    };
    let (a, b) = (random(1), random(2));
    let ms = since.as_millis() as u64 & 0xFFFF_FFFF_FFFF;
    let hi = (ms << 16) | 0x7000 | (a & 0x0FFF);
    let lo = (b & 0x3FFF_FFFF_FFFF_FFFF) | 0x8000_0000_0000_0000;
    format!(
        "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        hi >> 32,
        (hi >> 16) & 0xFFFF,
        hi & 0xFFFF,
        lo >> 48,
        lo & 0xFFFF_FFFF_FFFF
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuid_v7_has_its_version_and_variant_and_sorts_by_time() {
        let first = uuid_v7();
        std::thread::sleep(Duration::from_millis(2));
        let second = uuid_v7();
        assert_eq!(first.len(), 36);
        assert_eq!(&first[14..15], "7");
        assert!(matches!(&first[19..20], "8" | "9" | "a" | "b"), "{first}");
        assert!(first < second, "{first} {second}");
        let many: std::collections::HashSet<String> = (0..10_000).map(|_| uuid_v7()).collect();
        assert_eq!(many.len(), 10_000);
    }

    #[test]
    #[cfg(feature = "async")]
    fn headers_round_trip() {
        let headers = vec![
            ("content-type".to_owned(), "application/json".to_owned()),
            ("x-empty".to_owned(), String::new()),
        ];
        assert_eq!(decode_headers(encode_headers(&headers).as_deref()), headers);
        assert_eq!(encode_headers(&[]), None);
        assert!(decode_headers(None).is_empty());
    }
}
