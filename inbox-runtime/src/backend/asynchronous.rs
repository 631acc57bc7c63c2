//! The async connections the inbox runs on: what each backend does on its
//! diesel-async connection, step by step (the statements of a call, of the
//! operations and of `migrate`'s lock). The sequences that use them live
//! once, above: the async driver and the operations.

use super::transaction::Scope;
use super::{Catalog, InboxBackend};
use crate::error::InboxError;
use crate::rows::{AttemptsRow, ConsumerStats, FailingRow, InboxEntry, StoredRow};
use diesel::result::{Error, QueryResult};
use diesel_async::AsyncConnection;
use std::future::Future;

/// A diesel-async connection the inbox runs on: `AsyncPgConnection`
/// (feature `postgres`), `AsyncMysqlConnection` (feature `mysql`) and
/// `SyncConnectionWrapper<SqliteConnection>` (feature `sqlite`; it takes
/// SQLite's write lock up front with `BEGIN IMMEDIATE`).
///
/// From a pool (deadpool, bb8, mobc through diesel-async's
/// `AsyncDieselConnectionManager`), declare the handler's connection as the
/// connection type and pass `&mut pooled` (deref coercion) or
/// `&mut *pooled`.
///
/// Its steps (a handler call's, the operations', `migrate`'s) are the
/// runtime's, on a crate-private supertrait: a user crate names this trait
/// in bounds but cannot call them.
///
/// ```
/// # #[cfg(feature = "sqlite")] {
/// use diesel::SqliteConnection;
/// use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
///
/// fn assert_supported<C: diesel_inbox::AsyncInboxConnection>() {}
/// assert_supported::<SyncConnectionWrapper<SqliteConnection>>();
/// # }
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not an async connection diesel-inbox can run an `async fn` handler on",
    label = "not a diesel-async connection of a supported backend",
    note = "an `async fn` handler takes `&mut AsyncPgConnection`, `&mut AsyncMysqlConnection` or `&mut SyncConnectionWrapper<SqliteConnection>` (diesel-async, feature `async`); a sync diesel connection (`PgConnection`, ...) goes with a sync `fn` handler"
)]
#[allow(private_bounds)] // the seal: `AsyncInternals` cannot be named, nor its steps called, outside
pub trait AsyncInboxConnection:
    AsyncConnection<Backend: InboxBackend> + Send + AsyncInternals
{
}

/// The steps of [`AsyncInboxConnection`], each backend's on its own async
/// connection (as `Internals` is to `InboxBackend`).
pub(crate) trait AsyncInternals:
    AsyncConnection<Backend: InboxBackend> + AsyncMigration + AsyncStatements + Send
{
    /// Opens a transaction, or a savepoint inside the caller's.
    fn inbox_begin(&mut self) -> impl Future<Output = Result<Scope, (Scope, Error)>> + Send;

    /// The single claim, with the content's fingerprint if given: `true`
    /// if the row was inserted.
    fn inbox_claim(
        &mut self,
        consumer: &str,
        key: &str,
        fingerprint: Option<&[u8]>,
    ) -> impl Future<Output = QueryResult<bool>> + Send;

    /// The replay's read ([`Internals::lookup`](super::Internals::lookup)),
    /// before any transaction.
    fn inbox_lookup(
        &mut self,
        consumer: &str,
        key: &str,
    ) -> impl Future<Output = QueryResult<Option<crate::rows::StoredRow>>> + Send;

    /// Opens the transaction and, if that worked, claims: where the backend
    /// can do both in one trip (SQLite: one hop to the blocking thread,
    /// during which the write lock is held), it does; by default one step
    /// after the other. The engine always claims right after a successful
    /// begin, so the driver hands it this claim's result.
    fn inbox_begin_claim(
        &mut self,
        consumer: &str,
        key: &str,
        fingerprint: Option<&[u8]>,
    ) -> impl Future<Output = BeginClaim> + Send {
        async move {
            let begun = self.inbox_begin().await;
            if begun.is_err() {
                return (begun, None);
            }
            let claimed = self.inbox_claim(consumer, key, fingerprint).await;
            (begun, Some(claimed))
        }
    }

    /// [`inbox_begin_claim`](Self::inbox_begin_claim) with the claim's
    /// wait for an in-flight claim of the same key bounded by `wait`
    /// (`Inbox::wait`): by the backend's
    /// [`wait_bound`](super::Internals::wait_bound) statements around the
    /// claim; SQLite bounds its `BEGIN IMMEDIATE` instead.
    fn inbox_begin_claim_waiting(
        &mut self,
        consumer: &str,
        key: &str,
        fingerprint: Option<&[u8]>,
        wait: std::time::Duration,
    ) -> impl Future<Output = BeginClaim> + Send {
        begin_claim_waiting(self, consumer, key, fingerprint, wait)
    }

    /// Opens the transaction and, if that worked, runs the batch claim
    /// ([`inbox_begin_claim`](Self::inbox_begin_claim) for a batch): by
    /// default one step after the other.
    fn inbox_begin_claim_batch(
        &mut self,
        consumer: &str,
        keys: &[&str],
        fingerprints: Option<&[&[u8]]>,
    ) -> impl Future<Output = BeginClaimBatch> + Send {
        async move {
            let begun = self.inbox_begin().await;
            if begun.is_err() {
                return (begun, None);
            }
            let claimed = self.inbox_claim_batch(consumer, keys, fingerprints).await;
            (begun, Some(claimed))
        }
    }

    /// The batch claim, with each key's fingerprint if given: the keys
    /// inserted.
    fn inbox_claim_batch(
        &mut self,
        consumer: &str,
        keys: &[&str],
        fingerprints: Option<&[&[u8]]>,
    ) -> impl Future<Output = QueryResult<Vec<String>>> + Send;

    /// Writes the body's value into the row just claimed and, at top
    /// level where the backend has a commit that requires the write
    /// (PostgreSQL), commits after it: the write's result, and the
    /// commit's if it was sent (the driver answers the engine's next
    /// `Commit` with it). By default the write alone.
    fn inbox_store_commit(
        &mut self,
        consumer: &str,
        key: &str,
        value: &[u8],
        scope: Scope,
    ) -> impl Future<Output = (QueryResult<()>, Option<QueryResult<()>>)> + Send {
        let _ = scope;
        async move { (self.inbox_store_result(consumer, key, value).await, None) }
    }

    /// Commits (through the backend's guarded commit at top level) or
    /// releases the savepoint; a failed top-level commit is rolled back.
    fn inbox_commit(&mut self, scope: Scope) -> impl Future<Output = QueryResult<()>> + Send;

    /// Rolls back the innermost transaction or savepoint, if one is open.
    fn inbox_rollback(&mut self) -> impl Future<Output = ()> + Send;

    /// Whether the backend notifies relays of enqueues
    /// ([`outbox_listen`](Self::outbox_listen)).
    const NOTIFIES: bool = false;

    /// Listens, on this connection (one the caller keeps for it alone),
    /// for the outbox's enqueue notifications and for `probe` (a channel
    /// name of lower-case letters, digits and `_`): `false` where the
    /// backend has no notifications (its relays poll).
    fn outbox_listen(&mut self, probe: &str) -> impl Future<Output = QueryResult<bool>> + Send {
        let _ = probe;
        std::future::ready(Ok(false))
    }

    /// Notifies `probe`, from a connection other than the listener's.
    fn outbox_notify(&mut self, probe: &str) -> impl Future<Output = QueryResult<()>> + Send {
        let _ = probe;
        std::future::ready(Ok(()))
    }

    /// The channel of the next notification on a listening connection;
    /// `None` once the connection is gone. Pending where the backend has
    /// no notifications.
    fn outbox_notified(&mut self) -> impl Future<Output = Option<QueryResult<String>>> + Send {
        std::future::pending()
    }

    /// On a listening connection, says that its relay sleeps: holds the
    /// lock that makes enqueues notify (if it does not hold it yet), then
    /// reads the transactions in progress. `Some((snapshot, settled))`:
    /// `settled` when none of them is still in progress (`snapshot` is
    /// for [`outbox_settled`](Self::outbox_settled)); `None` where the
    /// backend has no notifications or the lock is not free within its
    /// bound.
    fn outbox_asleep(
        &mut self,
        held: bool,
    ) -> impl Future<Output = QueryResult<Option<(String, bool)>>> + Send {
        let _ = held;
        std::future::ready(Ok(None))
    }

    /// Whether none of the transactions in progress at `snapshot` is
    /// still in progress.
    fn outbox_settled(&mut self, snapshot: &str) -> impl Future<Output = QueryResult<bool>> + Send {
        let _ = snapshot;
        std::future::ready(Ok(true))
    }

    /// On a listening connection, says that its relay is awake: gives the
    /// lock of [`outbox_asleep`](Self::outbox_asleep) back.
    fn outbox_awake(&mut self) -> impl Future<Output = QueryResult<()>> + Send {
        std::future::ready(Ok(()))
    }
}

/// The sync `Statements` on a diesel-async connection: one
/// blanket implementation for the connections whose transactions are
/// diesel-async's `AnsiTransactionManager` (PostgreSQL, MySQL/MariaDB),
/// its bounds stated per backend as the sync one's are (loads through
/// `LoadOnAsync`, boxed: rustc cannot prove a load's future `Send`
/// through lifetime-bound where-clauses, so it is proved once, there).
/// SQLite's async connection implements it by handing the sync
/// statements to its blocking thread.
pub(crate) trait AsyncStatements: AsyncConnection + Send {
    /// Runs one outbox operation.
    fn inbox_outbox(
        &mut self,
        op: super::outbox::Op,
    ) -> impl Future<Output = QueryResult<super::outbox::Answer>> + Send;
    /// The fingerprints and stored results of those of `keys` that have
    /// a row, in the claim's transaction.
    fn inbox_stored(
        &mut self,
        consumer: &str,
        keys: &[&str],
    ) -> impl Future<Output = QueryResult<Vec<StoredRow>>> + Send;
    /// Writes the body's value into the row just claimed.
    fn inbox_store_result(
        &mut self,
        consumer: &str,
        key: &str,
        value: &[u8],
    ) -> impl Future<Output = QueryResult<()>> + Send;
    /// The failure count of `(consumer, key)`.
    fn inbox_attempts(
        &mut self,
        consumer: &str,
        key: &str,
    ) -> impl Future<Output = QueryResult<Option<AttemptsRow>>> + Send;
    /// Deletes the failure count of `(consumer, key)`.
    fn inbox_clear_attempts(
        &mut self,
        consumer: &str,
        key: &str,
    ) -> impl Future<Output = QueryResult<usize>> + Send;
    /// Adds one failure to the count of `(consumer, key)`, in the
    /// caller's transaction.
    fn inbox_count_failure(
        &mut self,
        consumer: &str,
        key: &str,
        error: &str,
    ) -> impl Future<Output = QueryResult<()>> + Send;
    /// One purge batch's statements, in the caller's transaction.
    fn inbox_purge_batch(
        &mut self,
        cutoff: String,
        consumer: Option<String>,
        limit: i64,
    ) -> impl Future<Output = QueryResult<usize>> + Send;
    /// How many rows are older than `cutoff`.
    fn inbox_count_older(
        &mut self,
        cutoff: String,
        consumer: Option<String>,
    ) -> impl Future<Output = QueryResult<i64>> + Send;
    /// [`Statements::still_open`](super::execute::Statements::still_open).
    fn inbox_still_open(&mut self) -> impl Future<Output = QueryResult<Option<bool>>> + Send;
    /// The row of `(consumer, key)`.
    fn inbox_entry(
        &mut self,
        consumer: &str,
        key: &str,
    ) -> impl Future<Output = QueryResult<Option<InboxEntry>>> + Send;
    /// Deletes the row of `(consumer, key)` and its failure count.
    fn inbox_forget(
        &mut self,
        consumer: &str,
        key: &str,
    ) -> impl Future<Output = QueryResult<bool>> + Send;
    /// Rows, oldest and newest per consumer.
    fn inbox_stats(&mut self) -> impl Future<Output = QueryResult<Vec<ConsumerStats>>> + Send;
    /// Deletes the failure counts last updated before `cutoff`.
    fn inbox_purge_attempts(
        &mut self,
        cutoff: &str,
        consumer: Option<&str>,
    ) -> impl Future<Output = QueryResult<usize>> + Send;
    /// The failure counts of at least `min_failures`, the latest first.
    fn inbox_failing(
        &mut self,
        consumer: Option<&str>,
        min_failures: i32,
        limit: i64,
    ) -> impl Future<Output = QueryResult<Vec<FailingRow>>> + Send;
}

/// What the async operations take ([`migrate_async`](crate::migrate_async),
/// [`status_async`](crate::status_async), [`attempts_async`](crate::attempts_async),
/// [`forget_async`](crate::forget_async), [`stats_async`](crate::stats_async),
/// [`purge_async`](crate::purge_async), [`Purge::run_async`](crate::Purge::run_async)):
/// an [`AsyncInboxConnection`] itself, `&mut conn`, or a pooled one that
/// dereferences to it, `&mut pooled` (deadpool's `Object`, bb8's
/// `PooledConnection`, mobc's `Connection`), as handlers take both.
/// `Via` is inferred: you never name it.
///
/// ```
/// # #[cfg(feature = "sqlite")]
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use diesel::SqliteConnection;
/// use diesel_async::pooled_connection::deadpool::Pool;
/// use diesel_async::pooled_connection::AsyncDieselConnectionManager;
/// use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
///
/// type Conn = SyncConnectionWrapper<SqliteConnection>;
/// let manager = AsyncDieselConnectionManager::<Conn>::new(":memory:");
/// let pool = Pool::builder(manager).max_size(1).build()?;
/// let mut pooled = pool.get().await?;
/// diesel_inbox::migrate_async(&mut pooled).await?; // the pooled connection
/// diesel_inbox::migrate_async(&mut *pooled).await?; // the connection itself
/// assert!(diesel_inbox::status_async(&mut pooled, "billing", "m-1").await?.is_none());
/// # Ok(())
/// # }
/// # #[cfg(not(feature = "sqlite"))]
/// # fn main() {}
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` is neither an async connection diesel-inbox runs on nor a pooled one that dereferences to one",
    label = "not an async connection of a supported backend",
    note = "pass `&mut conn` for an `AsyncPgConnection`, `AsyncMysqlConnection` or `SyncConnectionWrapper<SqliteConnection>`, or `&mut pooled` for one from a pool (deadpool, bb8, mobc); a sync connection goes with the sync operations (`migrate`, `status`, ...)"
)]
pub trait AsAsyncConnection<C, Via>: Send {
    #[doc(hidden)]
    fn connection(&mut self) -> &mut C;
}

/// [`AsAsyncConnection`] for the connection itself.
#[doc(hidden)]
pub struct Itself;

/// [`AsAsyncConnection`] for what dereferences to a connection.
#[doc(hidden)]
pub struct ThroughDeref;

impl<C: AsyncInboxConnection> AsAsyncConnection<C, Itself> for C {
    fn connection(&mut self) -> &mut C {
        self
    }
}

impl<P, C> AsAsyncConnection<C, ThroughDeref> for P
where
    P: std::ops::DerefMut<Target = C> + Send,
    C: AsyncInboxConnection,
{
    fn connection(&mut self) -> &mut C {
        self
    }
}

/// [`AsyncInternals::inbox_begin_claim_waiting`] as a sequence of steps:
/// begin, the backend's bound, the claim, the connection's own bound back.
pub(crate) async fn begin_claim_waiting<C: AsyncInternals>(
    conn: &mut C,
    consumer: &str,
    key: &str,
    fingerprint: Option<&[u8]>,
    wait: std::time::Duration,
) -> BeginClaim {
    let Some(bound) = <C::Backend as super::Internals>::wait_bound(wait) else {
        return conn.inbox_begin_claim(consumer, key, fingerprint).await;
    };
    let begun = conn.inbox_begin().await;
    if begun.is_err() {
        return (begun, None);
    }
    if let Err(e) = conn.batch_execute(&bound.set).await {
        return (begun, Some(Err(e)));
    }
    (
        begun,
        Some(claim_bounded(conn, &bound, consumer, key, fingerprint).await),
    )
}

/// The claim under the wait bound `bound` set (and the transaction open),
/// then the caller's own setting restored.
pub(crate) async fn claim_bounded<C: AsyncInternals>(
    conn: &mut C,
    bound: &super::WaitBound,
    consumer: &str,
    key: &str,
    fingerprint: Option<&[u8]>,
) -> QueryResult<bool> {
    let claimed = conn.inbox_claim(consumer, key, fingerprint).await;
    let restored = match claimed.is_ok() || !bound.rollback_restores {
        true => conn.batch_execute(bound.restore).await,
        false => Ok(()),
    };
    // A claim that worked and a bound that stayed would bound the body's
    // own lock waits: the call fails instead.
    claimed.and_then(|claimed| restored.map(|()| claimed))
}

/// What [`AsyncInboxConnection::inbox_begin_claim`] did: the begin's
/// result, and the claim's if the begin worked.
#[doc(hidden)]
pub type BeginClaim = (Result<Scope, (Scope, Error)>, Option<QueryResult<bool>>);

/// What [`AsyncInternals::inbox_begin_claim_batch`] did: the begin's
/// result, and the batch claim's (the keys inserted) if the begin worked.
pub(crate) type BeginClaimBatch = (
    Result<Scope, (Scope, Error)>,
    Option<QueryResult<Vec<String>>>,
);

/// The steps of `migrate` a backend runs on its own async connection.
pub(crate) trait AsyncMigration: AsyncConnection<Backend: InboxBackend> + Send {
    /// What the catalog says about the table (the backend's catalog query).
    fn catalog(&mut self) -> impl Future<Output = QueryResult<Catalog>> + Send;
    /// Keeps other `migrate`s out until `unlock`.
    fn lock(&mut self) -> impl Future<Output = Result<Scope, InboxError>> + Send;
    /// Ends what `lock` began: keeps the changes when `keep`, else undoes
    /// what it can.
    fn unlock(
        &mut self,
        scope: Scope,
        keep: bool,
    ) -> impl Future<Output = Result<(), InboxError>> + Send;
}
