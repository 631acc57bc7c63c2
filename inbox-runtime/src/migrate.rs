//! `migrate`: create, verify, version and upgrade the inbox's tables, the
//! same sequence on a sync and an async connection (the plan, the checks and
//! the reruns are shared; each backend supplies its catalog query, its DDL
//! and its lock).

#[cfg(feature = "async")]
use crate::backend::asynchronous::{AsyncInboxConnection, AsyncMigration};
use crate::backend::shape;
use crate::backend::transaction::transaction_open;
#[cfg(feature = "async")]
use crate::backend::transaction::transaction_open_async;
use crate::backend::{Catalog, InboxBackend, SCHEMA_VERSION};
use crate::error::InboxError;
use diesel::connection::{AnsiTransactionManager, LoadConnection};
use diesel::result::Error;

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
///   nothing is changed. This costs one catalog query, once per `migrate`,
///   and nothing on the message path.
/// - **Upgrades** a table of an older schema version in place (a table of
///   diesel-inbox 0.1 is recorded as version 1), and refuses one newer than
///   this release knows ([`InboxError::SchemaTooNew`]), so an older binary
///   never misreads a newer table.
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
    let mut attempts = MigrateAttempts::new(transaction_open(conn));
    loop {
        match migrate_once(conn) {
            Err(e) => match attempts.again::<C::Backend>(&e) {
                Some(delay) => std::thread::sleep(delay),
                None => return Err(e),
            },
            done => return done,
        }
    }
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
        let transient = matches!(error, InboxError::Database(e) | InboxError::MigrationFailed(e) if B::is_transient(e));
        if !(self.retry && transient && self.made < MIGRATE_ATTEMPTS) {
            return None;
        }
        let delay = crate::engine::backoff(self.made);
        self.made += 1;
        Some(delay)
    }
}

fn migrate_once<C>(conn: &mut C) -> Result<(), InboxError>
where
    C: LoadConnection<TransactionManager = AnsiTransactionManager>,
    C::Backend: InboxBackend,
{
    // Refused whatever the table's state, so that it does not pass in
    // development (table current) and fail on the first deploy.
    if <C::Backend as InboxBackend>::DDL_COMMITS && transaction_open(conn) {
        return Err(InboxError::MigrationInTransaction);
    }
    // A first look without the lock: a current, correct table needs nothing
    // (and no privilege beyond reading the catalog).
    if migration_sql::<C::Backend>(&<C::Backend as InboxBackend>::catalog(conn)?)?.is_none() {
        return Ok(());
    }
    <C::Backend as InboxBackend>::exclusively(conn, |conn| {
        let catalog = <C::Backend as InboxBackend>::catalog(conn)?;
        if let Some(sql) = migration_sql::<C::Backend>(&catalog)? {
            conn.batch_execute(&sql)
                .map_err(InboxError::MigrationFailed)?;
            verify_migrated::<C::Backend>(&<C::Backend as InboxBackend>::catalog(conn)?)?;
        }
        Ok(())
    })
}

/// What `migrate` runs for this catalog: `None` when the table is current
/// and correct, else the statements that create or upgrade it; an error for
/// a table it must not touch.
pub(crate) fn migration_sql<B: InboxBackend>(
    catalog: &Catalog,
) -> Result<Option<String>, InboxError> {
    Ok(match plan::<B>(catalog)? {
        Plan::Nothing => None,
        Plan::Create => Some(B::DDL.to_string()),
        Plan::Upgrade { from } => Some(upgrade_sql::<B>(from)),
    })
}

/// After creating or upgrading: the table must now be current and correct
/// (an existing object under the same name may have made `IF NOT EXISTS` a
/// no-op).
pub(crate) fn verify_migrated<B: InboxBackend>(catalog: &Catalog) -> Result<(), InboxError> {
    match plan::<B>(catalog)? {
        Plan::Nothing => Ok(()),
        _ => Err(InboxError::MigrationFailed(Error::QueryBuilderError(
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
    let catalog = <C::Backend as InboxBackend>::catalog(conn)?;
    Ok(catalog.table.and(catalog.version))
}

#[derive(Debug, PartialEq, Eq)]
enum Plan {
    Nothing,
    Create,
    /// Run the upgrades after `from` (`None`: a table of 0.1, unrecorded).
    Upgrade {
        from: Option<u32>,
    },
}

fn plan<B: InboxBackend>(catalog: &Catalog) -> Result<Plan, InboxError> {
    if let Some(found) = catalog.version.filter(|v| *v > SCHEMA_VERSION) {
        return Err(InboxError::SchemaTooNew {
            found,
            supported: SCHEMA_VERSION,
        });
    }
    let Some(table) = &catalog.table else {
        return Ok(Plan::Create);
    };
    let mut problems = shape::problems(table, B::KEY_TYPE, catalog.version);
    problems.extend(shape::attempts_problems(catalog));
    if !problems.is_empty() {
        return Err(InboxError::IncompatibleTable(problems));
    }
    Ok(match catalog.version {
        Some(SCHEMA_VERSION) => Plan::Nothing,
        from => Plan::Upgrade { from },
    })
}

/// The statements that take a verified table from version `from` to
/// [`SCHEMA_VERSION`] and record it.
fn upgrade_sql<B: InboxBackend>(from: Option<u32>) -> String {
    // A table without a record has the shape of version 1 (it passed the
    // checks); the upgrades after it follow.
    let done = from.unwrap_or(1) as usize;
    let mut sql: Vec<&str> = B::UPGRADES.iter().skip(done - 1).copied().collect();
    let record = B::record_version(SCHEMA_VERSION);
    sql.push(&record);
    sql.join("\n")
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
#[cfg(feature = "async")]
pub async fn migrate_async<C>(conn: &mut C) -> Result<(), InboxError>
where
    C: AsyncInboxConnection,
{
    migrate_in_steps(conn).await
}

/// [`migrate`](crate::migrate)'s sequence on an async connection: the same
/// plan and checks (`backend::migration_sql`, `backend::verify_migrated`).
#[cfg(feature = "async")]
async fn migrate_in_steps<C: AsyncMigration>(conn: &mut C) -> Result<(), InboxError> {
    let mut attempts = MigrateAttempts::new(transaction_open_async(conn));
    loop {
        match migrate_once_async(conn).await {
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
#[cfg(feature = "async")]
async fn migrate_once_async<C: AsyncMigration>(conn: &mut C) -> Result<(), InboxError> {
    if <C::Backend as InboxBackend>::DDL_COMMITS && transaction_open_async(conn) {
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

#[cfg(feature = "async")]
async fn apply_migration<C: AsyncMigration>(conn: &mut C) -> Result<(), InboxError> {
    if let Some(sql) = migration_sql::<C::Backend>(&conn.catalog().await?)? {
        conn.batch_execute(&sql)
            .await
            .map_err(InboxError::MigrationFailed)?;
        verify_migrated::<C::Backend>(&conn.catalog().await?)?;
    }
    Ok(())
}
