//! Wake-ups across processes: PostgreSQL's `LISTEN`/`NOTIFY` on the
//! channel `diesel_inbox_outbox`, and the switch that turns the enqueue's
//! notification off.
//!
//! An enqueue notifies only while a relay sleeps. `NOTIFY` takes a lock
//! at commit that serializes the committing transactions that notified
//! (their WAL flushes one after another); a relay that is awake finds the
//! rows anyway. The protocol:
//! - A relay going to sleep ([`asleep_async`]) takes an advisory lock,
//!   shared, on its listening connection (keyed by the outbox table), then
//!   reads the ids of the transactions in progress (by a statement of
//!   its own), then passes once more, and sleeps until a notification (or its
//!   poll) only once none of them is still in progress ([`settled_async`];
//!   until then it passes again after a short wait). Woken, it gives the
//!   lock back ([`awake_async`]).
//! - An enqueue takes its transaction's id, then tries the same lock
//!   exclusively and gives it back in the same expression: it notifies
//!   when the try fails (a relay sleeps).
//! - So an enqueue that did not notify probed before the relay held the
//!   lock; its id was taken before that, so the relay's list has it
//!   (or it had ended: its rows are visible). The relay sleeps only after
//!   that transaction ended, and its last pass came after: the row is
//!   published, not left to the poll. A relay's lost connection gives the
//!   lock back (the enqueues stop notifying; the relay is woken when it
//!   listens again, as before); a relay behind a proxy that keeps no
//!   session never holds it (it polls).

#[cfg(feature = "async")]
use crate::backend::asynchronous::AsyncInboxConnection;
#[cfg(feature = "async")]
use crate::error::InboxError;
#[cfg(feature = "async")]
use diesel::result::Error;
#[cfg(feature = "async")]
use std::time::Duration;

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

/// Whether enqueues notify ([`set_notify`]).
pub(super) fn enqueue_notifies() -> bool {
    NOTIFY.load(std::sync::atomic::Ordering::Relaxed)
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
/// enqueue's notification that arrives meanwhile is passed over: the
/// caller wakes its relays once it listens.
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
            // An enqueue's: the caller wakes its relays once this returns
            // `Notified` (for everything enqueued while it opened).
            Ok(Some(Ok(_))) => {}
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
/// notification (the caller wakes whom it concerns: every relay of the
/// process, or one tenant's). An error once the connection is gone.
#[cfg(feature = "async")]
#[doc(hidden)]
pub async fn notified_async<C: AsyncInboxConnection>(listener: &mut C) -> Result<(), InboxError> {
    match listener.outbox_notified().await {
        None => Err(listener_gone()),
        Some(Err(e)) => Err(e.into()),
        Some(Ok(_)) => Ok(()),
    }
}

/// On a connection [`listen_async`] made listen: its relay goes to sleep
/// (the module's protocol). `Some(settled)`: the enqueues notify from now
/// on, and the relay may sleep until a notification once `settled` (else
/// it passes again after a short wait and asks [`settled_async`] with the
/// snapshot, which it keeps in `snapshot`); `None`: the relay polls (no
/// notifications here, or the lock was not free within its bound).
/// `held`: the lock is held already (by an earlier call without
/// [`awake_async`] since).
#[cfg(feature = "async")]
#[doc(hidden)]
pub async fn asleep_async<C: AsyncInboxConnection>(
    listener: &mut C,
    held: bool,
    snapshot: &mut String,
) -> Result<Option<bool>, InboxError> {
    Ok(listener.outbox_asleep(held).await?.map(|(taken, settled)| {
        *snapshot = taken;
        settled
    }))
}

/// Whether none of the transactions in progress at `snapshot` (of
/// [`asleep_async`]) still is.
#[cfg(feature = "async")]
#[doc(hidden)]
pub async fn settled_async<C: AsyncInboxConnection>(
    listener: &mut C,
    snapshot: &str,
) -> Result<bool, InboxError> {
    Ok(listener.outbox_settled(snapshot).await?)
}

/// The relay of `listener` is awake: enqueues need not notify for it.
#[cfg(feature = "async")]
#[doc(hidden)]
pub async fn awake_async<C: AsyncInboxConnection>(listener: &mut C) -> Result<(), InboxError> {
    Ok(listener.outbox_awake().await?)
}

#[cfg(feature = "async")]
fn listener_gone() -> InboxError {
    InboxError::Database(Error::DatabaseError(
        diesel::result::DatabaseErrorKind::ClosedConnection,
        Box::new("the relay's listening connection closed".to_string()),
    ))
}
