//! MySQL 8 and MariaDB: what this backend knows. The claim is `INSERT
//! IGNORE` (diesel connects with `CLIENT_FOUND_ROWS`, so `ON DUPLICATE KEY`
//! reports a duplicate as a write) over `VARBINARY(255)` keys that compare
//! byte for byte; deadlocks (1213) and lock wait timeouts (1205) are
//! transient; DDL commits implicitly, so `migrate` refuses to run inside a
//! transaction and serializes itself with `GET_LOCK`. This file holds the
//! backend's constants and error classes (`Internals`), the catalog query
//! and table checks (`Dialect`), and the async connection's impls.

use super::shape::{parse_version_marker, version_marker, CatalogRow, Dialect};
use super::transaction::Scope;
use super::{database_error, Catalog, InboxBackend, Internals};
use crate::error::{InboxError, TableProblem};
use crate::prerequisite::Prerequisite;
use diesel::connection::{
    AnsiTransactionManager, Connection, LoadConnection, TransactionDepthChange, TransactionManager,
};
use diesel::mysql::Mysql;
use diesel::prelude::*;
use diesel::result::{DatabaseErrorKind, Error};
use diesel::sql_types::{Integer, Nullable};

/// What `information_schema` says about `inbox_messages` in the current
/// database, in the rows [`Dialect`] describes (every value cast to the
/// connection's character set, so that the branches of the UNION agree):
/// - `table`: a = table type, b = engine, c = the table comment;
/// - `column`: a = data type, b = maximum length in characters, c = collation;
/// - indexes: b = `prefix` when a column is indexed by a prefix only.
const CATALOG: &str = r#"
SELECT CAST('table' AS CHAR) AS kind, CAST(TABLE_NAME AS CHAR) AS name,
       CAST(TABLE_TYPE AS CHAR) AS a, CAST(ENGINE AS CHAR) AS b,
       CAST(TABLE_COMMENT AS CHAR) AS c, CAST(NULL AS CHAR) AS d
FROM information_schema.TABLES
WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'inbox_messages'
UNION ALL
SELECT CAST('column' AS CHAR), CAST(COLUMN_NAME AS CHAR), CAST(DATA_TYPE AS CHAR),
       CAST(CHARACTER_MAXIMUM_LENGTH AS CHAR), CAST(COLLATION_NAME AS CHAR),
       CAST(CONCAT_WS(',', IF(IS_NULLABLE = 'NO', 'notnull', NULL),
                      IF(COLUMN_DEFAULT IS NOT NULL OR EXTRA LIKE '%auto_increment%'
                         OR EXTRA LIKE '%GENERATED%', 'default', NULL)) AS CHAR)
FROM information_schema.COLUMNS
WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'inbox_messages'
UNION ALL
SELECT CAST(IF(INDEX_NAME = 'PRIMARY', 'primary', IF(NON_UNIQUE = 0, 'unique', 'index')) AS CHAR),
       CAST(INDEX_NAME AS CHAR),
       CAST(GROUP_CONCAT(COLUMN_NAME ORDER BY SEQ_IN_INDEX SEPARATOR ',') AS CHAR),
       CAST(IF(MAX(SUB_PART) IS NOT NULL, 'prefix', NULL) AS CHAR), CAST(NULL AS CHAR),
       CAST(NULL AS CHAR)
FROM information_schema.STATISTICS
WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'inbox_messages'
GROUP BY INDEX_NAME, NON_UNIQUE
UNION ALL
SELECT CAST(IF(CONSTRAINT_TYPE = 'FOREIGN KEY', 'foreign key', 'check constraint') AS CHAR),
       CAST(CONSTRAINT_NAME AS CHAR), NULL, NULL, NULL, NULL
FROM information_schema.TABLE_CONSTRAINTS
WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'inbox_messages'
  AND CONSTRAINT_TYPE IN ('FOREIGN KEY', 'CHECK')
UNION ALL
SELECT CAST('trigger' AS CHAR), CAST(TRIGGER_NAME AS CHAR), NULL, NULL, NULL, NULL
FROM information_schema.TRIGGERS
WHERE EVENT_OBJECT_SCHEMA = DATABASE() AND EVENT_OBJECT_TABLE = 'inbox_messages'
  AND EVENT_MANIPULATION = 'INSERT'
UNION ALL
SELECT CAST('attempts' AS CHAR), CAST(COLUMN_NAME AS CHAR), NULL, NULL, NULL, NULL
FROM information_schema.COLUMNS
WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'inbox_attempts'
UNION ALL
SELECT CAST('outbox' AS CHAR), CAST(COLUMN_NAME AS CHAR), NULL, NULL, NULL, NULL
FROM information_schema.COLUMNS
WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'outbox_messages'
UNION ALL
SELECT CAST('positions' AS CHAR), CAST(COLUMN_NAME AS CHAR), NULL, NULL, NULL, NULL
FROM information_schema.COLUMNS
WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'inbox_positions'
UNION ALL
SELECT CAST('setting' AS CHAR), CAST('innodb_flush_log_at_trx_commit' AS CHAR),
       CAST(@@GLOBAL.innodb_flush_log_at_trx_commit AS CHAR), NULL, NULL, NULL
"#;

/// `migrate`'s lock: `GET_LOCK` (node-local on Galera), and its release.
const MIGRATE_LOCK: &str = "GET_LOCK('diesel_inbox_migrate', 60)";
const MIGRATE_UNLOCK: &str = "DO RELEASE_LOCK('diesel_inbox_migrate')";

fn lock_refused() -> InboxError {
    InboxError::MigrationFailed(Error::QueryBuilderError(
        "another migrate() held the lock `diesel_inbox_migrate` for 60 s".into(),
    ))
}

/// `BEGIN`, `COMMIT` and `ROLLBACK` as statements diesel prepares once per
/// connection and caches: one round trip each. diesel's transaction manager
/// sends them with `batch_execute`, which on MySQL switches multi-statement
/// mode on and off around each (`COM_SET_OPTION`): three round trips.
/// diesel's transaction depth is kept in step by hand, so a transaction the
/// body opens is still a savepoint. A server that refuses one of them as a
/// prepared statement gets diesel's own path instead.
mod control {
    use diesel::mysql::Mysql;
    use diesel::query_builder::{AstPass, QueryFragment, QueryId};
    use diesel::QueryResult;
    use std::marker::PhantomData;

    /// What a [`Control`] statement says.
    pub(super) trait Kind: 'static {
        const SQL: &'static str;
    }

    /// `BEGIN`.
    pub(super) struct Begin;
    /// `COMMIT`.
    pub(super) struct Commit;
    /// `ROLLBACK`.
    pub(super) struct Rollback;

    impl Kind for Begin {
        const SQL: &'static str = "BEGIN";
    }
    impl Kind for Commit {
        const SQL: &'static str = "COMMIT";
    }
    impl Kind for Rollback {
        const SQL: &'static str = "ROLLBACK";
    }

    /// A transaction boundary as a statement of its own, with a static
    /// query id: prepared once per connection and cached.
    pub(super) struct Control<K>(PhantomData<K>);

    /// The statement of kind `K`.
    pub(super) fn statement<K: Kind>() -> Control<K> {
        Control(PhantomData)
    }

    impl<K: Kind> QueryFragment<Mysql> for Control<K> {
        fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, Mysql>) -> QueryResult<()> {
            out.push_sql(K::SQL);
            Ok(())
        }
    }

    impl<K: Kind> QueryId for Control<K> {
        type QueryId = Self;
        const HAS_STATIC_QUERY_ID: bool = true;
    }

    impl<K, Conn> diesel::RunQueryDsl<Conn> for Control<K> {}
}

/// Whether the server refused a statement as a prepared statement
/// (error 1295).
fn not_preparable(error: &Error) -> bool {
    database_error(error)
        .is_some_and(|(_, message)| message.contains("prepared statement protocol"))
}

/// Records a transaction boundary the runtime sent itself.
fn change_depth<C>(conn: &mut C, change: TransactionDepthChange) -> QueryResult<()>
where
    C: Connection<TransactionManager = AnsiTransactionManager>,
{
    super::record_boundary(
        AnsiTransactionManager::transaction_manager_status_mut(conn),
        change,
    )
}

/// Rolls back with the cached `ROLLBACK`; the manager is marked broken if
/// that fails (pools discard the connection; the server rolls back when it
/// closes).
fn rollback_cached<C>(conn: &mut C) -> QueryResult<()>
where
    C: Connection<Backend = Mysql, TransactionManager = AnsiTransactionManager>,
{
    match control::statement::<control::Rollback>().execute(conn) {
        Ok(_) => change_depth(conn, TransactionDepthChange::DecreaseDepth),
        Err(e) if not_preparable(&e) => AnsiTransactionManager::rollback_transaction(conn),
        Err(e) if ended_by_server(&e) => {
            *AnsiTransactionManager::transaction_manager_status_mut(conn) = Default::default();
            Ok(())
        }
        Err(e) => {
            AnsiTransactionManager::transaction_manager_status_mut(conn).set_in_error();
            Err(e)
        }
    }
}

/// Whether a failed `ROLLBACK` says the server had rolled the transaction
/// back already: Galera reports a brute-force abort (another node's write
/// won certification) at the next statement, which can be the `ROLLBACK`
/// itself, as error 1213. Nothing is left to undo, so the connection is
/// outside any transaction, not broken.
pub(crate) fn ended_by_server(error: &Error) -> bool {
    Mysql::ends_transaction(error)
}

impl InboxBackend for Mysql {
    const DDL: &'static str = super::ddl::MYSQL;
}

impl Internals for Mysql {
    const BEGIN: &'static str = "BEGIN";
    // MariaDB's `@@in_transaction` (no privilege needed), where autocommit
    // is on: without it, the statement after a rollback opens a new
    // transaction, which the variable cannot tell from the call's. MySQL
    // has no such variable and skips the `/*M!` comment: NULL, unknown.
    const OPEN_PROBE: Option<&'static str> =
        Some("CAST(COALESCE(/*M! IF(@@autocommit, @@in_transaction, NULL), */ NULL) AS SIGNED)");
    const KEY_TYPE: &'static str = "VARBINARY(255) NOT NULL";
    const DDL_COMMITS: bool = true;
    // Nullable columns at the end: an instant ALTER on MySQL 8.0.12+ and
    // MariaDB 10.3+ (no table rebuild).
    const SCHEMA: super::Schema = super::Schema {
        inbox: include_str!("mysql.sql"),
        inbox_columns: [
            (
                "fingerprint",
                "ALTER TABLE inbox_messages ADD COLUMN fingerprint VARBINARY(64) NULL;",
            ),
            (
                "result",
                "ALTER TABLE inbox_messages ADD COLUMN result LONGBLOB NULL;",
            ),
        ],
        attempts: include_str!("mysql_attempts.sql"),
        outbox: include_str!("mysql_outbox.sql"),
        outbox_txid: include_str!("mysql_outbox_txid.sql"),
        positions: include_str!("mysql_positions.sql"),
        refuse: None,
    };

    fn claim<C>(
        conn: &mut C,
        consumer_name: &str,
        key: &str,
        fingerprint_bytes: Option<&[u8]>,
    ) -> QueryResult<bool>
    where
        C: LoadConnection<Backend = Self>,
    {
        super::execute::claim(conn, consumer_name, key, fingerprint_bytes)
    }

    fn lookup<C>(
        conn: &mut C,
        consumer_name: &str,
        key: &str,
    ) -> QueryResult<Option<crate::rows::StoredRow>>
    where
        C: LoadConnection<Backend = Self>,
    {
        super::execute::lookup(conn, consumer_name, key)
    }

    fn claim_batch<C>(
        conn: &mut C,
        consumer_name: &str,
        keys: &[&str],
        fingerprints: Option<&[&[u8]]>,
    ) -> QueryResult<Vec<String>>
    where
        C: LoadConnection<Backend = Self>,
    {
        super::execute::claim_batch_by_lookup(conn, consumer_name, keys, fingerprints)
    }

    fn begin_top_level<C>(conn: &mut C) -> QueryResult<()>
    where
        C: Connection<Backend = Self, TransactionManager = AnsiTransactionManager>,
    {
        if AnsiTransactionManager::transaction_manager_status_mut(conn)
            .transaction_depth()?
            .is_some()
        {
            return Err(Error::AlreadyInTransaction);
        }
        match control::statement::<control::Begin>().execute(conn) {
            Ok(_) => change_depth(conn, TransactionDepthChange::IncreaseDepth),
            Err(e) if not_preparable(&e) => {
                AnsiTransactionManager::begin_transaction_sql(conn, Self::BEGIN)
            }
            Err(e) => Err(e),
        }
    }

    fn rollback_top_level<C>(conn: &mut C) -> QueryResult<()>
    where
        C: Connection<Backend = Self, TransactionManager = AnsiTransactionManager>,
    {
        rollback_cached(conn)
    }

    /// The cached `COMMIT`; on failure the transaction is rolled back, as
    /// diesel's own commit does, and both errors are kept if that fails too.
    fn commit_top_level<C>(conn: &mut C) -> QueryResult<()>
    where
        C: Connection<Backend = Self, TransactionManager = AnsiTransactionManager>,
    {
        match control::statement::<control::Commit>().execute(conn) {
            Ok(_) => change_depth(conn, TransactionDepthChange::DecreaseDepth),
            Err(e) if not_preparable(&e) => AnsiTransactionManager::commit_transaction(conn),
            Err(commit_error) => match rollback_cached(conn) {
                Ok(()) => Err(commit_error),
                Err(rollback_error) => Err(Error::RollbackErrorOnCommit {
                    rollback_error: Box::new(rollback_error),
                    commit_error: Box::new(commit_error),
                }),
            },
        }
    }

    fn is_transient(error: &Error) -> bool {
        // Sync diesel maps 1213 (deadlock, and a Galera certification
        // conflict or brute-force abort) to SerializationFailure; diesel-async
        // keeps no error number, and 1205 (lock wait timeout) has no kind on
        // either: only the message text is left, read in English (MariaDB
        // words 1213 in English in every language, 1205 not). Under another
        // `lc_messages` an unrecognised error is returned, not retried;
        // whether a body's swallowed error ended the transaction is read
        // from the server's state instead (`OPEN_PROBE`).
        match database_error(error) {
            Some((DatabaseErrorKind::SerializationFailure, _)) => true,
            Some((_, message)) => {
                message.contains("Deadlock found")
                    || message.contains("Lock wait timeout exceeded")
                    || message.contains("try restarting transaction")
                    || message.contains("WSREP detected deadlock/conflict")
            }
            None => false,
        }
    }

    /// The session's `innodb_lock_wait_timeout` (whole seconds, rounded
    /// up, at least 1: MySQL's minimum), the caller's own remembered in a
    /// user variable and restored after the claim whether it worked or
    /// not (a session setting outlives the rollback).
    fn wait_bound(wait: std::time::Duration) -> Option<super::WaitBound> {
        let seconds = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
        let seconds = seconds.clamp(1, 1_073_741_824);
        Some(super::WaitBound {
            set: format!(
                "SET @diesel_inbox_lock_wait = @@SESSION.innodb_lock_wait_timeout, \
                 SESSION innodb_lock_wait_timeout = {seconds}"
            ),
            restore: "SET SESSION innodb_lock_wait_timeout = @diesel_inbox_lock_wait",
            rollback_restores: false,
        })
    }

    fn is_wait_timeout(error: &Error) -> bool {
        // 1205.
        database_error(error)
            .is_some_and(|(_, message)| message.contains("Lock wait timeout exceeded"))
    }

    fn ends_transaction(error: &Error) -> bool {
        // InnoDB rolls back the whole transaction on a deadlock (and Galera
        // on a certification conflict); a lock wait timeout undoes only the
        // statement.
        Self::is_transient(error)
            && database_error(error)
                .is_some_and(|(_, message)| !message.contains("Lock wait timeout exceeded"))
    }

    fn is_missing_table(error: &Error) -> bool {
        // 1146: Table 'db.inbox_messages' doesn't exist.
        database_error(error)
            .is_some_and(|(_, message)| message.contains(".inbox_messages' doesn't exist"))
    }

    // TIMESTAMP converts from the session's time zone: the epoch is UTC
    // whatever the session's zone.
    const COUNT_FAILURE: &'static str = "INSERT INTO inbox_attempts (consumer, message_id, failures, last_error) VALUES (?, ?, 1, ?) \
         ON DUPLICATE KEY UPDATE failures = failures + 1, last_error = VALUES(last_error), \
         updated_at = CURRENT_TIMESTAMP(6)";

    const RECEIVED_AT_MICROS: &'static str =
        "CAST(UNIX_TIMESTAMP(received_at) * 1000000 AS SIGNED)";
    const UPDATED_AT_MICROS: &'static str = "CAST(UNIX_TIMESTAMP(updated_at) * 1000000 AS SIGNED)";
    // In the session's time zone, as TIMESTAMP compares.
    const RECEIVED_AT_OF_MICROS: (&'static str, &'static str) = ("FROM_UNIXTIME(", " DIV 1000000)");
    const BIGINT: &'static str = "SIGNED";

    // Both sides in the session's time zone, as the column's default.
    fn cutoff_sql(older_than: std::time::Duration) -> String {
        format!(
            "(CURRENT_TIMESTAMP(6) - INTERVAL {} MICROSECOND)",
            older_than.as_micros()
        )
    }

    /// No gap locks: a purge batch locks only the rows it deletes, never
    /// the gaps new claims insert into.
    const PURGE_ISOLATION: Option<&'static str> =
        Some("SET TRANSACTION ISOLATION LEVEL READ COMMITTED");

    const NOW_MICROS: &'static str =
        "CAST(UNIX_TIMESTAMP(CURRENT_TIMESTAMP(6)) * 1000000 AS SIGNED)";
    const SKIP_LOCKED: &'static str = " FOR UPDATE SKIP LOCKED";
    const LOCK_ROW: &'static str = " FOR UPDATE";

    fn catalog<C>(conn: &mut C) -> QueryResult<Catalog>
    where
        C: LoadConnection<Backend = Self>,
    {
        crate::backend::shape::catalog(conn)
    }

    fn record_version(version: u32) -> String {
        format!(
            "ALTER TABLE inbox_messages COMMENT = '{}';",
            version_marker(version)
        )
    }

    fn lock_migrations<C>(conn: &mut C) -> Result<Scope, InboxError>
    where
        C: LoadConnection<Backend = Self, TransactionManager = AnsiTransactionManager>,
    {
        // `migrate` has refused to run inside a transaction (DDL_COMMITS).
        let locked: Option<i32> =
            diesel::select(diesel::dsl::sql::<Nullable<Integer>>(MIGRATE_LOCK)).get_result(conn)?;
        if locked != Some(1) {
            return Err(lock_refused());
        }
        // DDL commits implicitly: there is no transaction to keep.
        Ok(Scope::TopLevel)
    }

    fn unlock_migrations<C>(conn: &mut C, _scope: Scope, _keep: bool) -> Result<(), InboxError>
    where
        C: LoadConnection<Backend = Self, TransactionManager = AnsiTransactionManager>,
    {
        conn.batch_execute(MIGRATE_UNLOCK)?;
        Ok(())
    }
}

impl Dialect for Mysql {
    const CATALOG: &'static str = CATALOG;
    fn version(record: &str) -> Option<u32> {
        parse_version_marker(record)
    }

    fn durability(setting: &CatalogRow) -> Option<Prerequisite> {
        let value = setting.a.as_deref()?;
        match (setting.name.as_str(), value) {
            ("innodb_flush_log_at_trx_commit", "1") => Some(Prerequisite::ok(
                "innodb_flush_log_at_trx_commit",
                value,
                "InnoDB flushes its log to disk at each commit",
            )),
            ("innodb_flush_log_at_trx_commit", _) => Some(Prerequisite::warn(
                "innodb_flush_log_at_trx_commit",
                value,
                format!("innodb_flush_log_at_trx_commit is {value}: InnoDB flushes its log to disk about once a second, not at each commit, so a crash loses the last second's committed transactions (on a Galera cluster, a power loss can lose them on every node)"),
                "SET GLOBAL innodb_flush_log_at_trx_commit = 1, and innodb_flush_log_at_trx_commit = 1 in the server's configuration",
            )),
            _ => None,
        }
    }

    fn unreadable() -> Vec<Prerequisite> {
        vec![Prerequisite::unknown(
            "replication",
            "not readable",
            "with asynchronous replicas (MySQL's and MariaDB's default), a failover to one may lose commits the source acknowledged, whose messages the inbox acked to their broker; a Galera cluster replicates each commit to every node before acknowledging it",
            "on a source with replicas a failover can promote: semi-synchronous replication with the wait point AFTER_SYNC (MariaDB: rpl_semi_sync_master_enabled = ON, rpl_semi_sync_master_wait_point = AFTER_SYNC; MySQL: rpl_semi_sync_source_enabled = ON, rpl_semi_sync_source_wait_point = AFTER_SYNC) and a timeout that does not fall back to asynchronous (rpl_semi_sync_master_timeout large)",
        )]
    }

    fn table_problems(table: &CatalogRow) -> Vec<TableProblem> {
        if table.a.as_deref() != Some("BASE TABLE") {
            vec![TableProblem::new(
                format!(
                    "`inbox_messages` is not a table ({})",
                    table.a.as_deref().unwrap_or("?")
                ),
                "drop it and run migrate() to create the table",
            )]
        } else if table.b.as_deref() != Some("InnoDB") {
            vec![TableProblem::new(
                format!(
                    "the table uses the {} engine, which has no transactions: a failed handler would keep its inbox row and its message would be lost",
                    table.b.as_deref().unwrap_or("?")
                ),
                "ALTER TABLE inbox_messages ENGINE = InnoDB",
            )]
        } else {
            Vec::new()
        }
    }

    fn key_problem(column: &CatalogRow) -> Option<String> {
        let data_type = column.a.as_deref().unwrap_or("?");
        let length: u64 = column
            .b
            .as_deref()
            .and_then(|l| l.parse().ok())
            .unwrap_or(0);
        let collation = column.c.as_deref().unwrap_or("");
        match data_type {
            "varbinary" if length >= 255 => None,
            "varbinary" => Some(format!(
                "holds at most {length} bytes (VARBINARY({length})), and INSERT IGNORE cuts longer keys"
            )),
            "varchar" if length < 255 => Some(format!(
                "holds at most {length} characters (VARCHAR({length})), and INSERT IGNORE cuts longer keys"
            )),
            "varchar" if !collation.starts_with("utf8mb4_") => Some(format!(
                "uses collation {collation}, whose character set cannot store every UTF-8 key (INSERT IGNORE replaces what it cannot store)"
            )),
            // NO PAD binary collations compare byte for byte: MariaDB's
            // `*_nopad_bin`, MySQL 8's `*_0900_bin`.
            "varchar" if collation.ends_with("_nopad_bin") || collation.ends_with("_0900_bin") => None,
            "varchar" if collation.ends_with("_bin") => Some(format!(
                "uses collation {collation}, which pads: `key ` and `key` compare equal"
            )),
            "varchar" => Some(format!(
                "uses collation {collation}, which ignores case, accents or trailing spaces"
            )),
            "char" | "binary" => Some(format!(
                "is {}, which pads every value to its full length",
                data_type.to_uppercase()
            )),
            other => Some(format!("has type {other}, not VARBINARY")),
        }
    }

    fn index_problem(index: &CatalogRow) -> Option<String> {
        (index.b.as_deref() == Some("prefix"))
            .then(|| "covers only a prefix of a column".to_string())
    }
}

impl super::statements::CountedClaim for Mysql {
    const INSERT: &'static str = "INSERT IGNORE INTO";
    const CONFLICT: &'static str = "";
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error(kind: DatabaseErrorKind, message: &str) -> Error {
        Error::DatabaseError(kind, Box::new(message.to_string()))
    }

    #[test]
    fn a_log_flushed_once_a_second_is_a_durability_problem() {
        use crate::backend::shape::Dialect;
        use crate::prerequisite::Verdict;
        let row = |name: &str, value: &str| CatalogRow {
            kind: "setting".into(),
            name: name.into(),
            a: Some(value.into()),
            b: None,
            c: None,
            d: None,
        };
        let setting = "innodb_flush_log_at_trx_commit";
        let flushed = Mysql::durability(&row(setting, "1")).expect("judged");
        assert_eq!(flushed.verdict, Verdict::Ok);
        for value in ["0", "2"] {
            let said = Mysql::durability(&row(setting, value)).expect("judged");
            assert_eq!(said.verdict, Verdict::Warn);
            assert!(said.detail.contains(&format!("is {value}")), "{said}");
            assert!(said.fix.as_deref().unwrap_or("").contains("= 1"), "{said}");
        }
        assert!(Mysql::durability(&row("other", "0")).is_none());
    }

    #[test]
    fn transient_errors_are_deadlocks_lock_timeouts_and_galera_conflicts() {
        use DatabaseErrorKind::*;
        let deadlock = "Deadlock found when trying to get lock; try restarting transaction";
        assert!(Mysql::is_transient(&error(SerializationFailure, deadlock)));
        assert!(Mysql::is_transient(&error(Unknown, deadlock)));
        assert!(Mysql::is_transient(&error(
            Unknown,
            "Lock wait timeout exceeded; try restarting transaction"
        )));
        assert!(Mysql::is_transient(&error(
            Unknown,
            "WSREP detected deadlock/conflict and aborted the transaction. Try restarting the transaction"
        )));
        assert!(!Mysql::is_transient(&error(
            UniqueViolation,
            "Duplicate entry"
        )));
    }

    #[test]
    fn privilege_errors_are_recognised_by_their_message() {
        use DatabaseErrorKind::Unknown;
        assert!(crate::backend::errors::mysql_privilege(&error(
            Unknown,
            "CREATE command denied to user 'app'@'localhost' for table `inbox_messages`"
        )));
        assert!(crate::backend::errors::mysql_privilege(&error(
            Unknown,
            "Access denied for user 'app'@'%' to database 'orders'"
        )));
        assert!(!crate::backend::errors::mysql_privilege(&error(
            Unknown,
            "Table 'x' doesn't exist"
        )));
    }
}

#[cfg(feature = "async")]
mod asynchronous {
    use super::*;
    use crate::backend::asynchronous::{AsyncInboxConnection, AsyncInternals, AsyncMigration};
    use crate::backend::transaction::{ansi, Scope};
    use diesel_async::{AsyncMysqlConnection, SimpleAsyncConnection};

    impl crate::backend::execute::asynchronous::RunsStatements for AsyncMysqlConnection {}

    impl AsyncInboxConnection for AsyncMysqlConnection {}

    impl AsyncInternals for AsyncMysqlConnection {
        async fn inbox_begin(&mut self) -> Result<Scope, (Scope, Error)> {
            ansi::begin(self).await
        }

        async fn inbox_claim(
            &mut self,
            consumer_name: &str,
            key: &str,
            fingerprint_bytes: Option<&[u8]>,
        ) -> QueryResult<bool> {
            crate::backend::execute::asynchronous::claim(
                self,
                consumer_name,
                key,
                fingerprint_bytes,
            )
            .await
        }

        async fn inbox_lookup(
            &mut self,
            consumer_name: &str,
            key: &str,
        ) -> QueryResult<Option<crate::rows::StoredRow>> {
            crate::backend::execute::asynchronous::lookup(self, consumer_name, key).await
        }

        /// At top level, `BEGIN` and the wait bound in one round trip (one
        /// text batch: mysql_async's connections take several statements),
        /// then the claim and the restore. Inside the caller's
        /// transaction, the general sequence.
        async fn inbox_begin_claim_waiting(
            &mut self,
            consumer_name: &str,
            key: &str,
            fingerprint_bytes: Option<&[u8]>,
            wait: std::time::Duration,
        ) -> crate::backend::asynchronous::BeginClaim {
            use crate::backend::asynchronous::{begin_claim_waiting, claim_bounded};
            let bound = Mysql::wait_bound(wait).expect("MySQL bounds a claim's wait");
            if crate::backend::transaction::transaction_open_async(self) {
                return begin_claim_waiting(self, consumer_name, key, fingerprint_bytes, wait)
                    .await;
            }
            // `BEGIN` first: a failed batch stops at its failed statement,
            // and a `SET` that fails changes none of its variables, so a
            // failed batch leaves no bound to restore.
            if let Err(e) = ansi::opening(self) {
                return (Err(e), None);
            }
            let begun = self.batch_execute(&format!("BEGIN; {}", bound.set)).await;
            if let Err(e) = ansi::opened(self, begun).await {
                return (Err(e), None);
            }
            let claimed = claim_bounded(self, &bound, consumer_name, key, fingerprint_bytes).await;
            (Ok(Scope::TopLevel), Some(claimed))
        }

        async fn inbox_claim_batch(
            &mut self,
            consumer_name: &str,
            keys: &[&str],
            fingerprints: Option<&[&[u8]]>,
        ) -> QueryResult<Vec<String>> {
            crate::backend::execute::asynchronous::claim_batch_by_lookup(
                self,
                consumer_name,
                keys,
                fingerprints,
            )
            .await
        }

        async fn inbox_commit(&mut self, _scope: Scope) -> QueryResult<()> {
            ansi::commit(self).await
        }

        async fn inbox_rollback(&mut self) {
            ansi::rollback_unless_ended(self, super::ended_by_server).await
        }
    }

    impl AsyncMigration for AsyncMysqlConnection {
        async fn catalog(&mut self) -> QueryResult<Catalog> {
            crate::backend::shape::catalog_async(self).await
        }

        async fn lock(&mut self) -> Result<Scope, InboxError> {
            let locked: Option<i32> = diesel_async::RunQueryDsl::get_result(
                diesel::select(diesel::dsl::sql::<Nullable<Integer>>(MIGRATE_LOCK)),
                self,
            )
            .await?;
            if locked != Some(1) {
                return Err(lock_refused());
            }
            // DDL commits implicitly: there is no transaction to keep.
            Ok(Scope::TopLevel)
        }

        async fn unlock(&mut self, _scope: Scope, _keep: bool) -> Result<(), InboxError> {
            self.batch_execute(MIGRATE_UNLOCK).await?;
            Ok(())
        }
    }
}
