//! What differs between databases: how a transaction starts, how a claim
//! ignores a conflict, and the DDL.

use crate::error::InboxError;
use diesel::connection::{AnsiTransactionManager, Connection, LoadConnection};
use diesel::result::QueryResult;

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
