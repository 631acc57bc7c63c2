//! SQLite: what this backend knows. A top-level call begins with `BEGIN
//! IMMEDIATE` (a deferred transaction that later writes fails at once with
//! "database is locked"), the claim is `INSERT .. ON CONFLICT DO NOTHING`,
//! busy and locked errors are transient, and the async connection
//! (`SyncConnectionWrapper`) hands each step to its blocking thread whole.
//! This file holds the backend's constants and error classes
//! (`Internals`), the schema query and table checks (`Dialect`), and the
//! async connection's impls.

use super::shape::{CatalogRow, Dialect};
use super::transaction::{begin, end_migrations, Scope};
use super::{database_error, Catalog, InboxBackend, Internals};
use crate::error::{InboxError, TableProblem};
use crate::prerequisite::Prerequisite;
use diesel::connection::{AnsiTransactionManager, LoadConnection};
use diesel::prelude::*;
use diesel::result::Error;
use diesel::sqlite::Sqlite;

/// What SQLite's schema says about `inbox_messages`, in the rows
/// [`Dialect`] describes:
/// - `table`: a = `table` or `view`, c = the SQL of the view
///   `inbox_schema_version`;
/// - `column`: a = declared type, c = the collation the primary key
///   compares it with;
/// - indexes: a = columns (`<expr>` for an expression), b = `partial`; an
///   INTEGER PRIMARY KEY (the rowid, which has no index) as a `primary` row.
const CATALOG: &str = r#"
SELECT 'table' AS kind, name, type AS a, NULL AS b,
       (SELECT sql FROM sqlite_master
         WHERE type = 'view' AND name = 'inbox_schema_version') AS c,
       NULL AS d
FROM sqlite_master WHERE name = 'inbox_messages' AND type IN ('table', 'view')
UNION ALL
SELECT 'column', c.name, c.type, NULL,
       (SELECT x.coll FROM pragma_index_list('inbox_messages') il,
                           pragma_index_xinfo(il.name) x
         WHERE il.origin = 'pk' AND x.key = 1 AND x.name = c.name),
       rtrim(CASE WHEN c."notnull" THEN 'notnull,' ELSE '' END ||
             CASE WHEN c.dflt_value IS NOT NULL OR c.hidden IN (2, 3) THEN 'default' ELSE '' END, ',')
FROM pragma_table_xinfo('inbox_messages') c
UNION ALL
SELECT CASE WHEN il.origin = 'pk' THEN 'primary' WHEN il."unique" THEN 'unique' ELSE 'index' END,
       il.name,
       (SELECT group_concat(coalesce(x.name, '<expr>'), ',')
          FROM (SELECT name FROM pragma_index_xinfo(il.name) WHERE key = 1 ORDER BY seqno) x),
       CASE WHEN il.partial THEN 'partial' END, NULL, NULL
FROM pragma_index_list('inbox_messages') il
UNION ALL
SELECT 'primary', 'rowid',
       (SELECT group_concat(k.name, ',')
          FROM (SELECT name FROM pragma_table_xinfo('inbox_messages') WHERE pk > 0 ORDER BY pk) k),
       NULL, NULL, NULL
WHERE EXISTS (SELECT 1 FROM pragma_table_xinfo('inbox_messages') WHERE pk > 0)
  AND NOT EXISTS (SELECT 1 FROM pragma_index_list('inbox_messages') WHERE origin = 'pk')
UNION ALL
SELECT DISTINCT 'foreign key', 'to ' || "table", NULL, NULL, NULL, NULL
FROM pragma_foreign_key_list('inbox_messages')
UNION ALL
SELECT 'trigger', name, NULL, NULL, NULL, NULL
FROM sqlite_master
WHERE type = 'trigger' AND tbl_name = 'inbox_messages'
  AND instr(upper(substr(sql, 1, instr(upper(sql), ' ON '))), 'INSERT') > 0
UNION ALL
SELECT 'attempts', name, NULL, NULL, NULL, NULL FROM pragma_table_xinfo('inbox_attempts')
UNION ALL
SELECT 'outbox', name, NULL, NULL, NULL, NULL FROM pragma_table_xinfo('outbox_messages')
UNION ALL
SELECT 'positions', name, NULL, NULL, NULL, NULL FROM pragma_table_xinfo('inbox_positions')
"#;

impl InboxBackend for Sqlite {
    const DDL: &'static str = super::ddl::SQLITE;
}

impl Internals for Sqlite {
    // A deferred BEGIN that later writes fails at once with "database is
    // locked", whatever the busy timeout: take the write lock up front.
    const BEGIN: &'static str = "BEGIN IMMEDIATE";
    const KEY_TYPE: &'static str = "VARCHAR(255) NOT NULL with the BINARY collation (the default)";
    const CHECK_SHAPE_AFTER_CLAIM: bool = true;
    // Nullable columns without a default: a change of the schema text only.
    const SCHEMA: super::Schema = super::Schema {
        inbox: include_str!("sqlite.sql"),
        inbox_columns: [
            (
                "fingerprint",
                "ALTER TABLE inbox_messages ADD COLUMN fingerprint BLOB;",
            ),
            (
                "result",
                "ALTER TABLE inbox_messages ADD COLUMN result BLOB;",
            ),
        ],
        attempts: include_str!("sqlite_attempts.sql"),
        outbox: include_str!("sqlite_outbox.sql"),
        outbox_txid: include_str!("sqlite_outbox_txid.sql"),
        positions: include_str!("sqlite_positions.sql"),
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

    fn is_transient(error: &Error) -> bool {
        // SQLITE_BUSY and SQLITE_LOCKED, by their message; and diesel's
        // serialization-failure kind, which the runtime gives a batch claim
        // that lost a race to a concurrent one.
        database_error(error).is_some_and(|(kind, message)| {
            kind == diesel::result::DatabaseErrorKind::SerializationFailure
                || message.contains("database is locked")
                || message.contains("database table is locked")
        })
    }

    fn is_wait_timeout(error: &Error) -> bool {
        // SQLITE_BUSY at `BEGIN IMMEDIATE`, once the busy timeout the
        // bound set ran out.
        database_error(error).is_some_and(|(_, message)| message.contains("database is locked"))
    }

    fn is_missing_table(error: &Error) -> bool {
        database_error(error)
            .is_some_and(|(_, message)| message.contains("no such table: inbox_messages"))
    }

    // `received_at` is CURRENT_TIMESTAMP's text, UTC, to the second.
    const COUNT_FAILURE: &'static str = "INSERT INTO inbox_attempts (consumer, message_id, failures, last_error) VALUES (?, ?, 1, ?) \
         ON CONFLICT (consumer, message_id) DO UPDATE SET failures = failures + 1, \
         last_error = excluded.last_error, updated_at = CURRENT_TIMESTAMP";

    const RECEIVED_AT_MICROS: &'static str =
        "CAST(ROUND((julianday(received_at) - 2440587.5) * 86400000000.0) AS INTEGER)";
    const UPDATED_AT_MICROS: &'static str =
        "CAST(ROUND((julianday(updated_at) - 2440587.5) * 86400000000.0) AS INTEGER)";
    // CURRENT_TIMESTAMP's text form, to the second.
    const RECEIVED_AT_OF_MICROS: (&'static str, &'static str) =
        ("datetime(", " / 1000000, 'unixepoch')");

    // The same text form as CURRENT_TIMESTAMP, so the two compare as text.
    fn cutoff_sql(older_than: std::time::Duration) -> String {
        format!(
            "datetime('now', '-{}.{:06} seconds')",
            older_than.as_secs(),
            older_than.subsec_micros()
        )
    }

    const NOW_MICROS: &'static str =
        "CAST((julianday('now') - 2440587.5) * 86400000000.0 AS INTEGER)";
    const SKIP_LOCKED: &'static str = "";
    const LOCK_ROW: &'static str = "";

    fn catalog<C>(conn: &mut C) -> QueryResult<Catalog>
    where
        C: LoadConnection<Backend = Self>,
    {
        crate::backend::shape::catalog(conn)
    }

    fn record_version(version: u32) -> String {
        format!(
            "DROP VIEW IF EXISTS inbox_schema_version;\n\
             CREATE VIEW inbox_schema_version AS SELECT {version} AS version;"
        )
    }

    fn lock_migrations<C>(conn: &mut C) -> Result<Scope, InboxError>
    where
        C: LoadConnection<Backend = Self, TransactionManager = AnsiTransactionManager>,
    {
        // The immediate transaction serializes concurrent runs; SQLite DDL
        // is transactional.
        begin(conn).map_err(|(_, e)| InboxError::Database(e))
    }

    fn unlock_migrations<C>(conn: &mut C, scope: Scope, keep: bool) -> Result<(), InboxError>
    where
        C: LoadConnection<Backend = Self, TransactionManager = AnsiTransactionManager>,
    {
        end_migrations(conn, scope, keep)
    }
}

impl Dialect for Sqlite {
    const CATALOG: &'static str = CATALOG;
    fn unreadable() -> Vec<Prerequisite> {
        vec![Prerequisite::unknown(
            "synchronous",
            "set per connection",
            "PRAGMA synchronous is a setting of each connection your code opens, not of the file: FULL keeps every commit through a power loss; NORMAL in WAL mode may lose the last commits",
            "PRAGMA synchronous = FULL on each connection (diesel: in your connection customizer or after establish)",
        )]
    }
    /// The version in `CREATE VIEW inbox_schema_version AS SELECT 1 AS version`.
    fn version(record: &str) -> Option<u32> {
        let mut words = record.split_whitespace();
        words.find(|w| w.eq_ignore_ascii_case("SELECT"))?;
        words.next()?.parse().ok()
    }

    fn table_problems(table: &CatalogRow) -> Vec<TableProblem> {
        if table.a.as_deref() == Some("table") {
            return Vec::new();
        }
        vec![TableProblem::new(
            "`inbox_messages` is a view, not a table",
            "drop it and run migrate() to create the table",
        )]
    }

    fn key_problem(column: &CatalogRow) -> Option<String> {
        affinity_problem(column.a.as_deref().unwrap_or(""))
            .or_else(|| collation_problem(column.c.as_deref()?))
    }

    fn index_problem(index: &CatalogRow) -> Option<String> {
        if index.b.is_some() {
            Some("is partial (it has a WHERE clause)".to_string())
        } else if index.columns().iter().any(|c| c == "<expr>") {
            Some("is on an expression".to_string())
        } else {
            None
        }
    }
}

/// SQLite converts text that looks like a number in a column of integer,
/// real or numeric affinity: `007` and `7` would become one key.
fn affinity_problem(declared: &str) -> Option<String> {
    let upper = declared.to_ascii_uppercase();
    // The affinity rules of https://sqlite.org/datatype3.html, in order.
    let affinity = if upper.contains("INT") {
        "INTEGER"
    } else if ["CHAR", "CLOB", "TEXT", "BLOB"]
        .iter()
        .any(|t| upper.contains(t))
        || upper.is_empty()
    {
        // Text affinity, or none (BLOB): text is stored as given.
        return None;
    } else if upper.contains("REAL") || upper.contains("FLOA") || upper.contains("DOUB") {
        "REAL"
    } else {
        "NUMERIC"
    };
    Some(format!(
        "is declared {declared} ({affinity} affinity), which turns numeric-looking keys into numbers (`007` and `7` become one key)"
    ))
}

fn collation_problem(collation: &str) -> Option<String> {
    match collation {
        "BINARY" => None,
        "NOCASE" => Some("compares with collation NOCASE, which ignores ASCII case".to_string()),
        "RTRIM" => Some("compares with collation RTRIM, which ignores trailing spaces".to_string()),
        other => Some(format!(
            "compares with collation {other}, not BINARY (byte for byte)"
        )),
    }
}

impl super::statements::CountedClaim for Sqlite {
    const INSERT: &'static str = "INSERT INTO";
    const CONFLICT: &'static str = " ON CONFLICT (consumer, message_id) DO NOTHING";
}

#[cfg(test)]
mod tests {
    use super::*;
    use diesel::result::DatabaseErrorKind;

    #[test]
    fn transient_errors_are_busy_and_locked() {
        let error = |message: &str| {
            Error::DatabaseError(DatabaseErrorKind::Unknown, Box::new(message.to_string()))
        };
        assert!(Sqlite::is_transient(&error("database is locked")));
        assert!(Sqlite::is_transient(&error("database table is locked")));
        assert!(!Sqlite::is_transient(&error("deadlock detected")));
    }

    #[test]
    fn the_version_view_is_parsed() {
        assert_eq!(
            Sqlite::version("CREATE VIEW inbox_schema_version AS SELECT 12 AS version"),
            Some(12)
        );
        assert_eq!(Sqlite::version("CREATE VIEW x AS SELECT 'a'"), None);
    }

    #[test]
    fn integer_and_numeric_affinities_are_refused() {
        assert!(affinity_problem("INTEGER").is_some());
        assert!(affinity_problem("NUMERIC(10)").is_some());
        assert_eq!(affinity_problem("VARCHAR(255)"), None);
        assert_eq!(affinity_problem(""), None);
    }
}

/// Runs `f` with the connection's busy timeout set to `wait` (at least
/// 1 ms: 0 would mean no wait at all), then restores the one it had.
#[cfg(feature = "async")]
fn busy_timeout<T>(
    conn: &mut diesel::SqliteConnection,
    wait: std::time::Duration,
    f: impl FnOnce(&mut diesel::SqliteConnection) -> T,
) -> QueryResult<T> {
    #[derive(diesel::QueryableByName)]
    struct BusyTimeout {
        #[diesel(sql_type = diesel::sql_types::Integer)]
        timeout: i32,
    }
    use diesel::RunQueryDsl;
    let own = diesel::sql_query("PRAGMA busy_timeout")
        .get_result::<BusyTimeout>(conn)?
        .timeout;
    let ms = wait.as_millis().clamp(1, i32::MAX as u128);
    diesel::sql_query(format!("PRAGMA busy_timeout = {ms}")).execute(conn)?;
    let out = f(conn);
    // `f` ran (a transaction may be open): its result stands; a busy
    // timeout left at `wait` only changes how long this connection waits.
    if let Err(e) = diesel::sql_query(format!("PRAGMA busy_timeout = {own}")).execute(conn) {
        tracing::warn!(target: crate::target::TARGET, error = %e, "diesel-inbox: the busy timeout could not be restored");
    }
    Ok(out)
}

#[cfg(feature = "async")]
mod asynchronous {
    //! SQLite behind diesel-async's `SyncConnectionWrapper`: every step is
    //! the sync step, run on the wrapper's blocking thread (so `BEGIN
    //! IMMEDIATE` takes the write lock up front, as on the sync path). A
    //! step handed to the blocking thread finishes even when the handler's
    //! future is dropped, so the transaction state stays consistent: each
    //! operation of `AsyncStatements` too is one hop running the sync
    //! `Statements` whole (one cached, typed statement per step), not one
    //! hop per statement through diesel-async's own execution, which would
    //! build each statement's SQL text per call and could stop between two
    //! statements of one operation.
    use super::*;
    use crate::backend::asynchronous::{
        AsyncInboxConnection, AsyncInternals, AsyncMigration, AsyncStatements, BeginClaim,
    };
    use crate::backend::transaction::{self, Scope};
    use crate::backend::Statements;
    use diesel::SqliteConnection;
    use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;

    type Wrapper = SyncConnectionWrapper<SqliteConnection>;

    impl AsyncInboxConnection for Wrapper {}

    impl AsyncInternals for Wrapper {
        async fn inbox_begin(&mut self) -> Result<Scope, (Scope, Error)> {
            self.spawn_blocking(|conn| Ok(transaction::begin(conn)))
                .await
                .unwrap_or_else(|e| Err((Scope::TopLevel, e)))
        }

        /// `BEGIN IMMEDIATE` and the claim in one hop: the write lock is
        /// held one hop less.
        async fn inbox_begin_claim(
            &mut self,
            consumer_name: &str,
            key: &str,
            fingerprint_bytes: Option<&[u8]>,
        ) -> BeginClaim {
            let (consumer_name, key) = (consumer_name.to_owned(), key.to_owned());
            let fingerprint_bytes = fingerprint_bytes.map(<[u8]>::to_vec);
            self.spawn_blocking(move |conn| {
                let begun = transaction::begin(conn);
                let claimed = begun.is_ok().then(|| {
                    Sqlite::claim(conn, &consumer_name, &key, fingerprint_bytes.as_deref())
                });
                Ok((begun, claimed))
            })
            .await
            .unwrap_or_else(|e| (Err((Scope::TopLevel, e)), None))
        }

        /// The wait for an in-flight claim is SQLite's for the write
        /// lock, at `BEGIN IMMEDIATE`: bounded by the connection's busy
        /// timeout, set to `wait` for the begin and restored after it, all
        /// in the one hop.
        async fn inbox_begin_claim_waiting(
            &mut self,
            consumer_name: &str,
            key: &str,
            fingerprint_bytes: Option<&[u8]>,
            wait: std::time::Duration,
        ) -> BeginClaim {
            let (consumer_name, key) = (consumer_name.to_owned(), key.to_owned());
            let fingerprint_bytes = fingerprint_bytes.map(<[u8]>::to_vec);
            self.spawn_blocking(move |conn| {
                let begun = match super::busy_timeout(conn, wait, transaction::begin) {
                    Ok(begun) => begun,
                    Err(e) => Err((Scope::TopLevel, e)),
                };
                let claimed = begun.is_ok().then(|| {
                    Sqlite::claim(conn, &consumer_name, &key, fingerprint_bytes.as_deref())
                });
                Ok((begun, claimed))
            })
            .await
            .unwrap_or_else(|e| (Err((Scope::TopLevel, e)), None))
        }

        async fn inbox_claim(
            &mut self,
            consumer_name: &str,
            key: &str,
            fingerprint_bytes: Option<&[u8]>,
        ) -> QueryResult<bool> {
            let (consumer_name, key) = (consumer_name.to_owned(), key.to_owned());
            let fingerprint_bytes = fingerprint_bytes.map(<[u8]>::to_vec);
            self.spawn_blocking(move |conn| {
                Sqlite::claim(conn, &consumer_name, &key, fingerprint_bytes.as_deref())
            })
            .await
        }

        async fn inbox_lookup(
            &mut self,
            consumer_name: &str,
            key: &str,
        ) -> QueryResult<Option<crate::rows::StoredRow>> {
            let (consumer_name, key) = (consumer_name.to_owned(), key.to_owned());
            self.spawn_blocking(move |conn| Sqlite::lookup(conn, &consumer_name, &key))
                .await
        }

        async fn inbox_claim_batch(
            &mut self,
            consumer_name: &str,
            keys: &[&str],
            fingerprints: Option<&[&[u8]]>,
        ) -> QueryResult<Vec<String>> {
            let consumer_name = consumer_name.to_owned();
            let keys: Vec<String> = keys.iter().map(|k| (*k).to_owned()).collect();
            let fingerprints: Option<Vec<Vec<u8>>> =
                fingerprints.map(|all| all.iter().map(|f| f.to_vec()).collect());
            self.spawn_blocking(move |conn| {
                let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
                let fingerprints: Option<Vec<&[u8]>> = fingerprints
                    .as_ref()
                    .map(|all| all.iter().map(Vec::as_slice).collect());
                Sqlite::claim_batch(conn, &consumer_name, &keys, fingerprints.as_deref())
            })
            .await
        }

        async fn inbox_commit(&mut self, scope: Scope) -> QueryResult<()> {
            self.spawn_blocking(move |conn| transaction::commit(conn, scope))
                .await
        }

        async fn inbox_rollback(&mut self) {
            let rolled_back = self
                .spawn_blocking(|conn| {
                    transaction::rollback(conn);
                    Ok(())
                })
                .await;
            if let Err(e) = rolled_back {
                tracing::warn!(target: crate::target::TARGET, error = %e, "diesel-inbox: rollback failed");
            }
        }
    }

    impl AsyncStatements for Wrapper {
        async fn inbox_stored(
            &mut self,
            consumer_name: &str,
            keys: &[&str],
        ) -> QueryResult<Vec<crate::rows::StoredRow>> {
            let consumer_name = consumer_name.to_owned();
            let keys: Vec<String> = keys.iter().map(|k| (*k).to_owned()).collect();
            self.spawn_blocking(move |conn| {
                let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
                Sqlite::stored(conn, &consumer_name, &keys)
            })
            .await
        }

        async fn inbox_attempts(
            &mut self,
            consumer_name: &str,
            key: &str,
        ) -> QueryResult<Option<crate::rows::AttemptsRow>> {
            let (consumer_name, key) = (consumer_name.to_owned(), key.to_owned());
            self.spawn_blocking(move |conn| Sqlite::attempts(conn, &consumer_name, &key))
                .await
        }

        async fn inbox_clear_attempts(
            &mut self,
            consumer_name: &str,
            key: &str,
        ) -> QueryResult<usize> {
            let (consumer_name, key) = (consumer_name.to_owned(), key.to_owned());
            self.spawn_blocking(move |conn| Sqlite::clear_attempts(conn, &consumer_name, &key))
                .await
        }

        async fn inbox_count_failure(
            &mut self,
            consumer_name: &str,
            key: &str,
            error: &str,
        ) -> QueryResult<()> {
            let (consumer_name, key, error) =
                (consumer_name.to_owned(), key.to_owned(), error.to_owned());
            self.spawn_blocking(move |conn| {
                Sqlite::count_failure(conn, &consumer_name, &key, &error)
            })
            .await
        }

        async fn inbox_store_result(
            &mut self,
            consumer_name: &str,
            key: &str,
            value: &[u8],
        ) -> QueryResult<()> {
            let (consumer_name, key, value) =
                (consumer_name.to_owned(), key.to_owned(), value.to_vec());
            self.spawn_blocking(move |conn| {
                Sqlite::store_result(conn, &consumer_name, &key, &value)
            })
            .await
        }

        async fn inbox_outbox(
            &mut self,
            op: crate::backend::outbox::Op,
        ) -> QueryResult<crate::backend::outbox::Answer> {
            self.spawn_blocking(move |conn| Sqlite::outbox(conn, op))
                .await
        }

        async fn inbox_purge_batch(
            &mut self,
            cutoff: String,
            scope: Option<String>,
            limit: i64,
        ) -> QueryResult<usize> {
            self.spawn_blocking(move |conn| {
                Sqlite::purge_batch(conn, &cutoff, scope.as_deref(), limit)
            })
            .await
        }

        async fn inbox_count_older(
            &mut self,
            cutoff: String,
            scope: Option<String>,
        ) -> QueryResult<i64> {
            self.spawn_blocking(move |conn| Sqlite::count_older(conn, &cutoff, scope.as_deref()))
                .await
        }

        async fn inbox_still_open(&mut self) -> QueryResult<Option<bool>> {
            // SQLite has no probe (`Internals::OPEN_PROBE`).
            Ok(None)
        }

        async fn inbox_entry(
            &mut self,
            consumer_name: &str,
            key: &str,
        ) -> QueryResult<Option<crate::rows::InboxEntry>> {
            let (consumer_name, key) = (consumer_name.to_owned(), key.to_owned());
            self.spawn_blocking(move |conn| Sqlite::entry(conn, &consumer_name, &key))
                .await
        }

        async fn inbox_forget(&mut self, consumer_name: &str, key: &str) -> QueryResult<bool> {
            let (consumer_name, key) = (consumer_name.to_owned(), key.to_owned());
            self.spawn_blocking(move |conn| Sqlite::forget(conn, &consumer_name, &key))
                .await
        }

        async fn inbox_stats(&mut self) -> QueryResult<Vec<crate::rows::ConsumerStats>> {
            self.spawn_blocking(Sqlite::stats).await
        }

        async fn inbox_purge_attempts(
            &mut self,
            cutoff: &str,
            consumer_name: Option<&str>,
        ) -> QueryResult<usize> {
            let (cutoff, consumer_name) = (cutoff.to_owned(), consumer_name.map(str::to_owned));
            self.spawn_blocking(move |conn| {
                Sqlite::purge_attempts(conn, &cutoff, consumer_name.as_deref())
            })
            .await
        }

        async fn inbox_failing(
            &mut self,
            consumer_name: Option<&str>,
            min_failures: i32,
            limit: i64,
        ) -> QueryResult<Vec<crate::rows::FailingRow>> {
            let consumer_name = consumer_name.map(str::to_owned);
            self.spawn_blocking(move |conn| {
                Sqlite::failing(conn, consumer_name.as_deref(), min_failures, limit)
            })
            .await
        }
    }

    impl AsyncMigration for Wrapper {
        async fn catalog(&mut self) -> QueryResult<Catalog> {
            self.spawn_blocking(Sqlite::catalog).await
        }

        async fn lock(&mut self) -> Result<Scope, InboxError> {
            self.spawn_blocking(|conn| Ok(Sqlite::lock_migrations(conn)))
                .await?
        }

        async fn unlock(&mut self, scope: Scope, keep: bool) -> Result<(), InboxError> {
            self.spawn_blocking(move |conn| Ok(Sqlite::unlock_migrations(conn, scope, keep)))
                .await?
        }
    }
}
