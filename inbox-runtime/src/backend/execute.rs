//! The statements of `backend::statements`, run on a sync connection
//! ([`Statements`]: one blanket implementation for every backend, its
//! bounds stated per backend through `statements::LoadOn`/`ExecuteOn`) and
//! on an async one (`diesel_async::RunQueryDsl`, in [`asynchronous`]). Each
//! operation is the same few steps on both: load or execute, then the
//! shared decision (`statements::missing`, `statements::purge_plan`,
//! `statements::stored_one`). A backend's own steps (its claims, catalog,
//! locks) are its `Internals`.

use super::outbox::{Answer, ClaimedRow, DeadRow, Enqueue, MarkerRow, Op, SeqRow, StatusRow, Stmt};
use super::statements::{self as st, ExecuteOn, LoadOn, CLAIM_CHUNK};
#[cfg(feature = "_counted-claim")]
use super::statements::{Fingerprinted, Plain};
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

/// Stamps out, inside an `impl AsyncInboxConnection` of a diesel-async
/// connection with `AnsiTransactionManager` (PostgreSQL, MySQL/MariaDB),
/// the methods whose body is a call of the async executor
/// (`backend::execute::asynchronous`). Only the signatures are here.
#[cfg(all(feature = "async", feature = "_server-backend"))]
macro_rules! async_ops {
    () => {
        async fn inbox_outbox(
            &mut self,
            op: crate::backend::outbox::Op,
        ) -> QueryResult<crate::backend::outbox::Answer> {
            crate::backend::outbox::run_async(self, op).await
        }

        async fn inbox_purge_batch(
            &mut self,
            cutoff: String,
            scope: Option<String>,
            limit: i64,
        ) -> QueryResult<usize> {
            crate::backend::execute::asynchronous::purge_batch(
                self,
                &cutoff,
                scope.as_deref(),
                limit,
            )
            .await
        }

        async fn inbox_count_older(
            &mut self,
            cutoff: String,
            scope: Option<String>,
        ) -> QueryResult<i64> {
            crate::backend::execute::asynchronous::count_older(self, &cutoff, scope.as_deref())
                .await
        }

        async fn inbox_entry(
            &mut self,
            consumer_name: &str,
            key: &str,
        ) -> QueryResult<Option<crate::rows::InboxEntry>> {
            crate::backend::execute::asynchronous::entry(self, consumer_name, key).await
        }

        async fn inbox_forget(&mut self, consumer_name: &str, key: &str) -> QueryResult<bool> {
            crate::backend::execute::asynchronous::forget(self, consumer_name, key).await
        }

        async fn inbox_stats(&mut self) -> QueryResult<Vec<crate::rows::ConsumerStats>> {
            crate::backend::execute::asynchronous::stats(self).await
        }

        async fn inbox_purge_attempts(
            &mut self,
            cutoff: &str,
            consumer_name: Option<&str>,
        ) -> QueryResult<usize> {
            crate::backend::execute::asynchronous::purge_attempts(self, cutoff, consumer_name).await
        }

        async fn inbox_failing(
            &mut self,
            consumer_name: Option<&str>,
            min_failures: i32,
            limit: i64,
        ) -> QueryResult<Vec<crate::rows::FailingRow>> {
            crate::backend::execute::asynchronous::failing(self, consumer_name, min_failures, limit)
                .await
        }

        async fn inbox_stored(
            &mut self,
            consumer_name: &str,
            keys: &[&str],
        ) -> QueryResult<Vec<crate::rows::StoredRow>> {
            crate::backend::execute::asynchronous::stored(self, consumer_name, keys).await
        }

        async fn inbox_store_result(
            &mut self,
            consumer_name: &str,
            key: &str,
            value: &[u8],
        ) -> QueryResult<()> {
            crate::backend::execute::asynchronous::store_result(self, consumer_name, key, value)
                .await
        }

        async fn inbox_attempts(
            &mut self,
            consumer_name: &str,
            key: &str,
        ) -> QueryResult<Option<crate::rows::AttemptsRow>> {
            crate::backend::execute::asynchronous::attempts(self, consumer_name, key).await
        }

        async fn inbox_clear_attempts(
            &mut self,
            consumer_name: &str,
            key: &str,
        ) -> QueryResult<usize> {
            crate::backend::execute::asynchronous::clear_attempts(self, consumer_name, key).await
        }

        async fn inbox_count_failure(
            &mut self,
            consumer_name: &str,
            key: &str,
            error: &str,
        ) -> QueryResult<()> {
            crate::backend::execute::asynchronous::count_failure(self, consumer_name, key, error)
                .await
        }
    };
}

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
        + LoadOn<B, StatusRow>
        + LoadOn<B, DeadRow>
        + LoadOn<B, SeqRow>,
    Enqueue: ExecuteOn<B> + LoadOn<B, MarkerRow>,
    for<'a> st::Side<st::stored<'a>>: LoadOn<B, StoredRow>,
    for<'a> st::Side<st::store_result<'a>>: ExecuteOn<B>,
    for<'a> st::Side<st::attempts<'a>>: LoadOn<B, AttemptsRow>,
    for<'a> st::Side<st::clear_attempts<'a>>: ExecuteOn<B>,
    for<'a> st::CountFailure<'a, B>: ExecuteOn<B>,
    st::oldest: LoadOn<B, (String, String)>,
    for<'a> st::oldest_of<'a>: LoadOn<B, (String, String)>,
    st::delete_older: ExecuteOn<B>,
    st::count_older: LoadOn<B, i64>,
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
#[cfg(all(feature = "async", feature = "_server-backend"))]
pub(crate) mod asynchronous {
    use super::st::{self, CLAIM_CHUNK};
    #[cfg(feature = "mysql")]
    use super::st::{Fingerprinted, Plain};
    use super::Internals as InboxBackend;
    use crate::rows::{self, AttemptsRow, ConsumerStats, FailingRow, InboxEntry, StoredRow};
    use diesel::result::QueryResult;
    use diesel::OptionalExtension;
    use diesel_async::methods::{ExecuteDsl, LoadQuery};
    use diesel_async::{AsyncConnection, RunQueryDsl};
    use std::future::Future;
    use std::pin::Pin;

    /// A statement's run on an async connection, boxed where it loads
    /// rows: the backends' `AsyncInboxConnection` futures must be `Send`,
    /// and rustc cannot prove that through a load's lifetime-bound
    /// where-clauses (it erases the lifetimes when it checks auto traits);
    /// a boxed `dyn Future + Send` is checked here, where the bounds hold.
    /// The statements that only execute (the claim, the stored result's
    /// update, deletes) are plain `async fn`s: no allocation on the
    /// message path.
    pub(crate) type Io<'q, T> = Pin<Box<dyn Future<Output = QueryResult<T>> + Send + 'q>>;

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

    pub(crate) fn stored<'q, C>(
        conn: &'q mut C,
        consumer: &'q str,
        keys: &'q [&'q str],
    ) -> Io<'q, Vec<StoredRow>>
    where
        C: AsyncConnection + Send,
        st::Side<st::stored<'q>>: LoadQuery<'q, C, StoredRow>,
    {
        Box::pin(async move {
            let mut rows = Vec::with_capacity(keys.len());
            for chunk in keys.chunks(CLAIM_CHUNK) {
                rows.extend(
                    st::Side(st::stored(consumer, st::owned(chunk)))
                        .load::<StoredRow>(conn)
                        .await?,
                );
            }
            Ok(rows)
        })
    }

    pub(crate) async fn store_result<'q, C>(
        conn: &mut C,
        consumer: &'q str,
        key: &'q str,
        value: &'q [u8],
    ) -> QueryResult<()>
    where
        C: AsyncConnection + Send,
        st::Side<st::store_result<'q>>: ExecuteDsl<C>,
    {
        st::Side(st::store_result(consumer, key, value))
            .execute(conn)
            .await
            .and_then(st::stored_one)
    }

    pub(crate) fn attempts<'q, C>(
        conn: &'q mut C,
        consumer: &'q str,
        key: &'q str,
    ) -> Io<'q, Option<AttemptsRow>>
    where
        C: AsyncConnection<Backend: InboxBackend> + Send,
        st::Side<st::attempts<'q>>: LoadQuery<'q, C, AttemptsRow>,
    {
        Box::pin(async move {
            let micros = <C::Backend as crate::backend::Internals>::UPDATED_AT_MICROS;
            st::Side(st::attempts(consumer, key, micros))
                .get_result(conn)
                .await
                .optional()
        })
    }

    pub(crate) async fn clear_attempts<'q, C>(
        conn: &mut C,
        consumer: &'q str,
        key: &'q str,
    ) -> QueryResult<usize>
    where
        C: AsyncConnection + Send,
        st::Side<st::clear_attempts<'q>>: ExecuteDsl<C>,
    {
        st::Side(st::clear_attempts(consumer, key))
            .execute(conn)
            .await
    }

    pub(crate) fn count_failure<'q, C>(
        conn: &'q mut C,
        consumer: &'q str,
        key: &'q str,
        error: &'q str,
    ) -> Io<'q, ()>
    where
        C: AsyncConnection<Backend: InboxBackend> + Send,
        st::CountFailure<'q, C::Backend>: ExecuteDsl<C>,
        C::Backend: diesel::sql_types::HasSqlType<diesel::sql_types::Text>,
        &'q str: diesel::serialize::ToSql<diesel::sql_types::Text, C::Backend>,
    {
        Box::pin(async move {
            st::count_failure::<C::Backend>(consumer, key, error)
                .execute(conn)
                .await
                .map(drop)
        })
    }

    pub(crate) fn purge_batch<'q, C>(
        conn: &'q mut C,
        cutoff: &'q str,
        consumer: Option<&'q str>,
        limit: i64,
    ) -> Io<'q, usize>
    where
        C: AsyncConnection + Send,
        st::oldest: LoadQuery<'q, C, (String, String)>,
        st::oldest_of<'q>: LoadQuery<'q, C, (String, String)>,
        st::delete_older: ExecuteDsl<C>,
    {
        Box::pin(async move {
            let rows = match consumer {
                Some(name) => st::oldest_of(cutoff, name, limit).load(conn).await?,
                None => st::oldest(cutoff, limit).load(conn).await?,
            };
            let mut deleted = 0;
            for (name, keys) in st::purge_plan(rows) {
                deleted += st::delete_older(cutoff, name, keys).execute(conn).await?;
            }
            Ok(deleted)
        })
    }

    pub(crate) fn count_older<'q, C>(
        conn: &'q mut C,
        cutoff: &'q str,
        consumer: Option<&'q str>,
    ) -> Io<'q, i64>
    where
        C: AsyncConnection + Send,
        st::count_older: LoadQuery<'q, C, i64>,
        st::count_older_of<'q>: LoadQuery<'q, C, i64>,
    {
        Box::pin(async move {
            match consumer {
                Some(name) => st::count_older_of(cutoff, name).get_result(conn).await,
                None => st::count_older(cutoff).get_result(conn).await,
            }
        })
    }

    pub(crate) fn entry<'q, C>(
        conn: &'q mut C,
        consumer: &'q str,
        key: &'q str,
    ) -> Io<'q, Option<InboxEntry>>
    where
        C: AsyncConnection<Backend: InboxBackend> + Send,
        st::entry<'q>: LoadQuery<'q, C, (String, String, i64)>,
    {
        Box::pin(async move {
            let micros = <C::Backend as crate::backend::Internals>::RECEIVED_AT_MICROS;
            let row = st::entry(consumer, key, micros)
                .get_result(conn)
                .await
                .optional()?;
            Ok(row.map(rows::entry))
        })
    }

    pub(crate) fn forget<'q, C>(conn: &'q mut C, consumer: &'q str, key: &'q str) -> Io<'q, bool>
    where
        C: AsyncConnection + Send,
        st::forget<'q>: ExecuteDsl<C>,
        st::clear_attempts<'q>: ExecuteDsl<C>,
    {
        Box::pin(async move {
            let applied = st::forget(consumer, key).execute(conn).await?;
            let counted = st::clear_attempts(consumer, key).execute(conn).await?;
            Ok(applied + counted > 0)
        })
    }

    pub(crate) fn purge_attempts<'q, C>(
        conn: &'q mut C,
        cutoff: &'q str,
        consumer: Option<&'q str>,
    ) -> Io<'q, usize>
    where
        C: AsyncConnection<Backend: InboxBackend> + Send,
        st::delete_attempts_older: ExecuteDsl<C>,
        st::delete_attempts_older_of<'q>: ExecuteDsl<C>,
    {
        Box::pin(async move {
            match consumer {
                Some(consumer) => {
                    st::delete_attempts_older_of(cutoff, consumer)
                        .execute(conn)
                        .await
                }
                None => st::delete_attempts_older(cutoff).execute(conn).await,
            }
        })
    }

    pub(crate) fn failing<'q, C>(
        conn: &'q mut C,
        consumer: Option<&'q str>,
        min_failures: i32,
        limit: i64,
    ) -> Io<'q, Vec<FailingRow>>
    where
        C: AsyncConnection<Backend: InboxBackend> + Send,
        st::failing: LoadQuery<'q, C, FailingRow>,
        st::failing_of<'q>: LoadQuery<'q, C, FailingRow>,
    {
        Box::pin(async move {
            let micros = <C::Backend as crate::backend::Internals>::UPDATED_AT_MICROS;
            match consumer {
                Some(consumer) => {
                    st::failing_of(consumer, min_failures, micros, limit)
                        .load(conn)
                        .await
                }
                None => st::failing(min_failures, micros, limit).load(conn).await,
            }
        })
    }

    pub(crate) fn stats<'q, C>(conn: &'q mut C) -> Io<'q, Vec<ConsumerStats>>
    where
        C: AsyncConnection<Backend: InboxBackend> + Send,
        st::stats: LoadQuery<'q, C, (String, i64, i64, i64)>,
    {
        Box::pin(async move {
            let (oldest, newest) = st::stats_bounds::<C::Backend>();
            let rows = st::stats(&oldest, &newest).load(conn).await?;
            Ok(rows.into_iter().map(rows::consumer_stats).collect())
        })
    }
}
