//! The async driver: performs the steps the [engine](crate::engine) asks
//! for on a diesel-async connection, with the same decisions as the sync
//! driver (the engine is shared; each backend's module supplies its async
//! statements next to its sync ones).

use crate::backend::InboxBackend;
use crate::claim::{single_key, BatchPlan, One, Read, StoredRow};
use crate::engine::{Claimed, Ended, Engine, Event, Next, Scope, Step};
use crate::error::InboxError;
use crate::key::InboxKey;
use crate::observe;
use crate::options::{describe_panic, encoder, Options, SingleOutcome};
use crate::processed::Batch;
use crate::registry::ConsumerName;
use crate::retry::ErrorClass;
use diesel::result::{Error, QueryResult};
use diesel_async::AsyncConnection;
use std::future::Future;
use std::panic::{self, AssertUnwindSafe};
use std::task::Poll;
use tracing::Instrument;

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
/// The methods are the backend's steps of a handler call; they are not a
/// stable API.
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
pub trait AsyncInboxConnection:
    AsyncConnection<Backend: InboxBackend> + Send + crate::backend::Sealed
{
    /// Opens a transaction, or a savepoint inside the caller's.
    #[doc(hidden)]
    fn inbox_begin(&mut self) -> impl Future<Output = Result<Scope, (Scope, Error)>> + Send;

    /// The single claim, with the content's fingerprint if given: `true`
    /// if the row was inserted.
    #[doc(hidden)]
    fn inbox_claim(
        &mut self,
        consumer: &str,
        key: &str,
        fingerprint: Option<&[u8]>,
    ) -> impl Future<Output = QueryResult<bool>> + Send;

    /// Opens the transaction and, if that worked, claims: where the backend
    /// can do both in one trip (SQLite: one hop to the blocking thread,
    /// during which the write lock is held), it does; by default one step
    /// after the other. The engine always claims right after a successful
    /// begin, so the driver hands it this claim's result.
    #[doc(hidden)]
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

    /// The batch claim, with each key's fingerprint if given: the keys
    /// inserted.
    #[doc(hidden)]
    fn inbox_claim_batch(
        &mut self,
        consumer: &str,
        keys: &[&str],
        fingerprints: Option<&[&[u8]]>,
    ) -> impl Future<Output = QueryResult<Vec<String>>> + Send;

    /// The fingerprints and stored results of those of `keys` that have a
    /// row, in the claim's transaction.
    #[doc(hidden)]
    fn inbox_stored(
        &mut self,
        consumer: &str,
        keys: &[&str],
    ) -> impl Future<Output = QueryResult<Vec<StoredRow>>> + Send;

    /// The failure count of `(consumer, key)`.
    #[doc(hidden)]
    fn inbox_attempts(
        &mut self,
        consumer: &str,
        key: &str,
    ) -> impl Future<Output = QueryResult<Option<crate::claim::AttemptsRow>>> + Send;

    /// Deletes the failure count of `(consumer, key)`.
    #[doc(hidden)]
    fn inbox_clear_attempts(
        &mut self,
        consumer: &str,
        key: &str,
    ) -> impl Future<Output = QueryResult<usize>> + Send;

    /// Adds one failure to the count of `(consumer, key)`: in a short
    /// transaction of its own at top level, in the caller's inside one.
    #[doc(hidden)]
    fn inbox_count_failure(
        &mut self,
        scope: Scope,
        consumer: &str,
        key: &str,
        error: &str,
    ) -> impl Future<Output = QueryResult<()>> + Send;

    /// Writes the body's value into the row just claimed.
    #[doc(hidden)]
    fn inbox_store_result(
        &mut self,
        consumer: &str,
        key: &str,
        value: &[u8],
    ) -> impl Future<Output = QueryResult<()>> + Send;

    /// Commits (through the backend's guarded commit at top level) or
    /// releases the savepoint; a failed top-level commit is rolled back.
    #[doc(hidden)]
    fn inbox_commit(&mut self, scope: Scope) -> impl Future<Output = QueryResult<()>> + Send;

    /// Rolls back the innermost transaction or savepoint, if one is open.
    #[doc(hidden)]
    fn inbox_rollback(&mut self) -> impl Future<Output = ()> + Send;

    /// [`migrate`](crate::migrate) on this connection.
    #[doc(hidden)]
    fn inbox_migrate(&mut self) -> impl Future<Output = Result<(), InboxError>> + Send;

    /// One purge batch in a short transaction of its own: the rows deleted.
    #[doc(hidden)]
    fn inbox_purge_batch(
        &mut self,
        cutoff: String,
        consumer: Option<String>,
        limit: i64,
    ) -> impl Future<Output = QueryResult<usize>> + Send;

    /// How many rows are older than `cutoff`.
    #[doc(hidden)]
    fn inbox_count_older(
        &mut self,
        cutoff: String,
        consumer: Option<String>,
    ) -> impl Future<Output = QueryResult<i64>> + Send;

    /// The row of `(consumer, key)`.
    #[doc(hidden)]
    fn inbox_entry(
        &mut self,
        consumer: &str,
        key: &str,
    ) -> impl Future<Output = QueryResult<Option<crate::InboxEntry>>> + Send;

    /// Deletes the row of `(consumer, key)`; whether there was one.
    #[doc(hidden)]
    fn inbox_forget(
        &mut self,
        consumer: &str,
        key: &str,
    ) -> impl Future<Output = QueryResult<bool>> + Send;

    /// Rows, oldest and newest per consumer.
    #[doc(hidden)]
    fn inbox_stats(
        &mut self,
    ) -> impl Future<Output = QueryResult<Vec<crate::ConsumerStats>>> + Send;
}

/// What [`AsyncInboxConnection::inbox_begin_claim`] did: the begin's
/// result, and the claim's if the begin worked.
#[doc(hidden)]
pub type BeginClaim = (Result<Scope, (Scope, Error)>, Option<QueryResult<bool>>);

/// An `async` body: `async |conn| { .. }`.
///
/// Implemented for every async closure over `&mut C`; it exists to name the
/// closure's future, so that the runtime can require it to be `Send` (this
/// is how diesel-async's own `transaction` bounds its callback). A body that
/// may run again on a retry is also `Clone`: each attempt runs a copy (a
/// closure that borrows its captures, the default for `async |..|`, is).
pub trait AsyncBody<C, R>:
    AsyncFnOnce(C) -> R + FnOnce(C) -> <Self as AsyncBody<C, R>>::Fut
{
    /// The future of one run of the body.
    type Fut: Future<Output = R>;
}

impl<F, C, R, Fut> AsyncBody<C, R> for F
where
    F: AsyncFnOnce(C) -> R + FnOnce(C) -> Fut,
    Fut: Future<Output = R>,
{
    type Fut = Fut;
}

/// An `async` body of a batch handler: `async |conn, messages| { .. }`.
pub trait AsyncBatchBody<C, M, R>:
    AsyncFnOnce(C, M) -> R + FnOnce(C, M) -> <Self as AsyncBatchBody<C, M, R>>::Fut
{
    /// The future of one run of the body.
    type Fut: Future<Output = R>;
}

impl<F, C, M, R, Fut> AsyncBatchBody<C, M, R> for F
where
    F: AsyncFnOnce(C, M) -> R + FnOnce(C, M) -> Fut,
    Fut: Future<Output = R>,
{
    type Fut = Fut;
}

/// A single call (what [`Inbox::run_async`](crate::Inbox::run_async) and
/// `run_once_async` run); `next_body` gives the body of each attempt (a
/// copy, or the one body of a call without retries), `describe` how a
/// counted failure reads (`None`: failures are not counted).
#[allow(clippy::too_many_arguments)]
pub(crate) async fn run_one<C, N, K, T, E, F, R, O>(
    conn: &mut C,
    consumer: &N,
    key: &K,
    options: &Options,
    retries: u32,
    next_body: impl FnMut() -> F + Send,
    classify: R,
    describe: Option<fn(&E) -> String>,
) -> Result<O, E>
where
    O: SingleOutcome<T>,
    C: AsyncInboxConnection,
    N: ConsumerName + ?Sized,
    K: InboxKey + ?Sized,
    for<'c> F: AsyncBody<&'c mut C, Result<T, E>, Fut: Send> + Send,
    T: Send,
    E: From<InboxError> + From<Error> + Send,
    R: Fn(&E) -> ErrorClass<E> + Send,
{
    let consumer = consumer.consumer_name()?;
    let key = single_key(key)?;
    let one = options.one::<T, O>(consumer, &key)?;
    let engine = Engine::new(consumer, &key, retries, classify)
        .storing(encoder::<T, O>())
        .counting(one.max_attempts.and(describe));
    let span = engine.span().clone();
    let ended = drive_one(conn, engine, &one, next_body)
        .instrument(span)
        .await?;
    Ok(O::outcome(consumer, &key, ended)?)
}

/// A batch call (what [`Inbox::run_batch_async`](crate::Inbox::run_batch_async)
/// runs): one transaction and one multi-row claim for the plan's keys; the
/// body gets the messages claimed for the first time.
pub(crate) async fn run_batch<C, M, T, E, F, R>(
    conn: &mut C,
    consumer: &str,
    messages: &[M],
    plan: &BatchPlan,
    retries: u32,
    body: F,
    classify: R,
) -> Result<Batch<T>, E>
where
    C: AsyncInboxConnection,
    M: Sync,
    for<'c, 'm> F: AsyncBatchBody<&'c mut C, Vec<&'m M>, Result<T, E>, Fut: Send> + Clone + Send,
    T: Send,
    E: From<InboxError> + From<Error> + Send,
    R: Fn(&E) -> ErrorClass<E> + Send,
{
    let what = plan.describe();
    let mut engine: Engine<'_, C::Backend, T, E, R> =
        Engine::new(consumer, &what, retries, classify);
    let claim = Claim::Many(consumer, plan);
    let mut positions = Vec::new();
    let mut step = Step::Begin;
    let span = engine.span().clone();
    let ended = async {
        loop {
            let event = match step {
                Step::Body => {
                    let fresh: Vec<&M> = positions.iter().map(|&i| &messages[i]).collect();
                    let body = body.clone();
                    run_body(conn, async move |conn| body(conn, fresh).await, None).await
                }
                other => perform(conn, other, &claim, &mut positions).await,
            };
            step = match engine.next(event) {
                Next::Do(step) => step,
                Next::Done(result) => break result,
            };
        }
    }
    .instrument(span)
    .await?;
    Ok(plan.outcome(ended, positions))
}

/// The async twin of [`migrate`](crate::migrate): creates, verifies,
/// versions and upgrades the inbox table, with the same errors.
///
/// ```
/// # #[cfg(feature = "sqlite")]
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use diesel::SqliteConnection;
/// use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
/// use diesel_async::{AsyncConnection, TransactionManager};
///
/// let mut conn = SyncConnectionWrapper::<SqliteConnection>::establish(":memory:").await?;
/// diesel_inbox::migrate_async(&mut conn).await?;
/// diesel_inbox::migrate_async(&mut conn).await?; // idempotent
/// # Ok(())
/// # }
/// # #[cfg(not(feature = "sqlite"))]
/// # fn main() {}
/// ```
pub async fn migrate_async<C>(conn: &mut C) -> Result<(), InboxError>
where
    C: AsyncInboxConnection,
{
    conn.inbox_migrate().await
}

/// Whether diesel-async has a transaction open on `conn`.
pub(crate) fn transaction_open<C: AsyncConnection>(conn: &mut C) -> bool {
    use diesel_async::TransactionManager;
    matches!(
        C::TransactionManager::transaction_manager_status_mut(conn).transaction_depth(),
        Ok(Some(_))
    )
}

/// What one call claims.
enum Claim<'a> {
    One(&'a One<'a>),
    Many(&'a str, &'a BatchPlan),
}

/// Performs the engine's steps for a single message until the call is
/// done; `next_body` gives the body of each attempt (a copy, or the one
/// body of a call without retries).
async fn drive_one<C, T, E, F, R>(
    conn: &mut C,
    mut engine: Engine<'_, C::Backend, T, E, R>,
    one: &One<'_>,
    mut next_body: impl FnMut() -> F,
) -> Result<Ended<T>, E>
where
    C: AsyncInboxConnection,
    for<'c> F: AsyncBody<&'c mut C, Result<T, E>, Fut: Send>,
    E: From<InboxError> + From<Error>,
    R: Fn(&E) -> ErrorClass<E>,
{
    let claim = Claim::One(one);
    let mut positions = Vec::new();
    // The claim done together with the begin, for the engine's next step.
    let mut claimed = None;
    let mut step = Step::Begin;
    loop {
        let event = match step {
            Step::Body => {
                let counted = engine.counted_scope().map(|scope| (scope, one));
                run_body(conn, next_body(), counted).await
            }
            Step::Begin => {
                let (begun, inserted) = conn
                    .inbox_begin_claim(one.consumer, one.key, one.fingerprint())
                    .await;
                claimed = inserted;
                Event::Begun(begun)
            }
            Step::Claim if claimed.is_some() => {
                let inserted = claimed.take().expect("checked");
                Event::Claimed(judge_one(conn, one, inserted).await)
            }
            other => perform(conn, other, &claim, &mut positions).await,
        };
        step = match engine.next(event) {
            Next::Do(step) => step,
            Next::Done(result) => return result,
        };
    }
}

/// The verdict of a single claim that `inserted` (or not): a duplicate's
/// row is read when the call checks a fingerprint or wants a stored result.
async fn judge_one<C: AsyncInboxConnection>(
    conn: &mut C,
    one: &One<'_>,
    inserted: QueryResult<bool>,
) -> Result<Claimed, Error> {
    Ok(match one.next_read(inserted?) {
        Read::Done(claimed) => claimed,
        Read::Stored => one.duplicate(conn.inbox_stored(one.consumer, &[one.key]).await?),
        Read::Attempts => {
            let row = conn.inbox_attempts(one.consumer, one.key).await?;
            let (claimed, clear) = one.attempted(row);
            if clear {
                conn.inbox_clear_attempts(one.consumer, one.key).await?;
            }
            claimed
        }
    })
}

/// Performs a step other than the body; a batch's claim records the input
/// positions claimed for the first time in `positions`.
async fn perform<C, T, E>(
    conn: &mut C,
    step: Step,
    claim: &Claim<'_>,
    positions: &mut Vec<usize>,
) -> Event<T, E>
where
    C: AsyncInboxConnection,
{
    match step {
        Step::Begin => Event::Begun(conn.inbox_begin().await),
        Step::Claim => Event::Claimed(match claim {
            Claim::One(one) => {
                let inserted = conn
                    .inbox_claim(one.consumer, one.key, one.fingerprint())
                    .await;
                judge_one(conn, one, inserted).await
            }
            Claim::Many(consumer, plan) => claim_many(conn, consumer, plan, positions).await,
        }),
        Step::Store(value) => Event::Stored(match claim {
            Claim::One(one) => conn.inbox_store_result(one.consumer, one.key, &value).await,
            Claim::Many(..) => unreachable!("a batch stores no result"),
        }),
        Step::Count(scope, error) => {
            match claim {
                Claim::One(one) => crate::transaction::counted(
                    conn.inbox_count_failure(scope, one.consumer, one.key, &error)
                        .await,
                ),
                Claim::Many(..) => unreachable!("a batch counts no failures"),
            }
            Event::Counted
        }
        Step::Commit(scope) => Event::Committed(conn.inbox_commit(scope).await),
        Step::Rollback => {
            conn.inbox_rollback().await;
            Event::RolledBack
        }
        Step::Sleep(delay) => {
            tokio::time::sleep(delay).await;
            Event::Slept
        }
        Step::Body => unreachable!("the driver runs the body itself"),
    }
}

/// The batch claim: the distinct keys (with their fingerprints), then the
/// rows of the duplicates when the batch checks fingerprints.
async fn claim_many<C: AsyncInboxConnection>(
    conn: &mut C,
    consumer: &str,
    plan: &BatchPlan,
    positions: &mut Vec<usize>,
) -> Result<Claimed, Error> {
    let fingerprints = plan.distinct_fingerprints();
    let claimed = conn
        .inbox_claim_batch(consumer, &plan.distinct(), fingerprints.as_deref())
        .await?;
    *positions = plan.applied(&claimed);
    let check = plan.to_check(&claimed);
    let rows = match check.is_empty() {
        true => Vec::new(),
        false => conn.inbox_stored(consumer, &check).await?,
    };
    Ok(plan.verdict(positions, &rows))
}

/// Runs one attempt's body, observing its failed statements; a panic rolls
/// back and then keeps unwinding.
/// `counted`: the scope and the claim whose failure a panic counts
/// (`max_attempts`).
async fn run_body<C, T, E, F>(
    conn: &mut C,
    body: F,
    counted: Option<(Scope, &One<'_>)>,
) -> Event<T, E>
where
    C: AsyncInboxConnection,
    for<'c> F: AsyncBody<&'c mut C, Result<T, E>, Fut: Send>,
{
    let mark = observe::mark_async(conn);
    let result = {
        let mut running = std::pin::pin!(body(&mut *conn));
        std::future::poll_fn(|cx| {
            match panic::catch_unwind(AssertUnwindSafe(|| running.as_mut().poll(cx))) {
                Ok(Poll::Ready(result)) => Poll::Ready(Ok(result)),
                Ok(Poll::Pending) => Poll::Pending,
                Err(panic) => Poll::Ready(Err(panic)),
            }
        })
        .await
    };
    match result {
        Ok(result) => Event::Ran {
            result,
            failed: observe::failed_since_async(conn, mark),
        },
        // diesel-async does not roll back on unwind either.
        Err(panic) => {
            conn.inbox_rollback().await;
            if let Some((scope, one)) = counted {
                let text = describe_panic(&*panic);
                crate::transaction::counted(
                    conn.inbox_count_failure(scope, one.consumer, one.key, &text)
                        .await,
                );
            }
            panic::resume_unwind(panic)
        }
    }
}

// ---- what diesel-async's own transaction manager connections share ----

#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) mod ansi {
    //! The transaction steps of connections with diesel-async's
    //! `AnsiTransactionManager` (PostgreSQL, MySQL/MariaDB).

    use super::Scope;
    use diesel::result::Error;
    use diesel_async::{AnsiTransactionManager, AsyncConnection, TransactionManager};

    fn depth<C>(conn: &mut C) -> Result<Option<std::num::NonZeroU32>, Error>
    where
        C: AsyncConnection<TransactionManager = AnsiTransactionManager>,
    {
        AnsiTransactionManager::transaction_manager_status_mut(conn).transaction_depth()
    }

    /// `BEGIN` at top level, a savepoint inside the caller's transaction.
    pub(crate) async fn begin<C>(conn: &mut C) -> Result<Scope, (Scope, Error)>
    where
        C: AsyncConnection<TransactionManager = AnsiTransactionManager>,
    {
        let scope = match depth(conn) {
            Ok(None) => Scope::TopLevel,
            Ok(Some(_)) => Scope::Savepoint,
            Err(e) => return Err((Scope::TopLevel, e)),
        };
        AnsiTransactionManager::begin_transaction(conn)
            .await
            .map(|()| scope)
            .map_err(|e| (scope, e))
    }

    pub(crate) async fn rollback<C>(conn: &mut C)
    where
        C: AsyncConnection<TransactionManager = AnsiTransactionManager>,
    {
        rollback_unless_ended(conn, |_| false).await
    }

    /// [`rollback`], where a failed top-level `ROLLBACK` whose error says
    /// the server ended the transaction already (`ended`, the backend's
    /// judgement) leaves the connection outside any transaction rather than
    /// marked broken.
    pub(crate) async fn rollback_unless_ended<C>(conn: &mut C, ended: fn(&Error) -> bool)
    where
        C: AsyncConnection<TransactionManager = AnsiTransactionManager>,
    {
        let top_level = match depth(conn) {
            Ok(Some(depth)) => depth.get() == 1,
            _ => return,
        };
        if let Err(e) = AnsiTransactionManager::rollback_transaction(conn).await {
            if top_level && ended(&e) {
                *AnsiTransactionManager::transaction_manager_status_mut(conn) = Default::default();
                return;
            }
            tracing::warn!(error = %e, "diesel-inbox: rollback failed");
        }
    }

    /// Commits at top level, releases the savepoint inside the caller's
    /// transaction (a failed top-level commit is rolled back by diesel-async).
    pub(crate) async fn commit<C>(conn: &mut C) -> Result<(), Error>
    where
        C: AsyncConnection<TransactionManager = AnsiTransactionManager>,
    {
        AnsiTransactionManager::commit_transaction(conn).await
    }

    /// Records that a top-level transaction ended by a statement the
    /// connection's transaction manager did not send (the commit guard's
    /// `COMMIT` on PostgreSQL).
    #[cfg(feature = "postgres")]
    pub(crate) fn ended<C>(conn: &mut C) -> Result<(), Error>
    where
        C: AsyncConnection<TransactionManager = AnsiTransactionManager>,
    {
        crate::backend::record_boundary(
            AnsiTransactionManager::transaction_manager_status_mut(conn),
            diesel::connection::TransactionDepthChange::DecreaseDepth,
        )
    }
}

// ---- migrate on PostgreSQL and MySQL/MariaDB ----

/// The steps of `migrate` a backend runs on its own async connection.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) trait AsyncMigration: AsyncConnection<Backend: InboxBackend> + Send {
    /// What the catalog says about the table (the backend's catalog query).
    fn catalog(&mut self) -> impl Future<Output = QueryResult<crate::backend::Catalog>> + Send;
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

/// [`migrate`](crate::migrate)'s sequence on an async connection: the same
/// plan and checks (`backend::migration_sql`, `backend::verify_migrated`).
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) async fn migrate_in_steps<C: AsyncMigration>(conn: &mut C) -> Result<(), InboxError> {
    let mut attempts = crate::backend::MigrateAttempts::new(transaction_open(conn));
    loop {
        match migrate_once(conn).await {
            Err(e) => match attempts.again::<C::Backend>(&e) {
                Some(delay) => tokio::time::sleep(delay).await,
                None => return Err(e),
            },
            done => return done,
        }
    }
}

/// One run of `migrate`'s sequence (`migrate_in_steps` reruns it after a
/// transient error, as the sync `migrate` does).
#[cfg(any(feature = "postgres", feature = "mysql"))]
async fn migrate_once<C: AsyncMigration>(conn: &mut C) -> Result<(), InboxError> {
    use crate::backend::migration_sql;
    if <C::Backend as InboxBackend>::DDL_COMMITS && transaction_open(conn) {
        return Err(InboxError::MigrationInTransaction);
    }
    if migration_sql::<C::Backend>(&conn.catalog().await?)?.is_none() {
        return Ok(());
    }
    let scope = conn.lock().await?;
    let applied = apply_migration(conn).await;
    let unlocked = conn.unlock(scope, applied.is_ok()).await;
    applied.and(unlocked)
}

#[cfg(any(feature = "postgres", feature = "mysql"))]
async fn apply_migration<C: AsyncMigration>(conn: &mut C) -> Result<(), InboxError> {
    use crate::backend::{migration_sql, verify_migrated};
    if let Some(sql) = migration_sql::<C::Backend>(&conn.catalog().await?)? {
        conn.batch_execute(&sql)
            .await
            .map_err(InboxError::MigrationFailed)?;
        verify_migrated::<C::Backend>(&conn.catalog().await?)?;
    }
    Ok(())
}
