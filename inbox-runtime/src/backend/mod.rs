//! What differs between databases: how a transaction starts, how a claim
//! ignores a conflict, and the DDL.

use crate::error::InboxError;
use diesel::connection::{AnsiTransactionManager, Connection, LoadConnection};
use diesel::result::QueryResult;

/// Most keys one claim statement carries (bind-parameter limits: PostgreSQL
/// 65535, SQLite 32766; two per row).
pub(crate) const CLAIM_CHUNK: usize = 5_000;

/// A unique violation of a batch claim means another transaction claimed one
/// of the keys between the lookup and the insert: rerun the whole batch,
/// which then sees that key as a duplicate.
#[cfg(any(feature = "mysql", feature = "sqlite"))]
pub(crate) fn concurrent_claim(error: diesel::result::Error) -> diesel::result::Error {
    use diesel::result::{DatabaseErrorKind, Error};
    match error {
        Error::DatabaseError(DatabaseErrorKind::UniqueViolation, info) => Error::DatabaseError(
            DatabaseErrorKind::SerializationFailure,
            Box::new(format!(
                "a concurrent batch claimed the same key: {}",
                info.message()
            )),
        ),
        other => other,
    }
}

/// Batch claim for backends without `RETURNING` on a conflict-ignoring
/// insert (MySQL) or whose writers are serialized anyway (SQLite): look the
/// keys up, insert the missing ones with a plain `INSERT` (see
/// [`concurrent_claim`] for the race).
#[cfg(any(feature = "mysql", feature = "sqlite"))]
macro_rules! claim_batch_by_lookup {
    ($conn:expr, $consumer:expr, $keys:expr) => {{
        use crate::schema::inbox_messages::dsl::*;
        let mut claimed = Vec::new();
        for chunk in $keys.chunks(crate::backend::CLAIM_CHUNK) {
            let present: std::collections::HashSet<String> = inbox_messages
                .filter(consumer.eq($consumer))
                .filter(message_id.eq_any(chunk))
                .select(message_id)
                .load::<String>($conn)?
                .into_iter()
                .collect();
            let missing: Vec<&str> = chunk
                .iter()
                .copied()
                .filter(|k| !present.contains(*k))
                .collect();
            if missing.is_empty() {
                continue;
            }
            let rows: Vec<_> = missing
                .iter()
                .map(|k| (consumer.eq($consumer), message_id.eq(*k)))
                .collect();
            diesel::insert_into(inbox_messages)
                .values(&rows)
                .execute($conn)
                .map_err(crate::backend::concurrent_claim)?;
            claimed.extend(missing.into_iter().map(str::to_owned));
        }
        Ok(claimed)
    }};
}

#[cfg(feature = "mysql")]
mod mysql;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "sqlite")]
mod sqlite;

mod sealed {
    pub trait Sealed {}
}
pub(crate) use sealed::Sealed;

/// A diesel backend the inbox supports: `Pg`, `Mysql` (MySQL and MariaDB)
/// and `Sqlite`, each behind the feature of the same name.
///
/// Handlers accept any connection whose backend implements this trait and
/// whose transaction manager is diesel's `AnsiTransactionManager`, which is
/// true of `PgConnection`, `MysqlConnection` and `SqliteConnection`; for an
/// r2d2 `PooledConnection`, pass `&mut *pooled`.
///
/// ```
/// fn assert_supported<B: inbox_runtime::InboxBackend>() {}
/// assert_supported::<diesel::sqlite::Sqlite>();
/// assert!(<diesel::sqlite::Sqlite as inbox_runtime::InboxBackend>::DDL
///     .contains("CREATE TABLE IF NOT EXISTS inbox_messages"));
/// ```
pub trait InboxBackend: diesel::backend::Backend + Sealed + Sized {
    /// The statements that create the inbox table and its index, idempotent
    /// (`IF NOT EXISTS`), for users who run their own migration tool.
    const DDL: &'static str;

    /// The statement that opens a top-level transaction.
    #[doc(hidden)]
    const BEGIN: &'static str;

    /// Inserts `(consumer, key)` unless it is there already; `true` if the
    /// row was inserted (the caller owns the message), `false` for a
    /// duplicate. Never fails on the conflict itself.
    #[doc(hidden)]
    fn claim<C>(conn: &mut C, consumer: &str, key: &str) -> QueryResult<bool>
    where
        C: Connection<Backend = Self>;

    /// Inserts every `(consumer, key)` that is not there yet, in one
    /// statement where the backend can tell which rows it inserted, and
    /// returns the keys inserted: the ones the caller now owns. Keys are
    /// distinct.
    #[doc(hidden)]
    fn claim_batch<C>(conn: &mut C, consumer: &str, keys: &[&str]) -> QueryResult<Vec<String>>
    where
        C: LoadConnection<Backend = Self>;

    /// Commits the transaction that [`run`](crate::run) opened at top level.
    /// On failure the transaction is rolled back before returning.
    #[doc(hidden)]
    fn commit_top_level<C>(conn: &mut C) -> QueryResult<()>
    where
        C: Connection<Backend = Self, TransactionManager = AnsiTransactionManager>,
    {
        // diesel rolls back itself when a top-level COMMIT fails.
        <AnsiTransactionManager as diesel::connection::TransactionManager<C>>::commit_transaction(
            conn,
        )
    }

    /// Creates the table, guarded against concurrent runs.
    #[doc(hidden)]
    fn migrate<C>(conn: &mut C) -> Result<(), InboxError>
    where
        C: LoadConnection<Backend = Self, TransactionManager = AnsiTransactionManager>;
}

/// Creates the `inbox_messages` table and its index if they do not exist.
///
/// Safe to call at every start and from several processes at once (guarded
/// by an advisory lock on PostgreSQL, `GET_LOCK` on MySQL/MariaDB, an
/// immediate transaction on SQLite). It does not touch diesel's
/// `__diesel_schema_migrations`, so the application's own
/// `diesel migration revert` is unaffected. On MySQL/MariaDB, where DDL
/// commits implicitly, it refuses to run inside an open transaction
/// ([`InboxError::MigrationInTransaction`]); on PostgreSQL and SQLite it joins
/// the caller's transaction as a savepoint.
///
/// The DDL is also available as [`InboxBackend::DDL`] (and the `ddl` module).
///
/// ```
/// use diesel::prelude::*;
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let mut conn = SqliteConnection::establish(":memory:")?;
/// inbox_runtime::migrate(&mut conn)?;
/// inbox_runtime::migrate(&mut conn)?; // idempotent
/// # Ok(())
/// # }
/// ```
pub fn migrate<C>(conn: &mut C) -> Result<(), InboxError>
where
    C: LoadConnection<TransactionManager = AnsiTransactionManager>,
    C::Backend: InboxBackend,
{
    <C::Backend as InboxBackend>::migrate(conn)
}

/// The inbox DDL of each backend, as [`InboxBackend::DDL`] gives it, for a
/// migration tool of your own (for example a diesel migration's `up.sql`).
///
/// ```
/// assert!(inbox_runtime::ddl::SQLITE.contains("PRIMARY KEY (consumer, message_id)"));
/// ```
pub mod ddl {
    /// PostgreSQL.
    pub const POSTGRES: &str = include_str!("postgres.sql");
    /// MySQL 8 and MariaDB 10.5+. Keys are `VARBINARY` so that they compare
    /// byte for byte (the default collations ignore case, accents and
    /// trailing spaces).
    pub const MYSQL: &str = include_str!("mysql.sql");
    /// SQLite.
    pub const SQLITE: &str = include_str!("sqlite.sql");
}
