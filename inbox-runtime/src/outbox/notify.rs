//! Wake-ups across processes: PostgreSQL's `LISTEN`/`NOTIFY` on the
//! channel `diesel_inbox_outbox`, and the switch that turns the enqueue's
//! notification off.

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
