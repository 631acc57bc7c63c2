//! The outbox's operations: [`status`] and [`purge`] and their async
//! twins; the dead messages' are in [`dead`](super::dead).

#[cfg(feature = "async")]
use super::statements::short_transaction_async;
use super::statements::{counted, micros, unexpected};
#[cfg(feature = "async")]
use crate::backend::asynchronous::{AsAsyncConnection, AsyncInboxConnection};
use crate::backend::outbox::{Answer, Op, StatusRow, WalOp};
use crate::backend::transaction;
use crate::backend::{Internals, Statements};
use crate::error::InboxError;
use crate::ops::PurgeReport;
use crate::ops::{ops_error, short_transaction, PurgeLoop, PurgeStep};
use crate::transaction::InboxConnection;
use diesel::connection::LoadConnection;
use std::time::Duration;

/// What the outbox holds: see [`status`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct OutboxStatus {
    /// Messages due and not yet published (nor dead): waiting for the
    /// relay, or for a retry after a failed publish.
    pub pending: u64,
    /// Messages not yet due: delayed by
    /// [`deliver_after`](super::Outgoing::deliver_after) or
    /// [`deliver_at`](super::Outgoing::deliver_at).
    pub scheduled: u64,
    /// Dead messages ([`dead`](super::dead)).
    pub dead: u64,
    /// How long the oldest pending message has waited since it became
    /// due (its enqueue, its delivery time, or its replay by [`retry`](super::retry)), by
    /// the database's clock; `None` when nothing is pending.
    pub oldest_pending_age: Option<Duration>,
    /// How long until the next scheduled message is due; `None` when
    /// nothing is scheduled.
    pub next_scheduled_in: Option<Duration>,
    /// The same per destination, in name order.
    pub destinations: Vec<DestinationStatus>,
    /// The WAL outbox's slot (PostgreSQL, where
    /// [`wal::create`](super::wal::create) made one): its messages are not
    /// rows, so they are not counted above; how much WAL the slot keeps on
    /// the server says how far behind its relay is.
    pub wal: Option<WalSlotStatus>,
}

/// The WAL outbox's slot in an [`OutboxStatus`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct WalSlotStatus {
    /// The slot's name.
    pub slot: String,
    /// Whether a relay streams it now.
    pub active: bool,
    /// The WAL the server keeps for it (bytes): what a relay must read
    /// again after a crash, and disk the server cannot free while no relay
    /// confirms.
    pub retained_bytes: u64,
    /// The WAL written since the position its relay last confirmed
    /// (bytes): the business's writes too, not only messages.
    pub unconfirmed_bytes: u64,
    /// The server invalidated it (`max_slot_wal_keep_size`): the messages
    /// it held are lost, and enqueues to the WAL are refused until it is
    /// removed and created again.
    pub lost: bool,
}

/// Reads [`WalOp::SlotStatus`]'s texts (one slot per database).
pub(crate) fn wal_slot_of(texts: Vec<String>) -> Result<Option<WalSlotStatus>, InboxError> {
    let Some(text) = texts.into_iter().next() else {
        return Ok(None);
    };
    let parts: Vec<&str> = text.split(' ').collect();
    let number = |s: &str| s.parse::<i64>().ok().map(|n| n.max(0) as u64);
    match parts[..] {
        [slot, active, retained, unconfirmed, lost] => {
            let status = WalSlotStatus {
                slot: slot.to_owned(),
                active: active == "1",
                retained_bytes: number(retained).unwrap_or_default(),
                unconfirmed_bytes: number(unconfirmed).unwrap_or_default(),
                lost: lost == "1",
            };
            crate::telemetry::outbox_wal_slot(status.retained_bytes, status.unconfirmed_bytes);
            Ok(Some(status))
        }
        _ => Err(InboxError::Database(
            diesel::result::Error::DeserializationError(
                format!("the WAL outbox's slot status {text:?}").into(),
            ),
        )),
    }
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

/// The counts of `rows`, and the gauges set from them.
fn status_of(rows: Vec<StatusRow>) -> OutboxStatus {
    let status = counted_status(rows);
    crate::telemetry::outbox_status(
        status.pending,
        status.scheduled,
        status.dead,
        status.oldest_pending_age.unwrap_or_default(),
    );
    status
}

/// The counts of `rows` (one per destination).
pub(crate) fn counted_status(rows: Vec<StatusRow>) -> OutboxStatus {
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
    status
}

/// Pending, scheduled and dead messages, in all and per destination, the
/// age of the oldest pending one and when the next scheduled one is due.
/// With the `metrics` feature it also sets the gauges
/// `diesel_inbox.outbox.pending`, `diesel_inbox.outbox.scheduled`,
/// `diesel_inbox.outbox.dead` and
/// `diesel_inbox.outbox.oldest_pending_age` (seconds), and on PostgreSQL
/// with a WAL outbox slot `diesel_inbox.outbox.wal_retained_bytes` and
/// `diesel_inbox.outbox.wal_unconfirmed_bytes`; a relay calls it every few
/// seconds.
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
/// // The WAL outbox's slot: PostgreSQL's, where one was made.
/// assert_eq!(status.wal, None);
/// # Ok(())
/// # }
/// ```
pub fn status<C>(conn: &mut C) -> Result<OutboxStatus, InboxError>
where
    C: InboxConnection + LoadConnection,
{
    let mut status = match C::Backend::outbox(conn, Op::Status).map_err(ops_error::<C::Backend>)? {
        Answer::Status(rows) => status_of(rows),
        other => return Err(unexpected(other)),
    };
    if <C::Backend as Internals>::WAL {
        match C::Backend::outbox(conn, Op::Wal(WalOp::SlotStatus))
            .map_err(ops_error::<C::Backend>)?
        {
            Answer::Texts(texts) => status.wal = wal_slot_of(texts)?,
            other => return Err(unexpected(other)),
        }
    }
    Ok(status)
}

/// The async twin of [`status`].
#[cfg(feature = "async")]
pub async fn status_async<P, C, Via>(conn: &mut P) -> Result<OutboxStatus, InboxError>
where
    P: AsAsyncConnection<C, Via>,
    C: AsyncInboxConnection,
{
    let conn = conn.connection();
    let mut status = match conn.inbox_outbox(Op::Status).await {
        Ok(Answer::Status(rows)) => status_of(rows),
        Ok(other) => return Err(unexpected(other)),
        Err(e) => return Err(ops_error::<C::Backend>(e)),
    };
    if <C::Backend as Internals>::WAL {
        match conn.inbox_outbox(Op::Wal(WalOp::SlotStatus)).await {
            Ok(Answer::Texts(texts)) => status.wal = wal_slot_of(texts)?,
            Ok(other) => return Err(unexpected(other)),
            Err(e) => return Err(ops_error::<C::Backend>(e)),
        }
    }
    Ok(status)
}

/// Deletes the messages dead for longer than `older_than`, in batches of
/// `batch_size` (1 to 100,000), each in a short transaction of its own,
/// with the inbox purge's default duty cycle (a pause of 6 times each
/// batch's time, [`Purge::sleep_coef`](crate::Purge::sleep_coef)). Published messages need no purge: the relay deletes each row
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
