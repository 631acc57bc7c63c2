//! `migrate`: create, verify, version and upgrade the inbox's tables, the
//! same sequence on a sync and an async connection (the plan, the checks and
//! the reruns are shared; each backend supplies its catalog query, its DDL
//! and its lock).

#[cfg(feature = "async")]
use crate::backend::asynchronous::{AsAsyncConnection, AsyncInboxConnection, AsyncMigration};
use crate::backend::shape;
use crate::backend::transaction::transaction_open;
#[cfg(feature = "async")]
use crate::backend::transaction::transaction_open_async;
use crate::backend::transaction::Scope;
use crate::backend::{Catalog, InboxBackend, SCHEMA_VERSION};
use crate::error::InboxError;
use diesel::connection::{AnsiTransactionManager, LoadConnection};
use diesel::result::{Error, QueryResult};
use std::future::Future;
use std::time::Duration;

/// Creates the `inbox_messages` table and its index if they do not exist,
/// verifies an existing table and upgrades it to [`SCHEMA_VERSION`].
///
/// - **Creates** the table, its `received_at` index and the record of the
///   schema version when there is no table.
/// - **Verifies** an existing table against what the runtime relies on:
///   primary key exactly `(consumer, message_id)`, keys compared byte for
///   byte and at least 255 bytes wide, no foreign key, check constraint,
///   trigger or extra unique index that could skip or refuse a claim, and
///   the `received_at` index. Any mismatch is refused with
///   [`InboxError::IncompatibleTable`], listing each problem and its fix;
///   nothing is changed. This costs one catalog query, once per `migrate`.
///   The first claim on each connection runs the same check, so a table
///   made by the application's own migrations is refused too (guide:
///   schema).
/// - **Upgrades** a table of an older schema version in place (a table of
///   diesel-inbox 0.1 is recorded as version 1), and refuses one newer than
///   this release knows ([`InboxError::SchemaTooNew`]), so an older binary
///   never misreads a newer table.
/// - **Converges from any state it can reach**: what it makes is read from
///   what exists, not from the recorded version, so a library table or a
///   column a schema step added that is missing (dropped by an operator,
///   or left out by an interrupted run on MySQL, whose DDL is not
///   transactional) is made again, and the tables that exist keep their
///   rows.
///
/// The version is recorded in the catalog: the table comment on PostgreSQL
/// and MySQL/MariaDB (`diesel-inbox schema 1`), a view
/// `inbox_schema_version` on SQLite. A current, correct table needs no
/// privilege beyond reading the catalog.
///
/// Safe to call at every start and from several processes at once:
/// creation and upgrades run under a lock (an advisory lock on PostgreSQL,
/// `GET_LOCK` on MySQL/MariaDB, an immediate transaction on SQLite). It
/// does not touch diesel's `__diesel_schema_migrations`, so the
/// application's own `diesel migration revert` is unaffected. On
/// MySQL/MariaDB, where DDL commits implicitly, it refuses to run inside an
/// open transaction ([`InboxError::MigrationInTransaction`]); on PostgreSQL
/// and SQLite it joins the caller's transaction as a savepoint. Outside a
/// transaction, a transient error (a deadlock, a busy database; on a
/// Galera cluster, the abort by another node's DDL when every node
/// migrates at once) reruns it, up to 10 times in all.
///
/// The DDL is also available as [`InboxBackend::DDL`] (and the `ddl` module).
///
/// ```
/// use diesel::prelude::*;
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let mut conn = SqliteConnection::establish(":memory:")?;
/// diesel_inbox::migrate(&mut conn)?;
/// diesel_inbox::migrate(&mut conn)?; // idempotent
///
/// // A table whose keys compare case-insensitively is refused.
/// let mut other = SqliteConnection::establish(":memory:")?;
/// diesel::sql_query(
///     "CREATE TABLE inbox_messages (consumer TEXT COLLATE NOCASE, message_id TEXT COLLATE NOCASE, \
///      received_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP, PRIMARY KEY (consumer, message_id))",
/// ).execute(&mut other)?;
/// let refused = diesel_inbox::migrate(&mut other).unwrap_err();
/// assert!(refused.to_string().contains("NOCASE"), "{refused}");
/// # Ok(())
/// # }
/// ```
pub fn migrate<C>(conn: &mut C) -> Result<(), InboxError>
where
    C: LoadConnection<TransactionManager = AnsiTransactionManager>,
    C::Backend: InboxBackend,
{
    ready_now(sequence(&mut SyncSteps(conn)))
}

/// `migrate`'s reruns, for the sync and the async driver: a transient
/// error of its catalog read, its lock or its DDL runs it again, up to
/// [`MIGRATE_ATTEMPTS`] runs in all, unless it runs inside the caller's
/// transaction (whose error it is to handle). On a Galera cluster, DDL
/// replicates in total order and aborts what conflicts with it on each
/// node, so a `migrate` started on every node at once sees error 1213 on
/// some of them; the next run finds the table.
pub(crate) struct MigrateAttempts {
    retry: bool,
    made: u32,
}

/// How often `migrate` runs in all when it keeps failing transiently.
pub(crate) const MIGRATE_ATTEMPTS: u32 = 10;

impl MigrateAttempts {
    pub(crate) fn new(in_transaction: bool) -> Self {
        MigrateAttempts {
            retry: !in_transaction,
            made: 1,
        }
    }

    /// The wait before the next run after `error`, or `None`: return it.
    pub(crate) fn again<B: InboxBackend>(
        &mut self,
        error: &InboxError,
    ) -> Option<std::time::Duration> {
        // Also a piece another run made in between (MySQL and MariaDB
        // add a column without `IF NOT EXISTS`, and a Galera cluster's
        // `GET_LOCK` is per node): the next run reads the catalog again
        // and finds it.
        let transient = matches!(error, InboxError::Database(e) | InboxError::MigrationFailed(e)
            if B::is_transient(e) || made_meanwhile(e));
        if !(self.retry && transient && self.made < MIGRATE_ATTEMPTS) {
            return None;
        }
        let delay = crate::backoff::rerun(self.made);
        self.made += 1;
        Some(delay)
    }
}

/// Whether `error` is DDL that found its object made by another run:
/// MySQL's and MariaDB's 1060 "Duplicate column name" (read as its English
/// text: diesel keeps no error number).
fn made_meanwhile(error: &Error) -> bool {
    crate::backend::errors::database_error(error)
        .is_some_and(|(_, message)| message.starts_with("Duplicate column name"))
}

/// What `migrate` runs for this catalog: `None` when the tables are
/// current and correct, else the statements that make what is missing and
/// record the version; an error for a table it must not touch.
pub(crate) fn migration_sql<B: InboxBackend>(
    catalog: &Catalog,
) -> Result<Option<String>, InboxError> {
    Ok(migration::<B>(catalog)?.map(|(sql, _)| sql))
}

/// [`migration_sql`], and whether all it makes is optional (PostgreSQL's
/// refusals' view alone): a failure to make that is no failure of
/// `migrate` (a function of that name another role owns, a read-only
/// standby).
fn migration<B: InboxBackend>(catalog: &Catalog) -> Result<Option<(String, bool)>, InboxError> {
    if let Some(found) = catalog.version.filter(|v| *v > SCHEMA_VERSION) {
        return Err(InboxError::SchemaTooNew {
            found,
            supported: SCHEMA_VERSION,
        });
    }
    let unfixable = shape::unfixable(catalog, B::KEY_TYPE);
    if !unfixable.is_empty() {
        return Err(InboxError::IncompatibleTable(unfixable));
    }
    let mut sql = missing::<B>(catalog);
    let record = !sql.is_empty() || catalog.version != Some(SCHEMA_VERSION);
    // The refusals' view (PostgreSQL) is optional: made where DDL runs
    // anyway, or where the role may create it, so that a role that only
    // reads and writes rows still finds a current database needs nothing.
    if let Some((name, create)) = B::SCHEMA.refuse {
        let present = catalog.functions.iter().any(|f| f == name);
        if !present && (record || catalog.may_create) {
            sql.push(create.to_owned());
        }
    }
    if sql.is_empty() {
        return Ok(None);
    }
    if record {
        sql.push(B::record_version(SCHEMA_VERSION));
    }
    Ok(Some((sql.join("\n"), !record)))
}

/// After creating or upgrading: the tables must now be current and correct
/// (an existing object under the same name may have made `IF NOT EXISTS` a
/// no-op).
pub(crate) fn verify_migrated<B: InboxBackend>(catalog: &Catalog) -> Result<(), InboxError> {
    match migration_sql::<B>(catalog)? {
        None => Ok(()),
        Some(_) => Err(InboxError::MigrationFailed(Error::QueryBuilderError(
            "the inbox table is still not at the current schema version after migrating".into(),
        ))),
    }
}

/// The inbox schema version recorded in the database: `None` when there is
/// no inbox table, or a table of diesel-inbox 0.1 that no `migrate` of a
/// later release has recorded yet. Reads the catalog only.
///
/// ```
/// use diesel::prelude::*;
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let mut conn = SqliteConnection::establish(":memory:")?;
/// assert_eq!(diesel_inbox::schema_version(&mut conn)?, None);
/// diesel_inbox::migrate(&mut conn)?;
/// assert_eq!(diesel_inbox::schema_version(&mut conn)?, Some(diesel_inbox::SCHEMA_VERSION));
/// # Ok(())
/// # }
/// ```
pub fn schema_version<C>(conn: &mut C) -> Result<Option<u32>, InboxError>
where
    C: LoadConnection<TransactionManager = AnsiTransactionManager>,
    C::Backend: InboxBackend,
{
    let catalog = <C::Backend as crate::backend::Internals>::catalog(conn)?;
    Ok(catalog.table.and(catalog.version))
}

/// The pieces of the schema that the catalog lacks, read from what exists
/// rather than from the recorded version: a database of any older release,
/// one an interrupted `migrate` left (MySQL's DDL is not transactional), or
/// one an operator dropped a library table or a column of. The side tables
/// come first and `inbox_messages`, which holds the version's record on
/// PostgreSQL and MySQL, last: an interrupted run never records a version
/// its tables do not have.
fn missing<B: InboxBackend>(catalog: &Catalog) -> Vec<String> {
    let schema = &B::SCHEMA;
    let mut sql = Vec::new();
    if catalog.attempts_columns.is_empty() {
        sql.push(schema.attempts);
    }
    if catalog.outbox_columns.is_empty() {
        sql.push(schema.outbox);
    } else if !catalog.outbox_columns.iter().any(|c| c == "txid") {
        sql.push(schema.outbox_txid);
    }
    if catalog.positions_columns.is_empty() {
        sql.push(schema.positions);
    }
    match &catalog.table {
        None => sql.push(schema.inbox),
        Some(table) => sql.extend(
            schema
                .inbox_columns
                .iter()
                .filter(|(column, _)| !table.columns.iter().any(|c| c.name == *column))
                .map(|(_, add)| *add),
        ),
    }
    sql.into_iter().map(str::to_owned).collect()
}

/// The async twin of [`migrate`](crate::migrate): creates, verifies,
/// versions and upgrades the inbox table, with the same errors.
///
/// Cancel safety: on PostgreSQL and SQLite the changes are one transaction,
/// so a dropped call changes nothing. On MySQL/MariaDB each DDL statement
/// commits by itself and the lock is the session's `GET_LOCK`: a dropped
/// call may leave some upgrades done (the next call finishes them), and
/// leaves its connection marked broken, so that a pool discards it (the
/// session ends, and its lock with it); a connection of your own refuses
/// transactions after such a drop and must be dropped too.
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
#[cfg(feature = "async")]
pub async fn migrate_async<P, C, Via>(conn: &mut P) -> Result<(), InboxError>
where
    P: AsAsyncConnection<C, Via>,
    C: AsyncInboxConnection,
{
    use crate::backend::transaction::{state_known, state_unknown};
    let conn = conn.connection();
    // Where DDL commits by itself (MySQL/MariaDB) nothing of the sequence
    // is a transaction, and its lock is the session's: the connection is
    // marked broken until the sequence ends, so a call dropped anywhere in
    // it leaves a connection its pool discards (closing the session, and
    // its lock with it).
    let status = match <C::Backend as crate::backend::Internals>::DDL_COMMITS {
        true => state_unknown(conn),
        false => None,
    };
    let migrated = sequence(&mut AsyncSteps(&mut *conn)).await;
    state_known(conn, status);
    migrated
}

/// What `migrate`'s sequence does on a connection, step by step: on a sync
/// connection each step is done when it returns ([`SyncSteps`], driven by
/// [`ready_now`]), on an async one it is awaited ([`AsyncSteps`]).
trait Steps {
    type Backend: InboxBackend;
    /// Whether the caller has a transaction open.
    fn in_transaction(&mut self) -> bool;
    /// What the catalog says about the tables.
    fn catalog(&mut self) -> impl Future<Output = QueryResult<Catalog>> + Send;
    /// Keeps other `migrate`s out until `unlock`.
    fn lock(&mut self) -> impl Future<Output = Result<Scope, InboxError>> + Send;
    /// Ends what `lock` began: keeps the changes when `keep`.
    fn unlock(
        &mut self,
        scope: Scope,
        keep: bool,
    ) -> impl Future<Output = Result<(), InboxError>> + Send;
    /// Runs the DDL.
    fn apply(&mut self, sql: &str) -> impl Future<Output = QueryResult<()>> + Send;
    /// Waits before the next run.
    fn sleep(&mut self, delay: Duration) -> impl Future<Output = ()> + Send;
}

/// `migrate`'s sequence, once for sync and async: refuse inside a
/// transaction where DDL commits; a first look without the lock (a current,
/// correct table needs nothing, and no privilege beyond reading the
/// catalog); then, under the lock, look again, create or upgrade, verify;
/// rerun after a transient error ([`MigrateAttempts`]).
async fn sequence<S: Steps>(steps: &mut S) -> Result<(), InboxError> {
    let mut attempts = MigrateAttempts::new(steps.in_transaction());
    loop {
        match once(steps).await {
            Err(e) => match attempts.again::<S::Backend>(&e) {
                Some(delay) => steps.sleep(delay).await,
                None => return Err(e),
            },
            done => return done,
        }
    }
}

/// One run of [`sequence`].
async fn once<S: Steps>(steps: &mut S) -> Result<(), InboxError> {
    // Refused whatever the table's state, so that it does not pass in
    // development (table current) and fail on the first deploy.
    if <S::Backend as crate::backend::Internals>::DDL_COMMITS && steps.in_transaction() {
        return Err(InboxError::MigrationInTransaction);
    }
    if migration_sql::<S::Backend>(&steps.catalog().await?)?.is_none() {
        return Ok(());
    }
    let scope = steps.lock().await?;
    let applied = apply(steps).await;
    let unlocked = steps.unlock(scope, applied.is_ok()).await;
    match applied {
        Ok(()) => unlocked,
        // The optional view alone could not be made: said by `apply`,
        // rolled back by `unlock`, and no failure of `migrate`.
        Err((_, true)) => unlocked,
        Err((e, false)) => Err(e),
    }
}

/// Under the lock: the plan again, the DDL, the check that it took.
async fn apply<S: Steps>(steps: &mut S) -> Result<(), (InboxError, bool)> {
    let required = |e| (e, false);
    let catalog = steps.catalog().await.map_err(|e| required(e.into()))?;
    match migration::<S::Backend>(&catalog).map_err(required)? {
        None => Ok(()),
        // Only the optional view: its failure is said, not raised (the
        // caller rolls it back, and the tables are as they were).
        Some((sql, true)) => steps.apply(&sql).await.map_err(|e| {
            tracing::warn!(target: crate::target::TARGET, error = %e, "diesel-inbox: migrate could not create the view diesel_inbox_refused; refusals behind a proxy read as a failed cast instead (guide: proxies)");
            (InboxError::MigrationFailed(e), true)
        }),
        Some((sql, false)) => {
            steps
                .apply(&sql)
                .await
                .map_err(|e| required(InboxError::MigrationFailed(e)))?;
            let catalog = steps.catalog().await.map_err(|e| required(e.into()))?;
            verify_migrated::<S::Backend>(&catalog).map_err(required)
        }
    }
}

/// The sync connection's steps: each is done when it returns, as a ready
/// future.
struct SyncSteps<'c, C>(&'c mut C);

impl<C> Steps for SyncSteps<'_, C>
where
    C: LoadConnection<TransactionManager = AnsiTransactionManager>,
    C::Backend: InboxBackend,
{
    type Backend = C::Backend;

    fn in_transaction(&mut self) -> bool {
        transaction_open(self.0)
    }

    fn catalog(&mut self) -> impl Future<Output = QueryResult<Catalog>> + Send {
        std::future::ready(<C::Backend as crate::backend::Internals>::catalog(self.0))
    }

    fn lock(&mut self) -> impl Future<Output = Result<Scope, InboxError>> + Send {
        std::future::ready(<C::Backend as crate::backend::Internals>::lock_migrations(
            self.0,
        ))
    }

    fn unlock(
        &mut self,
        scope: Scope,
        keep: bool,
    ) -> impl Future<Output = Result<(), InboxError>> + Send {
        std::future::ready(
            <C::Backend as crate::backend::Internals>::unlock_migrations(self.0, scope, keep),
        )
    }

    fn apply(&mut self, sql: &str) -> impl Future<Output = QueryResult<()>> + Send {
        std::future::ready(self.0.batch_execute(sql))
    }

    fn sleep(&mut self, delay: Duration) -> impl Future<Output = ()> + Send {
        std::thread::sleep(delay);
        std::future::ready(())
    }
}

/// The value of a future that is ready at its first poll: the sync steps'
/// sequence, whose every step is done when it returns.
fn ready_now<T>(future: impl Future<Output = T>) -> T {
    let mut future = std::pin::pin!(future);
    let mut context = std::task::Context::from_waker(std::task::Waker::noop());
    match future.as_mut().poll(&mut context) {
        std::task::Poll::Ready(value) => value,
        std::task::Poll::Pending => unreachable!("a sync step of migrate is done when it returns"),
    }
}

/// The async connection's steps.
#[cfg(feature = "async")]
struct AsyncSteps<'c, C>(&'c mut C);

#[cfg(feature = "async")]
impl<C: AsyncMigration> Steps for AsyncSteps<'_, C> {
    type Backend = C::Backend;

    fn in_transaction(&mut self) -> bool {
        transaction_open_async(self.0)
    }

    fn catalog(&mut self) -> impl Future<Output = QueryResult<Catalog>> + Send {
        // The first look is outside any transaction: marked as every
        // runtime statement there (`state_unknown`).
        let conn = &mut *self.0;
        async move {
            let status = crate::backend::transaction::state_unknown(conn);
            let catalog = conn.catalog().await;
            crate::backend::transaction::state_known(conn, status);
            catalog
        }
    }

    fn lock(&mut self) -> impl Future<Output = Result<Scope, InboxError>> + Send {
        self.0.lock()
    }

    fn unlock(
        &mut self,
        scope: Scope,
        keep: bool,
    ) -> impl Future<Output = Result<(), InboxError>> + Send {
        self.0.unlock(scope, keep)
    }

    fn apply(&mut self, sql: &str) -> impl Future<Output = QueryResult<()>> + Send {
        diesel_async::SimpleAsyncConnection::batch_execute(self.0, sql)
    }

    fn sleep(&mut self, delay: Duration) -> impl Future<Output = ()> + Send {
        tokio::time::sleep(delay)
    }
}

#[cfg(all(test, feature = "sqlite"))]
mod tests {
    use super::*;
    use diesel::result::DatabaseErrorKind;

    /// A column another run added in between (MySQL's 1060) runs
    /// `migrate` again, which then finds it; other errors do not.
    #[test]
    fn a_column_another_run_added_runs_migrate_again() {
        let made = |text: &str| {
            InboxError::MigrationFailed(Error::DatabaseError(
                DatabaseErrorKind::Unknown,
                Box::new(text.to_owned()),
            ))
        };
        let mut attempts = MigrateAttempts::new(false);
        assert!(attempts
            .again::<diesel::sqlite::Sqlite>(&made("Duplicate column name 'txid'"))
            .is_some());
        let mut attempts = MigrateAttempts::new(false);
        assert!(attempts
            .again::<diesel::sqlite::Sqlite>(&made("Table 'outbox_messages' doesn't exist"))
            .is_none());
        // Inside the caller's transaction, never.
        let mut attempts = MigrateAttempts::new(true);
        assert!(attempts
            .again::<diesel::sqlite::Sqlite>(&made("Duplicate column name 'txid'"))
            .is_none());
    }
}
