//! What differs between databases: how a transaction starts, how a claim
//! ignores a conflict, which errors are transient, the DDL and the catalog;
//! and `migrate`, which verifies, versions and upgrades the table through
//! them.

use crate::error::InboxError;
use diesel::connection::{AnsiTransactionManager, Connection, LoadConnection};
use diesel::result::{Error, QueryResult};

/// Most keys one claim statement carries (bind-parameter limits: PostgreSQL
/// 65535, SQLite 32766; two per row).
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
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
/// [`concurrent_claim`] for the race). One body for the sync and the async
/// connection: `$run` is `diesel::RunQueryDsl` or `diesel_async::RunQueryDsl`,
/// and `await` follows each query on the async path.
#[cfg(any(feature = "mysql", feature = "sqlite"))]
macro_rules! claim_batch_by_lookup {
    ($conn:expr, $consumer:expr, $keys:expr, $fingerprints:expr, $run:path $(, $await:tt)?) => {{
        use crate::schema::inbox_messages::dsl as inbox;
        use $run as run;
        let keys: &[&str] = $keys;
        let fingerprints: Option<&[&[u8]]> = $fingerprints;
        let mut claimed = Vec::new();
        for (start, chunk) in (0..).step_by(crate::backend::CLAIM_CHUNK).zip(keys.chunks(crate::backend::CLAIM_CHUNK)) {
            let lookup = inbox::inbox_messages
                .filter(inbox::consumer.eq($consumer))
                .filter(inbox::message_id.eq_any(chunk))
                .select(inbox::message_id);
            let present: Vec<String> = run::load(lookup, &mut *$conn)$(.$await)??;
            let present: std::collections::HashSet<String> = present.into_iter().collect();
            let missing: Vec<usize> = (0..chunk.len())
                .filter(|&i| !present.contains(chunk[i]))
                .collect();
            if missing.is_empty() {
                continue;
            }
            let inserted = match fingerprints {
                None => {
                    let rows: Vec<_> = missing
                        .iter()
                        .map(|&i| (inbox::consumer.eq($consumer), inbox::message_id.eq(chunk[i])))
                        .collect();
                    run::execute(diesel::insert_into(inbox::inbox_messages).values(&rows), &mut *$conn)$(.$await)?
                }
                Some(fingerprints) => {
                    let rows: Vec<_> = missing
                        .iter()
                        .map(|&i| {
                            (
                                inbox::consumer.eq($consumer),
                                inbox::message_id.eq(chunk[i]),
                                inbox::fingerprint.eq(fingerprints[start + i]),
                            )
                        })
                        .collect();
                    run::execute(diesel::insert_into(inbox::inbox_messages).values(&rows), &mut *$conn)$(.$await)?
                }
            };
            inserted.map_err(crate::backend::concurrent_claim)?;
            claimed.extend(missing.into_iter().map(|i| chunk[i].to_owned()));
        }
        Ok(claimed)
    }};
}

/// The single claim of a server backend, with or without a fingerprint:
/// whether the row was inserted. The backend's module defines
/// `claim_statement!` (the conflict-ignoring insert, with two or three
/// values); one body for the sync and the async connection (`$run` and its
/// `await`, as in `ops_statement!`).
#[cfg(any(feature = "postgres", feature = "mysql"))]
macro_rules! claim_single {
    ($conn:expr, $consumer:expr, $key:expr, $fingerprint:expr, $run:path $(, $await:tt)?) => {{
        use $run as run;
        let inserted = match $fingerprint {
            None => run::execute(claim_statement!($consumer, $key), $conn)$(.$await)?,
            Some(bytes) => run::execute(claim_statement!($consumer, $key, bytes), $conn)$(.$await)?,
        };
        inserted.map(|inserted| inserted == 1)
    }};
}

/// The statements of the operations (`purge`, `status`, `forget`, `stats`),
/// once for every backend and for the sync and the async connection: `$run`
/// is `diesel::RunQueryDsl` or `diesel_async::RunQueryDsl`, and `await`
/// follows each query on the async path. `$B` is the backend, for its
/// `received_at` expression.
///
/// A purge batch selects up to `$limit` keys through the `received_at`
/// index (a plain read: no locks) and deletes them by primary key with the
/// cutoff checked again, so only those rows are locked; a row another purge
/// deleted meanwhile is skipped.
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
macro_rules! ops_statement {
    (purge_batch, $conn:expr, $B:ty, $cutoff:expr, $scope:expr, $limit:expr, $run:path $(, $await:tt)?) => {{
        use crate::schema::inbox_messages::dsl::*;
        use diesel::{ExpressionMethods, QueryDsl};
        use $run as run;
        let cutoff: &str = $cutoff;
        let older = || received_at.lt(diesel::dsl::sql::<diesel::sql_types::Timestamp>(cutoff));
        let oldest = inbox_messages
            .filter(older())
            .order(received_at)
            .limit($limit)
            .select((consumer, message_id));
        let scope: Option<&str> = $scope;
        let mut rows: Vec<(String, String)> = match scope {
            Some(name) => run::load(oldest.filter(consumer.eq(name)), &mut *$conn)$(.$await)??,
            None => run::load(oldest, &mut *$conn)$(.$await)??,
        };
        // One order for every purge: concurrent ones lock rows in the same
        // order.
        rows.sort_unstable();
        let mut deleted = 0;
        for group in rows.chunk_by(|a, b| a.0 == b.0) {
            for chunk in group.chunks(crate::backend::CLAIM_CHUNK) {
                let keys: Vec<&str> = chunk.iter().map(|(_, k)| k.as_str()).collect();
                let delete = diesel::delete(
                    inbox_messages
                        .filter(consumer.eq(&chunk[0].0))
                        .filter(message_id.eq_any(keys))
                        .filter(older()),
                );
                deleted += run::execute(delete, &mut *$conn)$(.$await)??;
            }
        }
        Ok(deleted)
    }};
    (count_older, $conn:expr, $B:ty, $cutoff:expr, $scope:expr, $run:path $(, $await:tt)?) => {{
        use crate::schema::inbox_messages::dsl::*;
        use diesel::{ExpressionMethods, QueryDsl};
        use $run as run;
        let older = received_at.lt(diesel::dsl::sql::<diesel::sql_types::Timestamp>($cutoff));
        let scope: Option<&str> = $scope;
        match scope {
            Some(name) => {
                let count = inbox_messages.filter(older).filter(consumer.eq(name)).count();
                run::get_result::<i64>(count, &mut *$conn)$(.$await)?
            }
            None => run::get_result::<i64>(inbox_messages.filter(older).count(), &mut *$conn)$(.$await)?,
        }
    }};
    (entry, $conn:expr, $B:ty, $consumer:expr, $key:expr, $run:path $(, $await:tt)?) => {{
        use crate::schema::inbox_messages::dsl::*;
        use diesel::{ExpressionMethods, OptionalExtension, QueryDsl};
        use $run as run;
        let micros = diesel::dsl::sql::<diesel::sql_types::BigInt>(<$B as crate::InboxBackend>::RECEIVED_AT_MICROS);
        let row = inbox_messages
            .filter(consumer.eq($consumer))
            .filter(message_id.eq($key))
            .select((consumer, message_id, micros));
        let row: Option<(String, String, i64)> = run::get_result(row, &mut *$conn)$(.$await)?.optional()?;
        Ok(row.map(crate::rows::entry))
    }};
    (forget, $conn:expr, $B:ty, $consumer:expr, $key:expr, $run:path $(, $await:tt)?) => {{
        use crate::schema::inbox_messages::dsl::*;
        use diesel::{ExpressionMethods, QueryDsl};
        use $run as run;
        let delete = diesel::delete(inbox_messages.filter(consumer.eq($consumer)).filter(message_id.eq($key)));
        let applied = run::execute(delete, &mut *$conn)$(.$await)??;
        // A forgotten key starts over: its failure count goes too.
        let counted = ops_statement!(clear_attempts, $conn, $B, $consumer, $key, $run $(, $await)?)?;
        Ok(applied + counted > 0)
    }};
    (stored, $conn:expr, $B:ty, $consumer:expr, $keys:expr, $run:path $(, $await:tt)?) => {{
        use crate::schema::inbox_messages::dsl as inbox;
        use diesel::{ExpressionMethods, QueryDsl};
        use $run as run;
        let keys: &[&str] = $keys;
        let mut rows: Vec<crate::rows::StoredRow> = Vec::with_capacity(keys.len());
        for chunk in keys.chunks(crate::backend::CLAIM_CHUNK) {
            let lookup = inbox::inbox_messages
                .filter(inbox::consumer.eq($consumer))
                .filter(inbox::message_id.eq_any(chunk))
                .select((inbox::message_id, inbox::fingerprint, inbox::stored_result));
            rows.extend(run::load::<crate::rows::StoredRow>(lookup, &mut *$conn)$(.$await)??);
        }
        Ok(rows)
    }};
    (store_result, $conn:expr, $B:ty, $consumer:expr, $key:expr, $value:expr, $run:path $(, $await:tt)?) => {{
        use crate::schema::inbox_messages::dsl as inbox;
        use diesel::{ExpressionMethods, QueryDsl};
        use $run as run;
        let value: &[u8] = $value;
        let update = diesel::update(
            inbox::inbox_messages
                .filter(inbox::consumer.eq($consumer))
                .filter(inbox::message_id.eq($key)),
        )
        .set(inbox::stored_result.eq(value));
        run::execute(update, &mut *$conn)$(.$await)?.and_then(|updated| match updated {
            1 => Ok(()),
            n => Err(diesel::result::Error::QueryBuilderError(
                format!("storing the result updated {n} inbox rows, not the 1 just claimed").into(),
            )),
        })
    }};
    (attempts, $conn:expr, $B:ty, $consumer:expr, $key:expr, $run:path $(, $await:tt)?) => {{
        use crate::schema::inbox_attempts::dsl as att;
        use diesel::{ExpressionMethods, OptionalExtension, QueryDsl};
        use $run as run;
        // The backend's expression for `received_at`, on `updated_at`.
        let micros = <$B as crate::InboxBackend>::RECEIVED_AT_MICROS.replace("received_at", "updated_at");
        let row = att::inbox_attempts
            .filter(att::consumer.eq($consumer))
            .filter(att::message_id.eq($key))
            .select((att::failures, att::last_error, diesel::dsl::sql::<diesel::sql_types::BigInt>(&micros)));
        run::get_result::<crate::rows::AttemptsRow>(row, &mut *$conn)$(.$await)?.optional()
    }};
    (clear_attempts, $conn:expr, $B:ty, $consumer:expr, $key:expr, $run:path $(, $await:tt)?) => {{
        use crate::schema::inbox_attempts::dsl as att;
        use diesel::{ExpressionMethods, QueryDsl};
        use $run as run;
        let delete = diesel::delete(att::inbox_attempts.filter(att::consumer.eq($consumer)).filter(att::message_id.eq($key)));
        run::execute(delete, &mut *$conn)$(.$await)?
    }};
    (count_failure, $conn:expr, $B:ty, $consumer:expr, $key:expr, $error:expr, $run:path $(, $await:tt)?) => {{
        use diesel::sql_types::Text;
        use $run as run;
        let count = diesel::sql_query(<$B as crate::InboxBackend>::COUNT_FAILURE)
            .bind::<Text, _>($consumer)
            .bind::<Text, _>($key)
            .bind::<Text, _>(crate::rows::error_text($error));
        run::execute(count, &mut *$conn)$(.$await)?.map(|_| ())
    }};
    (stats, $conn:expr, $B:ty, $run:path $(, $await:tt)?) => {{
        use crate::schema::inbox_messages::dsl::*;
        use diesel::QueryDsl;
        use $run as run;
        let micros = <$B as crate::InboxBackend>::RECEIVED_AT_MICROS;
        let per_consumer = inbox_messages
            .group_by(consumer)
            .select((
                consumer,
                diesel::dsl::count_star(),
                diesel::dsl::sql::<diesel::sql_types::BigInt>(&format!("MIN({micros})")),
                diesel::dsl::sql::<diesel::sql_types::BigInt>(&format!("MAX({micros})")),
            ))
            .order(consumer);
        let rows: Vec<(String, i64, i64, i64)> = run::load(per_consumer, &mut *$conn)$(.$await)??;
        Ok(rows.into_iter().map(crate::rows::consumer_stats).collect())
    }};
}

/// The sync implementations of the operations' `InboxBackend` methods, for
/// backend `$B` (inside its `impl InboxBackend`).
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
macro_rules! sync_ops {
    ($B:ty) => {
        fn purge_batch<C>(
            conn: &mut C,
            cutoff: &str,
            scope: Option<&str>,
            limit: i64,
        ) -> QueryResult<usize>
        where
            C: LoadConnection<Backend = Self>,
        {
            ops_statement!(
                purge_batch,
                conn,
                $B,
                cutoff,
                scope,
                limit,
                diesel::RunQueryDsl
            )
        }

        fn count_older<C>(conn: &mut C, cutoff: &str, scope: Option<&str>) -> QueryResult<i64>
        where
            C: LoadConnection<Backend = Self>,
        {
            ops_statement!(count_older, conn, $B, cutoff, scope, diesel::RunQueryDsl)
        }

        fn entry<C>(
            conn: &mut C,
            consumer_name: &str,
            key: &str,
        ) -> QueryResult<Option<crate::rows::InboxEntry>>
        where
            C: LoadConnection<Backend = Self>,
        {
            ops_statement!(entry, conn, $B, consumer_name, key, diesel::RunQueryDsl)
        }

        fn forget<C>(conn: &mut C, consumer_name: &str, key: &str) -> QueryResult<bool>
        where
            C: LoadConnection<Backend = Self>,
        {
            ops_statement!(forget, conn, $B, consumer_name, key, diesel::RunQueryDsl)
        }

        fn stats<C>(conn: &mut C) -> QueryResult<Vec<crate::rows::ConsumerStats>>
        where
            C: LoadConnection<Backend = Self>,
        {
            ops_statement!(stats, conn, $B, diesel::RunQueryDsl)
        }

        fn stored<C>(
            conn: &mut C,
            consumer_name: &str,
            keys: &[&str],
        ) -> QueryResult<Vec<crate::rows::StoredRow>>
        where
            C: LoadConnection<Backend = Self>,
        {
            ops_statement!(stored, conn, $B, consumer_name, keys, diesel::RunQueryDsl)
        }

        fn store_result<C>(
            conn: &mut C,
            consumer_name: &str,
            key: &str,
            value: &[u8],
        ) -> QueryResult<()>
        where
            C: LoadConnection<Backend = Self>,
        {
            ops_statement!(
                store_result,
                conn,
                $B,
                consumer_name,
                key,
                value,
                diesel::RunQueryDsl
            )
        }

        fn attempts<C>(
            conn: &mut C,
            consumer_name: &str,
            key: &str,
        ) -> QueryResult<Option<crate::rows::AttemptsRow>>
        where
            C: LoadConnection<Backend = Self>,
        {
            ops_statement!(attempts, conn, $B, consumer_name, key, diesel::RunQueryDsl)
        }

        fn clear_attempts<C>(conn: &mut C, consumer_name: &str, key: &str) -> QueryResult<usize>
        where
            C: LoadConnection<Backend = Self>,
        {
            ops_statement!(
                clear_attempts,
                conn,
                $B,
                consumer_name,
                key,
                diesel::RunQueryDsl
            )
        }

        fn count_failure<C>(
            conn: &mut C,
            consumer_name: &str,
            key: &str,
            error: &str,
        ) -> QueryResult<()>
        where
            C: LoadConnection<Backend = Self>,
        {
            ops_statement!(
                count_failure,
                conn,
                $B,
                consumer_name,
                key,
                error,
                diesel::RunQueryDsl
            )
        }
    };
}

/// The async implementations of the operations' `AsyncInboxConnection`
/// methods on a diesel-async connection of backend `$B` with
/// `AnsiTransactionManager` (inside its `impl AsyncInboxConnection`).
#[cfg(all(feature = "async", any(feature = "postgres", feature = "mysql")))]
macro_rules! async_ops {
    ($B:ty) => {
        async fn inbox_purge_batch(
            &mut self,
            cutoff: String,
            scope: Option<String>,
            limit: i64,
        ) -> QueryResult<usize> {
            ops_statement!(
                purge_batch,
                self,
                $B,
                &cutoff,
                scope.as_deref(),
                limit,
                diesel_async::RunQueryDsl,
                await
            )
        }

        async fn inbox_count_older(
            &mut self,
            cutoff: String,
            scope: Option<String>,
        ) -> QueryResult<i64> {
            ops_statement!(
                count_older,
                self,
                $B,
                &cutoff,
                scope.as_deref(),
                diesel_async::RunQueryDsl,
                await
            )
        }

        async fn inbox_entry(
            &mut self,
            consumer_name: &str,
            key: &str,
        ) -> QueryResult<Option<crate::rows::InboxEntry>> {
            ops_statement!(
                entry,
                self,
                $B,
                consumer_name,
                key,
                diesel_async::RunQueryDsl,
                await
            )
        }

        async fn inbox_forget(&mut self, consumer_name: &str, key: &str) -> QueryResult<bool> {
            ops_statement!(
                forget,
                self,
                $B,
                consumer_name,
                key,
                diesel_async::RunQueryDsl,
                await
            )
        }

        async fn inbox_stats(&mut self) -> QueryResult<Vec<crate::rows::ConsumerStats>> {
            ops_statement!(stats, self, $B, diesel_async::RunQueryDsl, await)
        }

        async fn inbox_stored(
            &mut self,
            consumer_name: &str,
            keys: &[&str],
        ) -> QueryResult<Vec<crate::rows::StoredRow>> {
            ops_statement!(
                stored,
                self,
                $B,
                consumer_name,
                keys,
                diesel_async::RunQueryDsl,
                await
            )
        }

        async fn inbox_store_result(
            &mut self,
            consumer_name: &str,
            key: &str,
            value: &[u8],
        ) -> QueryResult<()> {
            ops_statement!(
                store_result,
                self,
                $B,
                consumer_name,
                key,
                value,
                diesel_async::RunQueryDsl,
                await
            )
        }

        async fn inbox_attempts(
            &mut self,
            consumer_name: &str,
            key: &str,
        ) -> QueryResult<Option<crate::rows::AttemptsRow>> {
            ops_statement!(
                attempts,
                self,
                $B,
                consumer_name,
                key,
                diesel_async::RunQueryDsl,
                await
            )
        }

        async fn inbox_clear_attempts(
            &mut self,
            consumer_name: &str,
            key: &str,
        ) -> QueryResult<usize> {
            ops_statement!(
                clear_attempts,
                self,
                $B,
                consumer_name,
                key,
                diesel_async::RunQueryDsl,
                await
            )
        }

        async fn inbox_count_failure(
            &mut self,
            consumer_name: &str,
            key: &str,
            error: &str,
        ) -> QueryResult<()> {
            ops_statement!(
                count_failure,
                self,
                $B,
                consumer_name,
                key,
                error,
                diesel_async::RunQueryDsl,
                await
            )
        }
    };
}

#[cfg(feature = "async")]
pub(crate) mod asynchronous;
pub(crate) mod errors;
#[cfg(feature = "mysql")]
mod mysql;
#[cfg(feature = "postgres")]
mod postgres;
pub(crate) mod shape;
#[cfg(feature = "sqlite")]
mod sqlite;
pub(crate) mod transaction;

pub(crate) use shape::Catalog;

mod sealed {
    pub trait Sealed {}
}
pub(crate) use sealed::Sealed;

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
///
/// ```
/// assert_eq!(diesel_inbox::SCHEMA_VERSION, 2);
/// ```
pub const SCHEMA_VERSION: u32 = 2;

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
pub trait InboxBackend: diesel::backend::Backend + Sealed + Sized {
    /// The statements that create the inbox table, its index and the
    /// record of its schema version, idempotent (`IF NOT EXISTS`), for
    /// users who run their own migration tool.
    const DDL: &'static str;

    /// The statement that opens a top-level transaction.
    #[doc(hidden)]
    const BEGIN: &'static str;

    /// The column type of `consumer` and `message_id`, named in fixes.
    #[doc(hidden)]
    const KEY_TYPE: &'static str;

    /// Whether DDL commits an open transaction implicitly (MySQL), so that
    /// `migrate` must refuse to run inside one.
    #[doc(hidden)]
    const DDL_COMMITS: bool = false;

    /// `UPGRADES[n]` takes the schema from version `n + 1` to `n + 2`.
    #[doc(hidden)]
    const UPGRADES: &'static [&'static str];

    /// Inserts `(consumer, key)` (with its fingerprint, if given) unless it
    /// is there already; `true` if the row was inserted (the caller owns
    /// the message), `false` for a duplicate. Never fails on the conflict
    /// itself. Without a fingerprint the statement is that of schema 1.
    #[doc(hidden)]
    fn claim<C>(
        conn: &mut C,
        consumer: &str,
        key: &str,
        fingerprint: Option<&[u8]>,
    ) -> QueryResult<bool>
    where
        C: Connection<Backend = Self>;

    /// Inserts every `(consumer, key)` that is not there yet (with
    /// `fingerprints[i]` for `keys[i]`, if given), in one statement where
    /// the backend can tell which rows it inserted, and returns the keys
    /// inserted: the ones the caller now owns. Keys are distinct.
    #[doc(hidden)]
    fn claim_batch<C>(
        conn: &mut C,
        consumer: &str,
        keys: &[&str],
        fingerprints: Option<&[&[u8]]>,
    ) -> QueryResult<Vec<String>>
    where
        C: LoadConnection<Backend = Self>;

    /// The fingerprints and stored results of those of `keys` that have a
    /// row, read in the claim's transaction.
    #[doc(hidden)]
    fn stored<C>(
        conn: &mut C,
        consumer: &str,
        keys: &[&str],
    ) -> QueryResult<Vec<crate::rows::StoredRow>>
    where
        C: LoadConnection<Backend = Self>;

    /// Writes the body's value into the row just claimed.
    #[doc(hidden)]
    fn store_result<C>(conn: &mut C, consumer: &str, key: &str, value: &[u8]) -> QueryResult<()>
    where
        C: LoadConnection<Backend = Self>;

    /// The failure count of `(consumer, key)`: failures, last error,
    /// `updated_at` in microseconds since the epoch.
    #[doc(hidden)]
    fn attempts<C>(
        conn: &mut C,
        consumer: &str,
        key: &str,
    ) -> QueryResult<Option<crate::rows::AttemptsRow>>
    where
        C: LoadConnection<Backend = Self>;

    /// Deletes the failure count of `(consumer, key)`.
    #[doc(hidden)]
    fn clear_attempts<C>(conn: &mut C, consumer: &str, key: &str) -> QueryResult<usize>
    where
        C: LoadConnection<Backend = Self>;

    /// Adds one failure to the count of `(consumer, key)`, in the caller's
    /// transaction.
    #[doc(hidden)]
    fn count_failure<C>(conn: &mut C, consumer: &str, key: &str, error: &str) -> QueryResult<()>
    where
        C: LoadConnection<Backend = Self>;

    /// The upsert of [`count_failure`](Self::count_failure), binds:
    /// consumer, key, error text.
    #[doc(hidden)]
    const COUNT_FAILURE: &'static str;

    /// Opens a top-level transaction with the backend's `BEGIN`; fails with
    /// `AlreadyInTransaction` inside one (the caller then takes a
    /// savepoint). Keeps diesel's transaction depth in step.
    #[doc(hidden)]
    fn begin_top_level<C>(conn: &mut C) -> QueryResult<()>
    where
        C: Connection<Backend = Self, TransactionManager = AnsiTransactionManager>,
    {
        AnsiTransactionManager::begin_transaction_sql(conn, Self::BEGIN)
    }

    /// Rolls back the top-level transaction; keeps diesel's depth in step.
    #[doc(hidden)]
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

    /// Whether rerunning the transaction that raised `error` may succeed:
    /// serialization failures, deadlocks, lock timeouts, busy databases.
    #[doc(hidden)]
    fn is_transient(error: &Error) -> bool;

    /// Whether `error`, raised by a statement of the body, ended the whole
    /// transaction even though the body went on and returned `Ok` (MySQL
    /// rolls back the transaction on a deadlock; later statements then run
    /// outside it).
    #[doc(hidden)]
    fn ends_transaction(error: &Error) -> bool {
        let _ = error;
        false
    }

    /// Whether a failed top-level commit means the body swallowed the error
    /// of a statement that aborted the transaction (PostgreSQL's commit
    /// guard), rather than a failure of the commit itself.
    #[doc(hidden)]
    fn is_aborted_commit(error: &Error) -> bool {
        let _ = error;
        false
    }

    /// Whether `error` says the role lacks a privilege.
    #[doc(hidden)]
    fn is_privilege_error(error: &Error) -> bool;

    /// Whether `error` says there is no `inbox_messages` table.
    #[doc(hidden)]
    fn is_missing_table(error: &Error) -> bool;

    /// `received_at` as microseconds since the Unix epoch (`BIGINT`).
    #[doc(hidden)]
    const RECEIVED_AT_MICROS: &'static str;

    /// The time `older_than` before now, comparable with `received_at` (the
    /// database's clock, as the column's default reads it).
    #[doc(hidden)]
    fn cutoff_sql(older_than: std::time::Duration) -> String;

    /// A statement run before a purge batch's `BEGIN` (its isolation).
    #[doc(hidden)]
    const PURGE_ISOLATION: Option<&'static str> = None;

    /// One purge batch's statements, inside the caller's transaction: the
    /// rows deleted.
    #[doc(hidden)]
    fn purge_batch<C>(
        conn: &mut C,
        cutoff: &str,
        consumer: Option<&str>,
        limit: i64,
    ) -> QueryResult<usize>
    where
        C: LoadConnection<Backend = Self>;

    /// How many rows are older than `cutoff`.
    #[doc(hidden)]
    fn count_older<C>(conn: &mut C, cutoff: &str, consumer: Option<&str>) -> QueryResult<i64>
    where
        C: LoadConnection<Backend = Self>;

    /// The row of `(consumer, key)`.
    #[doc(hidden)]
    fn entry<C>(
        conn: &mut C,
        consumer: &str,
        key: &str,
    ) -> QueryResult<Option<crate::rows::InboxEntry>>
    where
        C: LoadConnection<Backend = Self>;

    /// Deletes the row of `(consumer, key)`; whether there was one.
    #[doc(hidden)]
    fn forget<C>(conn: &mut C, consumer: &str, key: &str) -> QueryResult<bool>
    where
        C: LoadConnection<Backend = Self>;

    /// Rows, oldest and newest per consumer.
    #[doc(hidden)]
    fn stats<C>(conn: &mut C) -> QueryResult<Vec<crate::rows::ConsumerStats>>
    where
        C: LoadConnection<Backend = Self>;

    /// What the catalog says about `inbox_messages`, in one query.
    #[doc(hidden)]
    fn catalog<C>(conn: &mut C) -> QueryResult<Catalog>
    where
        C: LoadConnection<Backend = Self>;

    /// The statements that record `version` with the table.
    #[doc(hidden)]
    fn record_version(version: u32) -> String;

    /// Runs `f` while no other `migrate` runs against the same database.
    #[doc(hidden)]
    fn exclusively<C, T>(
        conn: &mut C,
        f: impl FnOnce(&mut C) -> Result<T, InboxError>,
    ) -> Result<T, InboxError>
    where
        C: LoadConnection<Backend = Self, TransactionManager = AnsiTransactionManager>;
}

#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
pub(crate) use errors::database_error;

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

/// Whether `InboxBackend::$check(error)` holds on any enabled backend.
macro_rules! on_any_backend {
    ($check:ident, $error:expr) => {{
        let error: &Error = $error;
        #[allow(unused_mut)]
        let mut holds = false;
        #[cfg(feature = "postgres")]
        {
            holds = holds || <diesel::pg::Pg as InboxBackend>::$check(error);
        }
        #[cfg(feature = "mysql")]
        {
            holds = holds || <diesel::mysql::Mysql as InboxBackend>::$check(error);
        }
        #[cfg(feature = "sqlite")]
        {
            holds = holds || <diesel::sqlite::Sqlite as InboxBackend>::$check(error);
        }
        let _ = error;
        holds
    }};
}

/// Transient on any enabled backend, for errors whose backend is not known
/// (`RetryableError for diesel::result::Error`).
pub(crate) fn is_transient(error: &Error) -> bool {
    on_any_backend!(is_transient, error)
}

/// The inbox DDL of each backend, as [`InboxBackend::DDL`] gives it, for a
/// migration tool of your own (for example a diesel migration's `up.sql`).
/// It creates the table, its index and the record of the schema version;
/// call [`migrate`] at start-up anyway to verify the table.
///
/// ```
/// assert!(diesel_inbox::ddl::SQLITE.contains("PRIMARY KEY (consumer, message_id)"));
/// ```
pub mod ddl {
    /// PostgreSQL.
    pub const POSTGRES: &str = concat!(
        include_str!("postgres.sql"),
        include_str!("postgres_attempts.sql")
    );
    /// MySQL 8 and MariaDB 10.5+. Keys are `VARBINARY` so that they compare
    /// byte for byte (the default collations ignore case, accents and
    /// trailing spaces). The attempts' table comes first: DDL is not
    /// transactional here, and the version recorded with `inbox_messages`
    /// must not precede it.
    pub const MYSQL: &str = concat!(
        include_str!("mysql_attempts.sql"),
        include_str!("mysql.sql")
    );
    /// SQLite.
    pub const SQLITE: &str = concat!(
        include_str!("sqlite.sql"),
        include_str!("sqlite_attempts.sql")
    );
}
