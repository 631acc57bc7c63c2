//! The statements of `backend::statements`, run on a sync connection
//! ([`Statements`]: one blanket implementation for every backend, its
//! bounds stated per backend through `statements::LoadOn`/`ExecuteOn`) and
//! on an async one (`diesel_async::RunQueryDsl`, in [`asynchronous`]). Each
//! operation is the same few steps on both: load or execute, then the
//! shared decision (`statements::missing`, `statements::purge_plan`,
//! `statements::stored_one`). A backend's own steps (its claims, catalog,
//! locks) are its `Internals`.
// Without a backend feature nothing runs these.
#![cfg_attr(not(feature = "_any-backend"), allow(dead_code))]

use super::outbox::{
    Answer, ClaimedRow, DeadRow, Enqueue, MarkerRow, OffsetRow, Op, PositionRow, SeqRow, StatusRow,
};
use super::statements::{self as st, ExecuteOn, LoadOn, CLAIM_CHUNK};
#[cfg(feature = "_counted-claim")]
use super::statements::{Fingerprinted, Plain};
use super::stmt::Stmt;
use super::Internals;
use crate::rows::{self, AttemptsRow, ConsumerStats, FailingRow, InboxEntry, StoredRow};
#[cfg(feature = "_counted-claim")]
use diesel::connection::Connection;
use diesel::connection::LoadConnection;
#[cfg(feature = "_counted-claim")]
use diesel::query_dsl::methods::{ExecuteDsl, LoadQuery};
use diesel::result::QueryResult;
use diesel::serialize::ToSql;
use diesel::sql_types::{HasSqlType, Text};
#[cfg(feature = "_counted-claim")]
use diesel::RunQueryDsl;

/// The single claim: whether the row was inserted (the caller owns the
/// message) or was there already.
#[cfg(feature = "_counted-claim")]
pub(crate) fn claim<C>(
    conn: &mut C,
    consumer: &str,
    key: &str,
    fingerprint: Option<&[u8]>,
) -> QueryResult<bool>
where
    C: Connection,
    for<'a> st::Claim<'a, Plain>: ExecuteDsl<C>,
    for<'a> st::Claim<'a, Fingerprinted>: ExecuteDsl<C>,
{
    let inserted = match fingerprint {
        None => st::Claim::plain(consumer, key).execute(conn)?,
        Some(bytes) => st::Claim::fingerprinted(consumer, key, bytes).execute(conn)?,
    };
    Ok(inserted == 1)
}

/// A batch claim on a backend without `RETURNING` on a conflict-ignoring
/// insert (MySQL) or whose writers are serialized anyway (SQLite): look the
/// keys up, insert the missing ones with a plain `INSERT`. A unique
/// violation means another transaction claimed one of them meanwhile
/// ([`concurrent_claim`]): the whole batch reruns.
#[cfg(feature = "_counted-claim")]
pub(crate) fn claim_batch_by_lookup<C>(
    conn: &mut C,
    consumer: &str,
    keys: &[&str],
    fingerprints: Option<&[&[u8]]>,
) -> QueryResult<Vec<String>>
where
    C: Connection,
    for<'a> st::present<'a>: LoadQuery<'a, C, String>,
    st::insert_claims: ExecuteDsl<C>,
    st::insert_fingerprinted_claims: ExecuteDsl<C>,
{
    let mut claimed = Vec::new();
    for (start, chunk) in (0..).step_by(CLAIM_CHUNK).zip(keys.chunks(CLAIM_CHUNK)) {
        let missing = st::missing(chunk, st::present(consumer, st::owned(chunk)).load(conn)?);
        if missing.is_empty() {
            continue;
        }
        let inserted = match fingerprints {
            None => st::insert_claims(st::claim_rows(consumer, chunk, &missing)).execute(conn),
            Some(all) => {
                let fingerprints = &all[start..start + chunk.len()];
                let rows = st::fingerprinted_claim_rows(consumer, chunk, fingerprints, &missing);
                st::insert_fingerprinted_claims(rows).execute(conn)
            }
        };
        inserted.map_err(concurrent_claim)?;
        claimed.extend(missing.into_iter().map(|i| chunk[i].to_owned()));
    }
    Ok(claimed)
}

/// The replay's read on a backend whose side statements are cached
/// (`Internals::lookup`): the key's row if it holds a stored result.
#[cfg(feature = "_counted-claim")]
pub(crate) fn lookup<C>(conn: &mut C, consumer: &str, key: &str) -> QueryResult<Option<StoredRow>>
where
    C: LoadConnection,
    for<'a> st::Side<st::lookup<'a>>: LoadOn<C::Backend, StoredRow> + diesel::RunQueryDsl<C>,
{
    st::looked_up(key, st::Side(st::lookup(consumer, key)).load_on(conn)?)
}

/// A unique violation of a batch claim means another transaction claimed
/// one of the keys between the lookup and the insert: rerun the whole
/// batch, which then sees that key as a duplicate.
#[cfg(feature = "_counted-claim")]
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

/// The first row, if any (`get_result(..).optional()`).
fn first<U>(rows: Vec<U>) -> Option<U> {
    rows.into_iter().next()
}

/// The statements every backend runs the same way, on a sync connection:
/// one blanket implementation for every backend whose types the
/// statements compile for (a supertrait of `InboxBackend`, so generic code
/// calls `B::forget(conn, ..)`). The backend's own steps (its claims, its
/// catalog, its locks) are `Internals`.
pub(crate) trait Statements: Internals {
    /// Runs one outbox operation (`backend::outbox`).
    fn outbox<C: LoadConnection<Backend = Self>>(conn: &mut C, op: Op) -> QueryResult<Answer>;
    /// The fingerprints and stored results of those of `keys` that have a
    /// row, read in the claim's transaction.
    fn stored<C: LoadConnection<Backend = Self>>(
        conn: &mut C,
        consumer: &str,
        keys: &[&str],
    ) -> QueryResult<Vec<StoredRow>>;
    /// Writes the body's value into the row just claimed.
    fn store_result<C: LoadConnection<Backend = Self>>(
        conn: &mut C,
        consumer: &str,
        key: &str,
        value: &[u8],
    ) -> QueryResult<()>;
    /// The failure count of `(consumer, key)`.
    fn attempts<C: LoadConnection<Backend = Self>>(
        conn: &mut C,
        consumer: &str,
        key: &str,
    ) -> QueryResult<Option<AttemptsRow>>;
    /// Deletes the failure count of `(consumer, key)`.
    fn clear_attempts<C: LoadConnection<Backend = Self>>(
        conn: &mut C,
        consumer: &str,
        key: &str,
    ) -> QueryResult<usize>;
    /// Adds one failure to the count of `(consumer, key)`, in the caller's
    /// transaction.
    fn count_failure<C: LoadConnection<Backend = Self>>(
        conn: &mut C,
        consumer: &str,
        key: &str,
        error: &str,
    ) -> QueryResult<()>;
    /// One purge batch's statements, in the caller's transaction: the rows
    /// deleted.
    fn purge_batch<C: LoadConnection<Backend = Self>>(
        conn: &mut C,
        cutoff: &str,
        consumer: Option<&str>,
        limit: i64,
    ) -> QueryResult<usize>;
    /// How many rows are older than `cutoff`.
    fn count_older<C: LoadConnection<Backend = Self>>(
        conn: &mut C,
        cutoff: &str,
        consumer: Option<&str>,
    ) -> QueryResult<i64>;
    /// Whether the transaction is still open, where the backend can tell
    /// ([`OPEN_PROBE`](super::Internals::OPEN_PROBE)); `None` otherwise.
    fn still_open<C: LoadConnection<Backend = Self>>(conn: &mut C) -> QueryResult<Option<bool>>;
    /// The row of `(consumer, key)`.
    fn entry<C: LoadConnection<Backend = Self>>(
        conn: &mut C,
        consumer: &str,
        key: &str,
    ) -> QueryResult<Option<InboxEntry>>;
    /// Deletes the row of `(consumer, key)` and its failure count (a
    /// forgotten key starts over): whether there was either.
    fn forget<C: LoadConnection<Backend = Self>>(
        conn: &mut C,
        consumer: &str,
        key: &str,
    ) -> QueryResult<bool>;
    /// Rows, oldest and newest per consumer.
    fn stats<C: LoadConnection<Backend = Self>>(conn: &mut C) -> QueryResult<Vec<ConsumerStats>>;
    /// Deletes the failure counts (of `consumer`, or of all) last updated
    /// before `cutoff`.
    fn purge_attempts<C: LoadConnection<Backend = Self>>(
        conn: &mut C,
        cutoff: &str,
        consumer: Option<&str>,
    ) -> QueryResult<usize>;
    /// The failure counts of at least `min_failures` (of `consumer`, or of
    /// all), the latest first, at most `limit`.
    fn failing<C: LoadConnection<Backend = Self>>(
        conn: &mut C,
        consumer: Option<&str>,
        min_failures: i32,
        limit: i64,
    ) -> QueryResult<Vec<FailingRow>>;
}

impl<B> Statements for B
where
    B: Internals + HasSqlType<Text>,
    for<'a> &'a str: ToSql<Text, B>,
    Stmt: ExecuteOn<B>
        + LoadOn<B, ClaimedRow>
        + LoadOn<B, super::outbox::WindowRow>
        + LoadOn<B, StatusRow>
        + LoadOn<B, DeadRow>
        + LoadOn<B, SeqRow>
        + LoadOn<B, OffsetRow>
        + LoadOn<B, PositionRow>
        + LoadOn<B, crate::backend::outbox_wal::TextRow>
        + LoadOn<B, crate::backend::outbox_wal::CountRow>
        + LoadOn<B, crate::backend::overview::TallyRow>,
    Enqueue: ExecuteOn<B> + LoadOn<B, MarkerRow>,
    crate::backend::outbox_wal::WalEmit: LoadOn<B, crate::backend::outbox_wal::TextRow>,
    for<'a> st::Side<st::stored<'a>>: LoadOn<B, StoredRow>,
    for<'a> st::Side<st::store_result<'a>>: ExecuteOn<B>,
    for<'a> st::Side<st::attempts<'a>>: LoadOn<B, AttemptsRow>,
    for<'a> st::Side<st::clear_attempts<'a>>: ExecuteOn<B>,
    for<'a> st::CountFailure<'a, B>: ExecuteOn<B>,
    st::oldest: LoadOn<B, (String, String)>,
    for<'a> st::oldest_of<'a>: LoadOn<B, (String, String)>,
    st::delete_older: ExecuteOn<B>,
    st::count_older: LoadOn<B, i64>,
    st::still_open: LoadOn<B, Option<i64>>,
    for<'a> st::count_older_of<'a>: LoadOn<B, i64>,
    for<'a> st::entry<'a>: LoadOn<B, (String, String, i64)>,
    for<'a> st::forget<'a>: ExecuteOn<B>,
    for<'a> st::clear_attempts<'a>: ExecuteOn<B>,
    st::stats: LoadOn<B, (String, i64, i64, i64)>,
    st::delete_attempts_older: ExecuteOn<B>,
    for<'a> st::delete_attempts_older_of<'a>: ExecuteOn<B>,
    st::failing: LoadOn<B, FailingRow>,
    for<'a> st::failing_of<'a>: LoadOn<B, FailingRow>,
{
    fn outbox<C: LoadConnection<Backend = B>>(conn: &mut C, op: Op) -> QueryResult<Answer> {
        crate::backend::outbox::run(conn, op)
    }

    fn stored<C: LoadConnection<Backend = B>>(
        conn: &mut C,
        consumer: &str,
        keys: &[&str],
    ) -> QueryResult<Vec<StoredRow>> {
        let mut rows = Vec::with_capacity(keys.len());
        for chunk in keys.chunks(CLAIM_CHUNK) {
            rows.extend(st::Side(st::stored(consumer, st::owned(chunk))).load_on(conn)?);
        }
        Ok(rows)
    }

    fn store_result<C: LoadConnection<Backend = B>>(
        conn: &mut C,
        consumer: &str,
        key: &str,
        value: &[u8],
    ) -> QueryResult<()> {
        st::Side(st::store_result(consumer, key, value))
            .execute_on(conn)
            .and_then(st::stored_one)
    }

    fn attempts<C: LoadConnection<Backend = B>>(
        conn: &mut C,
        consumer: &str,
        key: &str,
    ) -> QueryResult<Option<AttemptsRow>> {
        let micros = B::UPDATED_AT_MICROS;
        st::Side(st::attempts(consumer, key, micros))
            .load_on(conn)
            .map(first)
    }

    fn clear_attempts<C: LoadConnection<Backend = B>>(
        conn: &mut C,
        consumer: &str,
        key: &str,
    ) -> QueryResult<usize> {
        st::Side(st::clear_attempts(consumer, key)).execute_on(conn)
    }

    fn count_failure<C: LoadConnection<Backend = B>>(
        conn: &mut C,
        consumer: &str,
        key: &str,
        error: &str,
    ) -> QueryResult<()> {
        st::count_failure::<B>(consumer, key, error)
            .execute_on(conn)
            .map(drop)
    }

    fn purge_batch<C: LoadConnection<Backend = B>>(
        conn: &mut C,
        cutoff: &str,
        consumer: Option<&str>,
        limit: i64,
    ) -> QueryResult<usize> {
        let rows = match consumer {
            Some(name) => st::oldest_of(cutoff, name, limit).load_on(conn)?,
            None => st::oldest(cutoff, limit).load_on(conn)?,
        };
        let mut deleted = 0;
        for (name, keys) in st::purge_plan(rows) {
            deleted += st::delete_older(cutoff, name, keys).execute_on(conn)?;
        }
        Ok(deleted)
    }

    fn count_older<C: LoadConnection<Backend = B>>(
        conn: &mut C,
        cutoff: &str,
        consumer: Option<&str>,
    ) -> QueryResult<i64> {
        let rows = match consumer {
            Some(name) => st::count_older_of(cutoff, name).load_on(conn)?,
            None => st::count_older(cutoff).load_on(conn)?,
        };
        first(rows).ok_or(diesel::result::Error::NotFound)
    }

    fn still_open<C: LoadConnection<Backend = B>>(conn: &mut C) -> QueryResult<Option<bool>> {
        let Some(probe) = B::OPEN_PROBE else {
            return Ok(None);
        };
        let rows = st::still_open(probe).load_on(conn)?;
        Ok(first(rows).flatten().map(|open| open != 0))
    }

    fn entry<C: LoadConnection<Backend = B>>(
        conn: &mut C,
        consumer: &str,
        key: &str,
    ) -> QueryResult<Option<InboxEntry>> {
        let micros = B::RECEIVED_AT_MICROS;
        let rows = st::entry(consumer, key, micros).load_on(conn)?;
        Ok(first(rows).map(rows::entry))
    }

    fn forget<C: LoadConnection<Backend = B>>(
        conn: &mut C,
        consumer: &str,
        key: &str,
    ) -> QueryResult<bool> {
        let applied = st::forget(consumer, key).execute_on(conn)?;
        let counted = st::clear_attempts(consumer, key).execute_on(conn)?;
        Ok(applied + counted > 0)
    }

    fn stats<C: LoadConnection<Backend = B>>(conn: &mut C) -> QueryResult<Vec<ConsumerStats>> {
        let (oldest, newest) = st::stats_bounds::<B>();
        let rows = st::stats(&oldest, &newest).load_on(conn)?;
        Ok(rows.into_iter().map(rows::consumer_stats).collect())
    }

    fn purge_attempts<C: LoadConnection<Backend = B>>(
        conn: &mut C,
        cutoff: &str,
        consumer: Option<&str>,
    ) -> QueryResult<usize> {
        match consumer {
            Some(consumer) => st::delete_attempts_older_of(cutoff, consumer).execute_on(conn),
            None => st::delete_attempts_older(cutoff).execute_on(conn),
        }
    }

    fn failing<C: LoadConnection<Backend = B>>(
        conn: &mut C,
        consumer: Option<&str>,
        min_failures: i32,
        limit: i64,
    ) -> QueryResult<Vec<FailingRow>> {
        let micros = B::UPDATED_AT_MICROS;
        match consumer {
            Some(consumer) => st::failing_of(consumer, min_failures, micros, limit).load_on(conn),
            None => st::failing(min_failures, micros, limit).load_on(conn),
        }
    }
}

/// The same steps on a diesel-async connection.
#[cfg(all(feature = "async", feature = "_any-backend"))]
pub(crate) mod asynchronous {
    use super::st::{self, Io, LoadOnAsync, CLAIM_CHUNK};
    #[cfg(feature = "mysql")]
    use super::st::{Fingerprinted, Plain};
    use crate::backend::asynchronous::AsyncStatements;
    use crate::backend::outbox::{
        Answer, ClaimedRow, DeadRow, Enqueue, MarkerRow, OffsetRow, Op, PositionRow, SeqRow,
        StatusRow,
    };
    use crate::backend::stmt::Stmt;
    use crate::backend::transaction::{state_known, state_unknown};
    use crate::backend::Internals;
    use crate::rows::{self, AttemptsRow, ConsumerStats, FailingRow, InboxEntry, StoredRow};
    use diesel::query_builder::{QueryFragment, QueryId};
    use diesel::result::QueryResult;
    use diesel::serialize::ToSql;
    use diesel::sql_types::{HasSqlType, Text};
    #[cfg(feature = "mysql")]
    use diesel_async::methods::ExecuteDsl;
    #[cfg(feature = "mysql")]
    use diesel_async::methods::LoadQuery;
    use diesel_async::{AsyncConnection, RunQueryDsl};
    use std::future::Future;

    /// [`super::lookup`] on a diesel-async connection (MySQL/MariaDB).
    #[cfg(feature = "mysql")]
    pub(crate) async fn lookup<B, C>(
        conn: &mut C,
        consumer: &str,
        key: &str,
    ) -> QueryResult<Option<StoredRow>>
    where
        B: diesel::backend::Backend,
        C: AsyncConnection<Backend = B> + Send,
        for<'a> st::Side<st::lookup<'a>>: LoadOnAsync<B, StoredRow>,
    {
        let rows = st::Side(st::lookup(consumer, key))
            .load_on_async(conn)
            .await?;
        st::looked_up(key, rows)
    }

    /// Claims `key` for `consumer` (with its fingerprint, if any): whether
    /// the row was inserted (not, when a committed claim holds it).
    #[cfg(feature = "mysql")]
    pub(crate) async fn claim<'q, C>(
        conn: &mut C,
        consumer: &'q str,
        key: &'q str,
        fingerprint: Option<&'q [u8]>,
    ) -> QueryResult<bool>
    where
        C: AsyncConnection + Send,
        st::Claim<'q, Plain>: ExecuteDsl<C>,
        st::Claim<'q, Fingerprinted>: ExecuteDsl<C>,
    {
        let inserted = match fingerprint {
            None => st::Claim::plain(consumer, key).execute(conn).await?,
            Some(bytes) => {
                st::Claim::fingerprinted(consumer, key, bytes)
                    .execute(conn)
                    .await?
            }
        };
        Ok(inserted == 1)
    }

    /// Claims the `keys` no row holds yet, in chunks: each chunk's present
    /// keys read first, then the missing ones inserted; the keys claimed.
    #[cfg(feature = "mysql")]
    pub(crate) fn claim_batch_by_lookup<'q, C>(
        conn: &'q mut C,
        consumer: &'q str,
        keys: &'q [&'q str],
        fingerprints: Option<&'q [&'q [u8]]>,
    ) -> Io<'q, Vec<String>>
    where
        C: AsyncConnection + Send,
        st::present<'q>: LoadQuery<'q, C, String>,
        st::insert_claims: ExecuteDsl<C>,
        st::insert_fingerprinted_claims: ExecuteDsl<C>,
    {
        Box::pin(async move {
            let mut claimed = Vec::new();
            for (start, chunk) in (0..).step_by(CLAIM_CHUNK).zip(keys.chunks(CLAIM_CHUNK)) {
                let present = st::present(consumer, st::owned(chunk)).load(conn).await?;
                let missing = st::missing(chunk, present);
                if missing.is_empty() {
                    continue;
                }
                let inserted = match fingerprints {
                    None => {
                        let rows = st::claim_rows(consumer, chunk, &missing);
                        st::insert_claims(rows).execute(conn).await
                    }
                    Some(all) => {
                        let fingerprints = &all[start..start + chunk.len()];
                        let rows =
                            st::fingerprinted_claim_rows(consumer, chunk, fingerprints, &missing);
                        st::insert_fingerprinted_claims(rows).execute(conn).await
                    }
                };
                inserted.map_err(super::concurrent_claim)?;
                claimed.extend(missing.into_iter().map(|i| chunk[i].to_owned()));
            }
            Ok(claimed)
        })
    }

    /// The first row, if any.
    fn first<U>(rows: Vec<U>) -> Option<U> {
        rows.into_iter().next()
    }

    /// The async connections that run the statements themselves
    /// (`AsyncPgConnection`, `AsyncMysqlConnection`): the blanket
    /// implementation below is theirs. SQLite's `SyncConnectionWrapper`
    /// implements [`AsyncStatements`] by running the sync `Statements`
    /// whole on its blocking thread. (A marker on the connection: coherence
    /// does not tell the two implementations apart by the connections'
    /// associated `Backend` or `TransactionManager`.)
    pub(crate) trait RunsStatements {}

    impl<C, B> AsyncStatements for C
    where
        C: RunsStatements + AsyncConnection<Backend = B> + Send,
        B: Internals + HasSqlType<Text>,
        for<'a> &'a str: ToSql<Text, B>,
        Stmt: QueryFragment<B>
            + QueryId
            + LoadOnAsync<B, ClaimedRow>
            + LoadOnAsync<B, crate::backend::outbox::WindowRow>
            + LoadOnAsync<B, StatusRow>
            + LoadOnAsync<B, DeadRow>
            + LoadOnAsync<B, SeqRow>
            + LoadOnAsync<B, OffsetRow>
            + LoadOnAsync<B, PositionRow>
            + LoadOnAsync<B, crate::backend::outbox_wal::TextRow>
            + LoadOnAsync<B, crate::backend::outbox_wal::CountRow>
            + LoadOnAsync<B, crate::backend::overview::TallyRow>,
        Enqueue: QueryFragment<B> + QueryId + LoadOnAsync<B, MarkerRow>,
        crate::backend::outbox_wal::WalEmit: LoadOnAsync<B, crate::backend::outbox_wal::TextRow>,
        for<'a> st::Side<st::stored<'a>>: LoadOnAsync<B, StoredRow>,
        for<'a> st::Side<st::store_result<'a>>: QueryFragment<B> + QueryId + Send,
        for<'a> st::Side<st::attempts<'a>>: LoadOnAsync<B, AttemptsRow>,
        for<'a> st::Side<st::clear_attempts<'a>>: QueryFragment<B> + QueryId + Send,
        for<'a> st::CountFailure<'a, B>: QueryFragment<B> + QueryId + Send,
        st::oldest: LoadOnAsync<B, (String, String)>,
        for<'a> st::oldest_of<'a>: LoadOnAsync<B, (String, String)>,
        st::delete_older: QueryFragment<B> + QueryId + Send,
        st::count_older: LoadOnAsync<B, i64>,
        st::still_open: LoadOnAsync<B, Option<i64>>,
        for<'a> st::count_older_of<'a>: LoadOnAsync<B, i64>,
        for<'a> st::entry<'a>: LoadOnAsync<B, (String, String, i64)>,
        for<'a> st::forget<'a>: QueryFragment<B> + QueryId + Send,
        for<'a> st::clear_attempts<'a>: QueryFragment<B> + QueryId + Send,
        st::stats: LoadOnAsync<B, (String, i64, i64, i64)>,
        st::delete_attempts_older: QueryFragment<B> + QueryId + Send,
        for<'a> st::delete_attempts_older_of<'a>: QueryFragment<B> + QueryId + Send,
        st::failing: LoadOnAsync<B, FailingRow>,
        for<'a> st::failing_of<'a>: LoadOnAsync<B, FailingRow>,
    {
        async fn inbox_outbox(&mut self, op: Op) -> QueryResult<Answer> {
            let status = state_unknown(self);
            let answer = crate::backend::outbox::run_async(self, op).await;
            state_known(self, status);
            answer
        }

        async fn inbox_stored(
            &mut self,
            consumer: &str,
            keys: &[&str],
        ) -> QueryResult<Vec<StoredRow>> {
            let rows: Io<'_, Vec<StoredRow>> = Box::pin(async move {
                let mut rows = Vec::with_capacity(keys.len());
                for chunk in keys.chunks(CLAIM_CHUNK) {
                    let side = st::Side(st::stored(consumer, st::owned(chunk)));
                    rows.extend(side.load_on_async(self).await?);
                }
                Ok(rows)
            });
            rows.await
        }

        async fn inbox_store_result(
            &mut self,
            consumer: &str,
            key: &str,
            value: &[u8],
        ) -> QueryResult<()> {
            st::Side(st::store_result(consumer, key, value))
                .execute(self)
                .await
                .and_then(st::stored_one)
        }

        async fn inbox_attempts(
            &mut self,
            consumer: &str,
            key: &str,
        ) -> QueryResult<Option<AttemptsRow>> {
            let micros = B::UPDATED_AT_MICROS;
            let status = state_unknown(self);
            let rows = st::Side(st::attempts(consumer, key, micros))
                .load_on_async(self)
                .await;
            state_known(self, status);
            rows.map(first)
        }

        async fn inbox_clear_attempts(&mut self, consumer: &str, key: &str) -> QueryResult<usize> {
            let status = state_unknown(self);
            let cleared = st::Side(st::clear_attempts(consumer, key))
                .execute(self)
                .await;
            state_known(self, status);
            cleared
        }

        async fn inbox_count_failure(
            &mut self,
            consumer: &str,
            key: &str,
            error: &str,
        ) -> QueryResult<()> {
            st::count_failure::<B>(consumer, key, error)
                .execute(self)
                .await
                .map(drop)
        }

        fn inbox_purge_batch(
            &mut self,
            cutoff: String,
            consumer: Option<String>,
            limit: i64,
        ) -> impl Future<Output = QueryResult<usize>> + Send {
            let deleted: Io<'_, usize> = Box::pin(async move {
                let rows = match consumer.as_deref() {
                    Some(name) => {
                        st::oldest_of(&cutoff, name, limit)
                            .load_on_async(self)
                            .await?
                    }
                    None => st::oldest(&cutoff, limit).load_on_async(self).await?,
                };
                let mut deleted = 0;
                for (name, keys) in st::purge_plan(rows) {
                    deleted += st::delete_older(&cutoff, name, keys).execute(self).await?;
                }
                Ok(deleted)
            });
            deleted
        }

        fn inbox_count_older(
            &mut self,
            cutoff: String,
            consumer: Option<String>,
        ) -> impl Future<Output = QueryResult<i64>> + Send {
            let count: Io<'_, i64> = Box::pin(async move {
                let status = state_unknown(self);
                let rows = match consumer.as_deref() {
                    Some(name) => st::count_older_of(&cutoff, name).load_on_async(self).await,
                    None => st::count_older(&cutoff).load_on_async(self).await,
                };
                state_known(self, status);
                first(rows?).ok_or(diesel::result::Error::NotFound)
            });
            count
        }

        async fn inbox_still_open(&mut self) -> QueryResult<Option<bool>> {
            // Inside the call's transaction: a drop leaves the manager's
            // depth above 0, and the pool discards the connection.
            let Some(probe) = B::OPEN_PROBE else {
                return Ok(None);
            };
            let rows = st::still_open(probe).load_on_async(self).await?;
            Ok(first(rows).flatten().map(|open| open != 0))
        }

        async fn inbox_entry(
            &mut self,
            consumer: &str,
            key: &str,
        ) -> QueryResult<Option<InboxEntry>> {
            let micros = B::RECEIVED_AT_MICROS;
            let status = state_unknown(self);
            let rows = st::entry(consumer, key, micros).load_on_async(self).await;
            state_known(self, status);
            Ok(first(rows?).map(rows::entry))
        }

        async fn inbox_forget(&mut self, consumer: &str, key: &str) -> QueryResult<bool> {
            let status = state_unknown(self);
            let forgotten = match st::forget(consumer, key).execute(self).await {
                Ok(applied) => st::clear_attempts(consumer, key)
                    .execute(self)
                    .await
                    .map(|counted| applied + counted > 0),
                Err(e) => Err(e),
            };
            state_known(self, status);
            forgotten
        }

        fn inbox_stats(&mut self) -> impl Future<Output = QueryResult<Vec<ConsumerStats>>> + Send {
            let stats: Io<'_, Vec<ConsumerStats>> = Box::pin(async move {
                let (oldest, newest) = st::stats_bounds::<B>();
                let status = state_unknown(self);
                let rows = st::stats(&oldest, &newest).load_on_async(self).await;
                state_known(self, status);
                Ok(rows?.into_iter().map(rows::consumer_stats).collect())
            });
            stats
        }

        async fn inbox_purge_attempts(
            &mut self,
            cutoff: &str,
            consumer: Option<&str>,
        ) -> QueryResult<usize> {
            let status = state_unknown(self);
            let deleted = match consumer {
                Some(consumer) => {
                    st::delete_attempts_older_of(cutoff, consumer)
                        .execute(self)
                        .await
                }
                None => st::delete_attempts_older(cutoff).execute(self).await,
            };
            state_known(self, status);
            deleted
        }

        async fn inbox_failing(
            &mut self,
            consumer: Option<&str>,
            min_failures: i32,
            limit: i64,
        ) -> QueryResult<Vec<FailingRow>> {
            let micros = B::UPDATED_AT_MICROS;
            let status = state_unknown(self);
            let rows = match consumer {
                Some(consumer) => {
                    st::failing_of(consumer, min_failures, micros, limit)
                        .load_on_async(self)
                        .await
                }
                None => {
                    st::failing(min_failures, micros, limit)
                        .load_on_async(self)
                        .await
                }
            };
            state_known(self, status);
            rows
        }
    }
}
