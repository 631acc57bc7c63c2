//! The statements of `backend::statements`, run on a sync connection
//! (`diesel::RunQueryDsl`) and on an async one (`diesel_async::RunQueryDsl`,
//! in [`asynchronous`]). Each function is the same few steps on both: load
//! or execute, then the shared decision (`statements::missing`,
//! `statements::purge_plan`, `statements::stored_one`). The backends'
//! `InboxBackend` and `AsyncInboxConnection` implementations call these.

use super::statements::{self as st, CLAIM_CHUNK};
#[cfg(feature = "_counted-claim")]
use super::statements::{Fingerprinted, Plain};
use super::InboxBackend;
use crate::rows::{self, AttemptsRow, ConsumerStats, FailingRow, InboxEntry, StoredRow};
use diesel::connection::Connection;
use diesel::query_dsl::methods::{ExecuteDsl, LoadQuery};
use diesel::result::QueryResult;
use diesel::{OptionalExtension, RunQueryDsl};

/// Stamps out, inside a backend's `impl InboxBackend`, the methods whose
/// body is the same for every backend: a call of the sync executor
/// (`backend::execute`) of the statement. Only the signatures are here.
#[cfg(feature = "_any-backend")]
macro_rules! sync_ops {
    () => {
        fn outbox<C>(
            conn: &mut C,
            op: crate::backend::outbox::Op,
        ) -> QueryResult<crate::backend::outbox::Answer>
        where
            C: LoadConnection<Backend = Self>,
        {
            crate::backend::outbox::run(conn, op)
        }

        fn purge_batch<C>(
            conn: &mut C,
            cutoff: &str,
            scope: Option<&str>,
            limit: i64,
        ) -> QueryResult<usize>
        where
            C: LoadConnection<Backend = Self>,
        {
            crate::backend::execute::purge_batch(conn, cutoff, scope, limit)
        }

        fn count_older<C>(conn: &mut C, cutoff: &str, scope: Option<&str>) -> QueryResult<i64>
        where
            C: LoadConnection<Backend = Self>,
        {
            crate::backend::execute::count_older(conn, cutoff, scope)
        }

        fn entry<C>(
            conn: &mut C,
            consumer_name: &str,
            key: &str,
        ) -> QueryResult<Option<crate::rows::InboxEntry>>
        where
            C: LoadConnection<Backend = Self>,
        {
            crate::backend::execute::entry(conn, consumer_name, key)
        }

        fn forget<C>(conn: &mut C, consumer_name: &str, key: &str) -> QueryResult<bool>
        where
            C: LoadConnection<Backend = Self>,
        {
            crate::backend::execute::forget(conn, consumer_name, key)
        }

        fn stats<C>(conn: &mut C) -> QueryResult<Vec<crate::rows::ConsumerStats>>
        where
            C: LoadConnection<Backend = Self>,
        {
            crate::backend::execute::stats(conn)
        }

        fn purge_attempts<C>(
            conn: &mut C,
            cutoff: &str,
            consumer_name: Option<&str>,
        ) -> QueryResult<usize>
        where
            C: LoadConnection<Backend = Self>,
        {
            crate::backend::execute::purge_attempts(conn, cutoff, consumer_name)
        }

        fn failing<C>(
            conn: &mut C,
            consumer_name: Option<&str>,
            min_failures: i32,
            limit: i64,
        ) -> QueryResult<Vec<crate::rows::FailingRow>>
        where
            C: LoadConnection<Backend = Self>,
        {
            crate::backend::execute::failing(conn, consumer_name, min_failures, limit)
        }

        fn stored<C>(
            conn: &mut C,
            consumer_name: &str,
            keys: &[&str],
        ) -> QueryResult<Vec<crate::rows::StoredRow>>
        where
            C: LoadConnection<Backend = Self>,
        {
            crate::backend::execute::stored(conn, consumer_name, keys)
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
            crate::backend::execute::store_result(conn, consumer_name, key, value)
        }

        fn attempts<C>(
            conn: &mut C,
            consumer_name: &str,
            key: &str,
        ) -> QueryResult<Option<crate::rows::AttemptsRow>>
        where
            C: LoadConnection<Backend = Self>,
        {
            crate::backend::execute::attempts(conn, consumer_name, key)
        }

        fn clear_attempts<C>(conn: &mut C, consumer_name: &str, key: &str) -> QueryResult<usize>
        where
            C: LoadConnection<Backend = Self>,
        {
            crate::backend::execute::clear_attempts(conn, consumer_name, key)
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
            crate::backend::execute::count_failure(conn, consumer_name, key, error)
        }
    };
}

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

/// The fingerprints and stored results of those of `keys` that have a row.
pub(crate) fn stored<C>(conn: &mut C, consumer: &str, keys: &[&str]) -> QueryResult<Vec<StoredRow>>
where
    C: Connection,
    for<'a> st::Side<st::stored<'a>>: LoadQuery<'a, C, StoredRow>,
{
    let mut rows = Vec::with_capacity(keys.len());
    for chunk in keys.chunks(CLAIM_CHUNK) {
        rows.extend(st::Side(st::stored(consumer, st::owned(chunk))).load::<StoredRow>(conn)?);
    }
    Ok(rows)
}

/// Writes the body's value into the row just claimed.
pub(crate) fn store_result<C>(
    conn: &mut C,
    consumer: &str,
    key: &str,
    value: &[u8],
) -> QueryResult<()>
where
    C: Connection,
    for<'a> st::Side<st::store_result<'a>>: ExecuteDsl<C>,
{
    st::Side(st::store_result(consumer, key, value))
        .execute(conn)
        .and_then(st::stored_one)
}

/// The failure count of `(consumer, key)`.
pub(crate) fn attempts<C>(
    conn: &mut C,
    consumer: &str,
    key: &str,
) -> QueryResult<Option<AttemptsRow>>
where
    C: Connection<Backend: InboxBackend>,
    for<'a> st::Side<st::attempts<'a>>: LoadQuery<'a, C, AttemptsRow>,
{
    let micros = <C::Backend as crate::backend::Internals>::UPDATED_AT_MICROS;
    st::Side(st::attempts(consumer, key, micros))
        .get_result(conn)
        .optional()
}

/// Deletes the failure count of `(consumer, key)`.
pub(crate) fn clear_attempts<C>(conn: &mut C, consumer: &str, key: &str) -> QueryResult<usize>
where
    C: Connection,
    for<'a> st::Side<st::clear_attempts<'a>>: ExecuteDsl<C>,
{
    st::Side(st::clear_attempts(consumer, key)).execute(conn)
}

/// Adds one failure to the count of `(consumer, key)`, in the caller's
/// transaction.
pub(crate) fn count_failure<C>(
    conn: &mut C,
    consumer: &str,
    key: &str,
    error: &str,
) -> QueryResult<()>
where
    C: Connection<Backend: InboxBackend + diesel::sql_types::HasSqlType<diesel::sql_types::Text>>,
    for<'a> &'a str: diesel::serialize::ToSql<diesel::sql_types::Text, C::Backend>,
    for<'a> st::CountFailure<'a, C::Backend>: ExecuteDsl<C>,
{
    st::count_failure::<C::Backend>(consumer, key, error)
        .execute(conn)
        .map(drop)
}

/// One purge batch's statements, in the caller's transaction: the rows
/// deleted.
pub(crate) fn purge_batch<C>(
    conn: &mut C,
    cutoff: &str,
    consumer: Option<&str>,
    limit: i64,
) -> QueryResult<usize>
where
    C: Connection,
    for<'a> st::oldest: LoadQuery<'a, C, (String, String)>,
    for<'a> st::oldest_of<'a>: LoadQuery<'a, C, (String, String)>,
    st::delete_older: ExecuteDsl<C>,
{
    let rows = match consumer {
        Some(name) => st::oldest_of(cutoff, name, limit).load(conn)?,
        None => st::oldest(cutoff, limit).load(conn)?,
    };
    let mut deleted = 0;
    for (name, keys) in st::purge_plan(rows) {
        deleted += st::delete_older(cutoff, name, keys).execute(conn)?;
    }
    Ok(deleted)
}

/// How many rows are older than `cutoff`.
pub(crate) fn count_older<C>(conn: &mut C, cutoff: &str, consumer: Option<&str>) -> QueryResult<i64>
where
    C: Connection,
    for<'a> st::count_older: LoadQuery<'a, C, i64>,
    for<'a> st::count_older_of<'a>: LoadQuery<'a, C, i64>,
{
    match consumer {
        Some(name) => st::count_older_of(cutoff, name).get_result(conn),
        None => st::count_older(cutoff).get_result(conn),
    }
}

/// The row of `(consumer, key)`.
pub(crate) fn entry<C>(conn: &mut C, consumer: &str, key: &str) -> QueryResult<Option<InboxEntry>>
where
    C: Connection<Backend: InboxBackend>,
    for<'a> st::entry<'a>: LoadQuery<'a, C, (String, String, i64)>,
{
    let micros = <C::Backend as crate::backend::Internals>::RECEIVED_AT_MICROS;
    let row = st::entry(consumer, key, micros)
        .get_result(conn)
        .optional()?;
    Ok(row.map(rows::entry))
}

/// Deletes the row of `(consumer, key)` and its failure count (a forgotten
/// key starts over): whether there was either.
pub(crate) fn forget<C>(conn: &mut C, consumer: &str, key: &str) -> QueryResult<bool>
where
    C: Connection,
    for<'a> st::forget<'a>: ExecuteDsl<C>,
    for<'a> st::clear_attempts<'a>: ExecuteDsl<C>,
{
    let applied = st::forget(consumer, key).execute(conn)?;
    let counted = st::clear_attempts(consumer, key).execute(conn)?;
    Ok(applied + counted > 0)
}

/// Rows, oldest and newest per consumer.
pub(crate) fn stats<C>(conn: &mut C) -> QueryResult<Vec<ConsumerStats>>
where
    C: Connection<Backend: InboxBackend>,
    for<'a> st::stats: LoadQuery<'a, C, (String, i64, i64, i64)>,
{
    let (oldest, newest) = st::stats_bounds::<C::Backend>();
    let rows = st::stats(&oldest, &newest).load(conn)?;
    Ok(rows.into_iter().map(rows::consumer_stats).collect())
}

/// Deletes the failure counts (of `consumer`, or of all) last updated
/// before `cutoff`.
pub(crate) fn purge_attempts<C>(
    conn: &mut C,
    cutoff: &str,
    consumer: Option<&str>,
) -> QueryResult<usize>
where
    C: Connection<Backend: InboxBackend>,
    for<'a> st::delete_attempts_older: ExecuteDsl<C>,
    for<'a> st::delete_attempts_older_of<'a>: ExecuteDsl<C>,
{
    match consumer {
        Some(consumer) => st::delete_attempts_older_of(cutoff, consumer).execute(conn),
        None => st::delete_attempts_older(cutoff).execute(conn),
    }
}

/// The failure counts of at least `min_failures` (of `consumer`, or of
/// all), the latest first, at most `limit`.
pub(crate) fn failing<C>(
    conn: &mut C,
    consumer: Option<&str>,
    min_failures: i32,
    limit: i64,
) -> QueryResult<Vec<FailingRow>>
where
    C: Connection<Backend: InboxBackend>,
    for<'a> st::failing: LoadQuery<'a, C, FailingRow>,
    for<'a> st::failing_of<'a>: LoadQuery<'a, C, FailingRow>,
{
    let micros = <C::Backend as crate::backend::Internals>::UPDATED_AT_MICROS;
    match consumer {
        Some(consumer) => st::failing_of(consumer, min_failures, micros, limit).load(conn),
        None => st::failing(min_failures, micros, limit).load(conn),
    }
}

/// The same steps on a diesel-async connection.
#[cfg(all(feature = "async", feature = "_server-backend"))]
pub(crate) mod asynchronous {
    use super::st::{self, CLAIM_CHUNK};
    #[cfg(feature = "mysql")]
    use super::st::{Fingerprinted, Plain};
    use super::InboxBackend;
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
