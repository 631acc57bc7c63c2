//! What differs between databases: how a transaction starts, how a claim
//! ignores a conflict, which errors are transient, the DDL and the catalog;
//! and `migrate`, which verifies, versions and upgrades the table through
//! them.

use crate::error::InboxError;
use diesel::connection::{AnsiTransactionManager, Connection, LoadConnection};
use diesel::result::{Error, QueryResult};
use transaction::Scope;

#[cfg(feature = "async")]
/// The async drivers' connection traits and their claim steps.
pub(crate) mod asynchronous;
/// Reading the databases' errors: refusals, deadlocks, missing tables.
pub(crate) mod errors;
/// Running the statement layer's statements on a sync or async connection.
pub(crate) mod execute;
#[cfg(feature = "mysql")]
mod mysql;
/// The outbox's statements: enqueue, settle, count.
pub(crate) mod outbox;
/// The relay's claim of the next outbox rows, in waves under a floor.
pub(crate) mod outbox_claim;
/// The WAL relay's statements (PostgreSQL logical decoding).
pub(crate) mod outbox_wal;
/// The console's and `stats`' read-only counts.
pub(crate) mod overview;
/// The stream positions (Kafka offsets) written with a call's transaction.
pub(crate) mod positions;
#[cfg(feature = "postgres")]
mod postgres;
/// The catalog's view of the library's tables, and the shape check.
pub(crate) mod shape;
#[cfg(feature = "sqlite")]
mod sqlite;
/// The statements every backend runs, built once per backend.
pub(crate) mod statements;
/// Typed statement values: SQL text with its binds and its row type.
pub(crate) mod stmt;
/// Begin, commit and roll back the call's transaction or savepoint.
pub(crate) mod transaction;

pub(crate) use execute::Statements;
#[cfg(feature = "postgres")]
pub(crate) use postgres::guarded_sql_for_tests as postgres_guarded_sql;
pub(crate) use shape::Catalog;

/// The newest version of the inbox schema this release knows. `migrate`
/// records it with the table, upgrades older tables in place and refuses a
/// newer one ([`InboxError::SchemaTooNew`]).
///
/// - Version 1 is the table of diesel-inbox 0.1: `(consumer, message_id)`
///   primary key and `received_at`; tables created by 0.1 carry no record
///   and are treated as version 1.
/// - Version 2 adds two nullable columns: `fingerprint` (the content's
///   [`Fingerprint`](crate::Fingerprint)) and `result` (a stored result).
///   The upgrade adds them in place without rewriting rows; rows written
///   before it have neither, and accept any content.
/// - Version 3 adds the transactional outbox's table, `outbox_messages`
///   (`diesel_inbox::outbox`); the upgrade creates it and touches no
///   inbox row.
/// - Version 4 adds `inbox_positions`: the position of each (consumer,
///   topic, partition) that the Kafka runner writes in the handler's own
///   transaction (`diesel_inbox::kafka`); the upgrade creates it and
///   touches no other row.
/// - Version 5 adds the nullable column `txid` to `outbox_messages`: on
///   PostgreSQL the id of the transaction that enqueued the row (its
///   default, `txid_current()`), indexed, with which the relay finds rows
///   that commit late without reading past the dead rows a long
///   transaction keeps (`guide::outbox`, "A long transaction"); NULL on
///   MySQL/MariaDB and SQLite. The upgrade adds it in place: rows enqueued
///   before it have none, and are found as before.
///
/// ```
/// assert_eq!(diesel_inbox::SCHEMA_VERSION, 5);
/// ```
pub const SCHEMA_VERSION: u32 = 5;

/// A diesel backend the inbox supports: `Pg`, `Mysql` (MySQL and MariaDB)
/// and `Sqlite`, each behind the feature of the same name. Everything that
/// differs between databases lives in its implementation: the SQL of the
/// claim and of the DDL, which errors are transient, how the schema version
/// is recorded and how the catalog describes the table.
///
/// Handlers accept any connection whose backend implements this trait and
/// whose transaction manager is diesel's `AnsiTransactionManager`, which is
/// true of `PgConnection`, `MysqlConnection` and `SqliteConnection`; for an
/// r2d2 `PooledConnection`, pass `&mut *pooled`.
///
/// ```
/// fn assert_supported<B: diesel_inbox::InboxBackend>() {}
/// assert_supported::<diesel::sqlite::Sqlite>();
/// assert!(<diesel::sqlite::Sqlite as diesel_inbox::InboxBackend>::DDL
///     .contains("CREATE TABLE IF NOT EXISTS inbox_messages"));
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a database backend diesel-inbox supports",
    label = "the connection's backend must be `Pg`, `Mysql` or `Sqlite`",
    note = "diesel-inbox runs on `PgConnection` (feature `postgres`), `MysqlConnection` (feature `mysql`) and `SqliteConnection` (feature `sqlite`); a `#[derive(MultiConnection)]` enum is not supported: take the connection of one backend, e.g. `conn: &mut PgConnection`"
)]
#[allow(private_bounds)] // the seal: `Internals` cannot be named, nor its items called, outside
pub trait InboxBackend: diesel::backend::Backend + Internals + Statements + Sized {
    /// The statements that create the inbox table, its index and the
    /// record of its schema version, idempotent (`IF NOT EXISTS`), for
    /// users who run their own migration tool.
    const DDL: &'static str;
}

/// What a backend does, step by step: the runtime's side of
/// [`InboxBackend`]. Crate-private, so that a user crate can name
/// `InboxBackend` in bounds and read its `DDL` but cannot call a step
/// (`<Pg as InboxBackend>::forget` does not compile: a forget without the
/// key checks, a claim outside the engine). This is diesel's own split
/// (`Connection` public, its transaction-manager plumbing on a sealed
/// supertrait), made stricter: diesel opens its supertrait to third-party
/// backends behind a feature; ours is closed.
pub(crate) trait Internals: diesel::backend::Backend + Sized + 'static {
    /// The statement that opens a top-level transaction.
    const BEGIN: &'static str;

    /// The column type of `consumer` and `message_id`, named in fixes.
    const KEY_TYPE: &'static str;

    /// Whether a connection's first claim checks the tables' shape after
    /// its write (rolled back if the shape is refused) rather than before
    /// it. SQLite: a catalog read first, inside the caller's deferred
    /// transaction, takes a snapshot that cannot become a write while
    /// another connection writes (`database is locked` at once, the busy
    /// handler is not called); its tables are all transactional. Elsewhere
    /// before: a MySQL MyISAM table keeps a row its rollback cannot undo.
    const CHECK_SHAPE_AFTER_CLAIM: bool = false;

    /// Whether the statements of a call other than its claim may be cached
    /// as named prepared statements (`statements::Side`). Not on
    /// PostgreSQL: a proxy in transaction mode (PgBouncer before 1.21) hands
    /// a cached name to whichever client runs on that server session next,
    /// so those statements run unnamed, in the call's own transaction. The
    /// claim, on every message's path, stays cached and checks what it
    /// returns instead.
    const CACHE_SIDE_STATEMENTS: bool = true;

    /// Whether DDL commits an open transaction implicitly (MySQL), so that
    /// `migrate` must refuse to run inside one.
    const DDL_COMMITS: bool = false;

    /// The schema's pieces, which `migrate` makes where the catalog lacks
    /// them.
    const SCHEMA: Schema;

    /// Inserts `(consumer, key)` (with its fingerprint, if given) unless it
    /// is there already; `true` if the row was inserted (the caller owns
    /// the message), `false` for a duplicate. Never fails on the conflict
    /// itself. Without a fingerprint the statement is that of schema 1.
    fn claim<C>(
        conn: &mut C,
        consumer: &str,
        key: &str,
        fingerprint: Option<&[u8]>,
    ) -> QueryResult<bool>
    where
        C: LoadConnection<Backend = Self>;

    /// Inserts every `(consumer, key)` that is not there yet (with
    /// `fingerprints[i]` for `keys[i]`, if given), in one statement where
    /// the backend can tell which rows it inserted, and returns the keys
    /// inserted: the ones the caller now owns. Keys are distinct.
    fn claim_batch<C>(
        conn: &mut C,
        consumer: &str,
        keys: &[&str],
        fingerprints: Option<&[&[u8]]>,
    ) -> QueryResult<Vec<String>>
    where
        C: LoadConnection<Backend = Self>;

    /// The replay's read (`Inbox::store_result`), before any
    /// transaction: the key's row if it holds a stored result. One cached
    /// statement; an answer that is not the key's own is an error.
    fn lookup<C>(
        conn: &mut C,
        consumer: &str,
        key: &str,
    ) -> QueryResult<Option<crate::rows::StoredRow>>
    where
        C: LoadConnection<Backend = Self>;

    /// The upsert of [`count_failure`](Self::count_failure), binds:
    /// consumer, key, error text.
    const COUNT_FAILURE: &'static str;

    /// Opens a top-level transaction with the backend's `BEGIN`; fails with
    /// `AlreadyInTransaction` inside one (the caller then takes a
    /// savepoint). Keeps diesel's transaction depth in step.
    fn begin_top_level<C>(conn: &mut C) -> QueryResult<()>
    where
        C: Connection<Backend = Self, TransactionManager = AnsiTransactionManager>,
    {
        AnsiTransactionManager::begin_transaction_sql(conn, Self::BEGIN)
    }

    /// Rolls back the top-level transaction; keeps diesel's depth in step.
    fn rollback_top_level<C>(conn: &mut C) -> QueryResult<()>
    where
        C: Connection<Backend = Self, TransactionManager = AnsiTransactionManager>,
    {
        <AnsiTransactionManager as diesel::connection::TransactionManager<C>>::rollback_transaction(
            conn,
        )
    }

    /// Commits the transaction that a handler call opened at top level.
    /// On failure the transaction is rolled back before returning.
    fn commit_top_level<C>(conn: &mut C) -> QueryResult<()>
    where
        C: Connection<Backend = Self, TransactionManager = AnsiTransactionManager>,
    {
        // diesel rolls back itself when a top-level COMMIT fails.
        <AnsiTransactionManager as diesel::connection::TransactionManager<C>>::commit_transaction(
            conn,
        )
    }

    /// Whether rerunning the transaction that raised `error` may succeed:
    /// serialization failures, deadlocks, lock timeouts, busy databases.
    fn is_transient(error: &Error) -> bool;

    /// How a claim's wait for an in-flight claim of the same key is
    /// bounded (`Inbox::wait`): the statement that sets the bound, run
    /// right before the claim, and the one that restores the connection's
    /// own, right after it. `None`: the backend bounds the wait elsewhere
    /// (SQLite: around its `BEGIN IMMEDIATE`, with the busy timeout).
    #[cfg_attr(not(feature = "async"), allow(dead_code))] // read by the async driver
    fn wait_bound(wait: std::time::Duration) -> Option<WaitBound> {
        let _ = wait;
        None
    }

    /// Whether `error` is a claim's (or SQLite's begin's) wait for another
    /// transaction running out, under a bound set by
    /// [`wait_bound`](Self::wait_bound).
    fn is_wait_timeout(error: &Error) -> bool;

    /// Whether `error`, raised by a statement of the body, ended the whole
    /// transaction even though the body went on and returned `Ok` (MySQL
    /// rolls back the transaction on a deadlock; later statements then run
    /// outside it).
    fn ends_transaction(error: &Error) -> bool {
        let _ = error;
        false
    }

    /// An SQL expression for whether the connection's transaction is still
    /// open (1, 0, or NULL where the server cannot tell), asked when the
    /// body returned `Ok` after a statement of its own failed: the state
    /// itself, whatever language the server's messages are in. Where it is
    /// `None`, or answers NULL, [`ends_transaction`](Self::ends_transaction)
    /// judges the failed statements instead.
    const OPEN_PROBE: Option<&'static str> = None;

    /// Whether a failed top-level commit means the body swallowed the error
    /// of a statement that aborted the transaction (PostgreSQL's commit
    /// guard), rather than a failure of the commit itself.
    fn is_aborted_commit(error: &Error) -> bool {
        let _ = error;
        false
    }

    /// Whether `error` says there is no `inbox_messages` table.
    fn is_missing_table(error: &Error) -> bool;

    /// `received_at` as microseconds since the Unix epoch (`BIGINT`).
    const RECEIVED_AT_MICROS: &'static str;

    /// The same expression on `inbox_attempts.updated_at`.
    const UPDATED_AT_MICROS: &'static str;

    /// What goes around a bind of microseconds since the Unix epoch (a
    /// whole second) to make a time comparable with `received_at`: the
    /// console's minutes.
    const RECEIVED_AT_OF_MICROS: (&'static str, &'static str);

    /// The type a `CAST` makes a 64-bit integer of (a bind in a select
    /// list, which MySQL otherwise returns as bytes).
    const BIGINT: &'static str = "BIGINT";

    /// The time `older_than` before now, comparable with `received_at` (the
    /// database's clock, as the column's default reads it).
    fn cutoff_sql(older_than: std::time::Duration) -> String;

    /// A statement run before a purge batch's `BEGIN` (its isolation).
    const PURGE_ISOLATION: Option<&'static str> = None;

    /// The database's clock as microseconds since the Unix epoch
    /// (`BIGINT`): the outbox's times.
    const NOW_MICROS: &'static str;

    /// What ends the relay's claim: `FOR UPDATE SKIP LOCKED` where rows can
    /// be locked (PostgreSQL, MySQL 8, MariaDB 10.6+), nothing on SQLite,
    /// whose immediate transaction serializes claims.
    const SKIP_LOCKED: &'static str;

    /// What ends a select that locks the row it reads until the
    /// transaction ends (the stream position's fence): `FOR UPDATE` where
    /// rows can be locked, nothing on SQLite, whose immediate transaction
    /// holds the database's write lock already.
    const LOCK_ROW: &'static str;

    /// The expression a transaction that moves a stream position (a Kafka
    /// runner's) evaluates in its fence (in the fence's update where
    /// [`FENCE_IN_ONE`](Self::FENCE_IN_ONE), else selected before its
    /// locked read): on PostgreSQL, the transaction-local `idle_in_transaction_session_timeout` of
    /// [`FENCED_IDLE_LIMIT_SECS`](crate::fence::FENCED_IDLE_LIMIT_SECS), so that
    /// a consumer stopped inside its transaction (SIGSTOP, a long stall)
    /// cannot hold its partition's position row, and the new owner waiting
    /// on it, for longer: the server ends the stopped session, and its
    /// transaction never commits. `None` where the server has no such
    /// bound for one transaction (MySQL, MariaDB, SQLite).
    const FENCED_IDLE_LIMIT: Option<&'static str> = None;

    /// Whether one `UPDATE .. FROM (VALUES ..) .. RETURNING` moves the
    /// stored positions the fence admits ([`Move::admitted`](positions::Move::admitted)),
    /// before any locked read: PostgreSQL. Elsewhere the fence reads the
    /// stored positions (locked), then writes.
    const FENCE_IN_ONE: bool = false;

    /// What the relay's short transactions (its claim, its settlement)
    /// run first. PostgreSQL: `SET LOCAL jit = off` (an outbox table
    /// churns, every row inserted once and deleted once, so its statistics
    /// often count many dead rows; the claim's estimated cost then passes
    /// `jit_above_cost`, and compiling it would cost far more than the
    /// millisecond the query runs: `docs/performance.md`) and `SET
    /// LOCAL synchronous_commit = off` (a relay's commit lost in a server
    /// crash only publishes its rows again, with their ids: the contract
    /// allows it, and the relay does not wait for the WAL flush).
    const RELAY_SETUP: Option<&'static str> = None;

    /// The relay's floor (`outbox_claim::Floor`): the `xmin` of the
    /// statement's snapshot, as the outbox's `txid` counts transactions
    /// (PostgreSQL: `txid_snapshot_xmin(txid_current_snapshot())`, once
    /// per statement; NULL on a table without the column). `None` where
    /// the backend has no such snapshot: the relay's look then always
    /// starts at the lowest `seq`.
    const SNAPSHOT_XMIN: Option<&'static str> = None;

    /// The session answering, as text unique over the server's life and
    /// across servers (PostgreSQL: its pid and when it began): the relay's
    /// floor lists the sessions that may use it (`outbox_claim::Floor`),
    /// and a look in another reads every row. `None` where there is no
    /// floor.
    const SESSION: Option<&'static str> = None;

    /// What sets the outbox's `txid` to the current transaction's id, in an
    /// `UPDATE` that makes a dead row live again (so that a relay's floor
    /// finds it); `None` where [`SNAPSHOT_XMIN`](Self::SNAPSHOT_XMIN) is.
    const SET_TXID: Option<&'static str> = None;

    /// Whether the backend has the WAL outbox (`outbox_wal`): PostgreSQL's
    /// logical decoding.
    const WAL: bool = false;

    /// Whether the cached statements that write (the claim, the outbox's
    /// enqueue) carry a guard parameter and return a marker of their own,
    /// because another client can reach them by their prepared name
    /// (PostgreSQL behind a proxy in transaction mode):
    /// [`push_guard`](Self::push_guard). Such a statement stays cached (one
    /// round trip, planned once) and cannot silently be another statement.
    const GUARDED: bool = false;

    /// Pushes the guard of `statement` (its name in the error, an SQL
    /// literal without quotes) where [`GUARDED`](Self::GUARDED): ` WHERE`
    /// and a condition true for the guard parameter's own value, an error
    /// naming `statement` for any other.
    fn push_guard(
        out: &mut diesel::query_builder::AstPass<'_, '_, Self>,
        statement: &'static str,
    ) -> QueryResult<()> {
        let _ = (out, statement);
        Ok(())
    }

    /// What makes an outbox enqueue wake the relays of other processes at
    /// its transaction's commit, pushed between the enqueue's `SELECT`
    /// list and its guard (only where [`GUARDED`](Self::GUARDED): the
    /// enqueue is then `INSERT .. SELECT`). PostgreSQL: ` FROM (SELECT
    /// CASE .. pg_notify(..) END)` when `$n` and a relay sleeps, one
    /// notification at commit however many rows the transaction enqueued
    /// (the server folds equal notifications of one transaction); nothing
    /// where relays poll.
    fn push_enqueue_notify<'b>(
        out: &mut diesel::query_builder::AstPass<'_, 'b, Self>,
        notify: &'b bool,
    ) -> QueryResult<()> {
        let _ = (out, notify);
        Ok(())
    }

    /// What the catalog says about `inbox_messages`, in one query.
    fn catalog<C>(conn: &mut C) -> QueryResult<Catalog>
    where
        C: LoadConnection<Backend = Self>;

    /// The statements that record `version` with the table.
    fn record_version(version: u32) -> String;

    /// Keeps every other `migrate` of the same database out until
    /// [`unlock_migrations`](Self::unlock_migrations): PostgreSQL's advisory
    /// lock in a transaction of its own (or a savepoint), MySQL's
    /// `GET_LOCK`, SQLite's immediate transaction.
    fn lock_migrations<C>(conn: &mut C) -> Result<Scope, InboxError>
    where
        C: LoadConnection<Backend = Self, TransactionManager = AnsiTransactionManager>;

    /// Ends what [`lock_migrations`](Self::lock_migrations) began: keeps
    /// the changes when `keep`, else undoes what it can.
    fn unlock_migrations<C>(conn: &mut C, scope: Scope, keep: bool) -> Result<(), InboxError>
    where
        C: LoadConnection<Backend = Self, TransactionManager = AnsiTransactionManager>;
}

#[cfg(feature = "_any-backend")]
pub(crate) use errors::database_error;

/// The statements that bound a claim's wait (see
/// [`Internals::wait_bound`]).
#[cfg_attr(not(feature = "async"), allow(dead_code))] // read by the async driver
pub(crate) struct WaitBound {
    /// Sets the bound, remembering the connection's own.
    pub(crate) set: String,
    /// Restores the connection's own.
    pub(crate) restore: &'static str,
    /// Whether the rollback that follows a failed claim restores it (a
    /// transaction-local setting), so that `restore` runs only after a
    /// claim that worked: the failed transaction refuses statements.
    pub(crate) rollback_restores: bool,
}

/// Records in diesel's transaction manager a transaction boundary the
/// runtime sent itself (MySQL's cached `BEGIN`/`COMMIT`/`ROLLBACK`,
/// PostgreSQL's async guarded `COMMIT`); the sync and the async managers
/// share this status type.
#[cfg(any(feature = "mysql", all(feature = "postgres", feature = "async")))]
pub(crate) fn record_boundary(
    status: &mut diesel::connection::TransactionManagerStatus,
    change: diesel::connection::TransactionDepthChange,
) -> QueryResult<()> {
    match status {
        diesel::connection::TransactionManagerStatus::Valid(status) => {
            status.change_transaction_depth(change)
        }
        diesel::connection::TransactionManagerStatus::InError => {
            Err(Error::BrokenTransactionManager)
        }
    }
}

/// Transient on any enabled backend, for errors whose backend is not known
/// (`RetryableError for diesel::result::Error`).
pub(crate) fn is_transient(error: &Error) -> bool {
    #[cfg(feature = "postgres")]
    if <diesel::pg::Pg as Internals>::is_transient(error) {
        return true;
    }
    #[cfg(feature = "mysql")]
    if <diesel::mysql::Mysql as Internals>::is_transient(error) {
        return true;
    }
    #[cfg(feature = "sqlite")]
    if <diesel::sqlite::Sqlite as Internals>::is_transient(error) {
        return true;
    }
    let _ = error;
    false
}

/// The schema of a backend in pieces, each made by `migrate` where the
/// catalog lacks it (a database of an older release, or one an operator
/// dropped a table or a column of), so that any state `migrate` or its
/// steps can leave converges to the current schema. A piece's statements
/// are idempotent where the backend can say so (`IF NOT EXISTS`); the
/// catalog decides the rest.
pub(crate) struct Schema {
    /// Creates `inbox_messages`, its `received_at` index and the record of
    /// the schema version.
    pub(crate) inbox: &'static str,
    /// The nullable columns schema 2 added to `inbox_messages`: each name
    /// and the statement that adds it.
    pub(crate) inbox_columns: [(&'static str, &'static str); 2],
    /// Creates `inbox_attempts` (schema 2).
    pub(crate) attempts: &'static str,
    /// Creates `outbox_messages` (schema 3) with schema 5's `txid`.
    pub(crate) outbox: &'static str,
    /// Adds `txid` (schema 5) to an `outbox_messages` of schema 3 or 4.
    pub(crate) outbox_txid: &'static str,
    /// Creates `inbox_positions` (schema 4).
    pub(crate) positions: &'static str,
    /// What the guarded statements raise their refusals with
    /// (PostgreSQL's view `diesel_inbox_refused` and its function
    /// `diesel_inbox_refuse`): the view's name and the statements that
    /// create both. Optional for them: without it, a refusal is a failed
    /// cast that quotes the same text.
    pub(crate) refuse: Option<(&'static str, &'static str)>,
}

/// The inbox DDL of each backend, as [`InboxBackend::DDL`] gives it, for a
/// migration tool of your own (for example a diesel migration's `up.sql`).
/// It creates the table, its index and the record of the schema version;
/// call [`migrate`](crate::migrate) at start-up anyway to verify the table.
///
/// ```
/// assert!(diesel_inbox::ddl::SQLITE.contains("PRIMARY KEY (consumer, message_id)"));
/// ```
pub mod ddl {
    /// PostgreSQL.
    pub const POSTGRES: &str = concat!(
        include_str!("postgres.sql"),
        include_str!("postgres_attempts.sql"),
        include_str!("postgres_outbox.sql"),
        include_str!("postgres_positions.sql"),
        include_str!("postgres_refuse.sql")
    );
    /// MySQL 8 and MariaDB 10.5+. Keys are `VARBINARY` so that they compare
    /// byte for byte (the default collations ignore case, accents and
    /// trailing spaces). The attempts' table comes first: DDL is not
    /// transactional here, and the version recorded with `inbox_messages`
    /// must not precede it; so do the outbox's and the positions'.
    pub const MYSQL: &str = concat!(
        include_str!("mysql_attempts.sql"),
        // The outbox with schema 5's column in its CREATE (an `ALTER`
        // would fail where two creates run at once: Galera's `GET_LOCK` is
        // per node).
        include_str!("mysql_outbox.sql"),
        include_str!("mysql_positions.sql"),
        include_str!("mysql.sql")
    );
    /// SQLite.
    pub const SQLITE: &str = concat!(
        include_str!("sqlite.sql"),
        include_str!("sqlite_attempts.sql"),
        include_str!("sqlite_outbox.sql"),
        include_str!("sqlite_positions.sql")
    );
}
