//! Every statement of the inbox, written once as a value: diesel query
//! builders (`#[auto_type]` names their types) or a `QueryFragment` type
//! with a static query id. `backend::execute` runs them on a sync or an
//! async connection; what differs between databases comes in as the
//! backend's constants (the claim's insert and conflict clause, the
//! `received_at` expression). The decisions between statements (which keys
//! a lookup found missing, how a purge batch's rows group into deletes) are
//! plain functions here too, so that both executors share them.
// Without a backend feature nothing runs these.
#![cfg_attr(not(feature = "_any-backend"), allow(dead_code))]

use super::Internals;
use crate::rows::StoredRow;
use crate::schema::{inbox_attempts as counts, inbox_messages as inbox};
use diesel::dsl::{count_star, delete, sql, update};
use diesel::expression::SqlLiteral;
use diesel::prelude::*;
use diesel::query_builder::{AstPass, QueryFragment, QueryId};
use diesel::serialize::ToSql;
use diesel::sql_types::{BigInt, HasSqlType, Nullable, Text, Timestamp};

/// Most keys one statement carries (bind-parameter limits: PostgreSQL
/// 65535, SQLite 32766; two per row).
pub(crate) const CLAIM_CHUNK: usize = 5_000;

/// The query id of a statement without fingerprints: one cached statement
/// whatever the lifetimes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Plain;
/// The query id of the same statement with fingerprints.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Fingerprinted;

/// The backends whose claim is [`Claim`], an insert whose affected-row
/// count is the verdict (MySQL/MariaDB, SQLite: their prepared statements
/// belong to the connection, whatever sits between it and the server).
/// PostgreSQL's claims are its own statements, which check what they
/// return (`backend::postgres`).
#[cfg(feature = "_counted-claim")]
pub(crate) trait CountedClaim {
    /// The claim's insert: `INSERT INTO`, or MySQL's `INSERT IGNORE INTO`.
    /// Not `ON DUPLICATE KEY UPDATE` on MySQL: diesel connects with
    /// CLIENT_FOUND_ROWS, so that form reports 1 for a duplicate too.
    const INSERT: &'static str;
    /// What follows the claim's `VALUES`: the conflict clause with its
    /// target named (any other unique violation must fail), or nothing.
    const CONFLICT: &'static str;
}

/// The single claim: the backend's conflict-ignoring insert of one row
/// (`B::INSERT` ... `B::CONFLICT`, [`CountedClaim`]), with the fingerprint when
/// the call has one (a statement of its own, [`Fingerprinted`]); without
/// one it is the statement of schema 1.
#[cfg(feature = "_counted-claim")]
#[derive(Debug, Clone, Copy)]
pub(crate) struct Claim<'a, Id> {
    consumer: &'a str,
    key: &'a str,
    fingerprint: Option<&'a [u8]>,
    id: std::marker::PhantomData<Id>,
}

#[cfg(feature = "_counted-claim")]
impl<'a> Claim<'a, Plain> {
    /// The claim of `key` for `consumer`, without a fingerprint.
    pub(crate) fn plain(consumer: &'a str, key: &'a str) -> Self {
        Claim {
            consumer,
            key,
            fingerprint: None,
            id: std::marker::PhantomData,
        }
    }
}

#[cfg(feature = "_counted-claim")]
impl<'a> Claim<'a, Fingerprinted> {
    /// The claim of `key` for `consumer`, storing its content's fingerprint.
    pub(crate) fn fingerprinted(consumer: &'a str, key: &'a str, fingerprint: &'a [u8]) -> Self {
        Claim {
            consumer,
            key,
            fingerprint: Some(fingerprint),
            id: std::marker::PhantomData,
        }
    }
}

#[cfg(feature = "_counted-claim")]
impl<B, Id> QueryFragment<B> for Claim<'_, Id>
where
    B: Internals + CountedClaim + HasSqlType<Text> + HasSqlType<diesel::sql_types::Binary>,
    str: ToSql<Text, B>,
    [u8]: ToSql<diesel::sql_types::Binary, B>,
{
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, B>) -> QueryResult<()> {
        out.push_sql(B::INSERT);
        match self.fingerprint {
            None => out.push_sql(" inbox_messages (consumer, message_id) VALUES ("),
            Some(_) => out.push_sql(" inbox_messages (consumer, message_id, fingerprint) VALUES ("),
        }
        out.push_bind_param::<Text, str>(self.consumer)?;
        out.push_sql(", ");
        out.push_bind_param::<Text, str>(self.key)?;
        if let Some(fingerprint) = self.fingerprint {
            out.push_sql(", ");
            out.push_bind_param::<diesel::sql_types::Binary, [u8]>(fingerprint)?;
        }
        out.push_sql(")");
        out.push_sql(B::CONFLICT);
        Ok(())
    }
}

// The id is the statement's own type (as diesel's are), never a bare
// marker another statement could share: diesel caches prepared statements
// by it, and two statements under one id would run each other's SQL.
#[cfg(feature = "_counted-claim")]
impl<Id: 'static> QueryId for Claim<'_, Id> {
    type QueryId = Claim<'static, Id>;
    const HAS_STATIC_QUERY_ID: bool = true;
}

#[cfg(feature = "_counted-claim")]
impl<Conn, Id> RunQueryDsl<Conn> for Claim<'_, Id> {}

/// A statement of a call other than its claim (a duplicate's row, the
/// stored result's update, the failure counts), which a backend may keep
/// out of diesel's statement cache (`B::CACHE_SIDE_STATEMENTS`): run
/// unnamed, a statement cannot be reached by another client through a
/// proxy that shares prepared statements' names between clients, nor reach
/// another client's statement under its own name. The SQL is the inner
/// statement's.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Side<Q>(pub(crate) Q);

impl<B, Q> QueryFragment<B> for Side<Q>
where
    B: Internals,
    Q: QueryFragment<B>,
{
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, B>) -> QueryResult<()> {
        if !B::CACHE_SIDE_STATEMENTS {
            out.unsafe_to_cache_prepared();
        }
        self.0.walk_ast(out.reborrow())
    }
}

impl<Q: QueryId> QueryId for Side<Q> {
    type QueryId = Side<Q::QueryId>;
    const HAS_STATIC_QUERY_ID: bool = Q::HAS_STATIC_QUERY_ID;
}

impl<Q: diesel::query_builder::Query> diesel::query_builder::Query for Side<Q> {
    type SqlType = Q::SqlType;
}

impl<Conn, Q> RunQueryDsl<Conn> for Side<Q> {}

/// Which of `keys` are in the inbox for `consumer` (a batch claim's
/// lookup, on backends without `RETURNING` on a conflict-ignoring insert).
#[cfg(feature = "_counted-claim")]
#[diesel::dsl::auto_type]
pub(crate) fn present<'a>(consumer: &'a str, keys: Vec<String>) -> _ {
    inbox::table
        .filter(inbox::consumer.eq(consumer))
        .filter(inbox::message_id.eq_any(keys))
        .select(inbox::message_id)
}

/// The positions of `chunk` that a lookup did not find: the keys to insert.
#[cfg(feature = "_counted-claim")]
pub(crate) fn missing(chunk: &[&str], present: Vec<String>) -> Vec<usize> {
    let present: std::collections::HashSet<String> = present.into_iter().collect();
    (0..chunk.len())
        .filter(|&i| !present.contains(chunk[i]))
        .collect()
}

/// The rows of a batch claim's plain `INSERT` (a key claimed meanwhile by
/// another batch is a unique violation: the batch reruns). Owned, as the
/// lookup's keys are: a statement that borrows from the executor's locals
/// trips rustc's higher-ranked checks on the async path.
#[cfg(feature = "_counted-claim")]
pub(crate) type ClaimRow = (
    diesel::dsl::Eq<inbox::consumer, String>,
    diesel::dsl::Eq<inbox::message_id, String>,
);

/// [`ClaimRow`] with the fingerprint.
#[cfg(feature = "_counted-claim")]
pub(crate) type FingerprintedClaimRow = (
    diesel::dsl::Eq<inbox::consumer, String>,
    diesel::dsl::Eq<inbox::message_id, String>,
    diesel::dsl::Eq<inbox::fingerprint, Vec<u8>>,
);

/// The insert of the missing keys of a batch.
#[cfg(feature = "_counted-claim")]
#[diesel::dsl::auto_type]
pub(crate) fn insert_claims(rows: Vec<ClaimRow>) -> _ {
    diesel::dsl::insert_into(inbox::table).values(rows)
}

/// [`insert_claims`] with fingerprints.
#[cfg(feature = "_counted-claim")]
#[diesel::dsl::auto_type]
pub(crate) fn insert_fingerprinted_claims(rows: Vec<FingerprintedClaimRow>) -> _ {
    diesel::dsl::insert_into(inbox::table).values(rows)
}

/// The rows to insert for the keys of `chunk` at `missing`.
#[cfg(feature = "_counted-claim")]
pub(crate) fn claim_rows(consumer: &str, chunk: &[&str], missing: &[usize]) -> Vec<ClaimRow> {
    missing
        .iter()
        .map(|&i| {
            (
                inbox::consumer.eq(consumer.to_owned()),
                inbox::message_id.eq(chunk[i].to_owned()),
            )
        })
        .collect()
}

/// [`claim_rows`] with each key's fingerprint (`fingerprints` lines up with
/// `chunk`).
#[cfg(feature = "_counted-claim")]
pub(crate) fn fingerprinted_claim_rows(
    consumer: &str,
    chunk: &[&str],
    fingerprints: &[&[u8]],
    missing: &[usize],
) -> Vec<FingerprintedClaimRow> {
    missing
        .iter()
        .map(|&i| {
            (
                inbox::consumer.eq(consumer.to_owned()),
                inbox::message_id.eq(chunk[i].to_owned()),
                inbox::fingerprint.eq(fingerprints[i].to_vec()),
            )
        })
        .collect()
}

/// `keys`, owned (the lookups' `IN` lists).
pub(crate) fn owned(keys: &[&str]) -> Vec<String> {
    keys.iter().map(|k| (*k).to_owned()).collect()
}

/// The fingerprints and stored results of those of `keys` that have a row.
#[diesel::dsl::auto_type]
pub(crate) fn stored<'a>(consumer: &'a str, keys: Vec<String>) -> _ {
    inbox::table
        .filter(inbox::consumer.eq(consumer))
        .filter(inbox::message_id.eq_any(keys))
        .select((inbox::message_id, inbox::fingerprint, inbox::stored_result))
}

/// The replay's read of one key, before any transaction: the row only
/// when it holds a stored result (a row without one takes the claim's
/// path). `Side`: cached where side statements are (not on PostgreSQL,
/// whose lookup is a guarded statement of its own).
#[cfg(feature = "_counted-claim")]
#[diesel::dsl::auto_type]
pub(crate) fn lookup<'a>(consumer: &'a str, key: &'a str) -> _ {
    inbox::table
        .filter(inbox::consumer.eq(consumer))
        .filter(inbox::message_id.eq(key))
        .filter(inbox::stored_result.is_not_null())
        .select((inbox::message_id, inbox::fingerprint, inbox::stored_result))
}

/// The replay read's row of `key`, from `rows`: none, or the key's own
/// (anything else is another statement's answer: an error, never a
/// replay).
pub(crate) fn looked_up(key: &str, rows: Vec<StoredRow>) -> QueryResult<Option<StoredRow>> {
    let mut rows = rows.into_iter();
    match (rows.next(), rows.next()) {
        (None, _) => Ok(None),
        (Some(row), None) if row.0 == key && row.2.is_some() => Ok(Some(row)),
        _ => Err(crate::backend::errors::misrouted(
            "replay read",
            "returned rows that are not the key's stored result",
        )),
    }
}

/// Writes the body's value into the row just claimed.
#[diesel::dsl::auto_type]
pub(crate) fn store_result<'a>(consumer: &'a str, key: &'a str, value: &'a [u8]) -> _ {
    update(
        inbox::table
            .filter(inbox::consumer.eq(consumer))
            .filter(inbox::message_id.eq(key)),
    )
    .set(inbox::stored_result.eq(value))
}

/// `store_result` must have updated exactly the row just claimed.
pub(crate) fn stored_one(updated: usize) -> QueryResult<()> {
    match updated {
        1 => Ok(()),
        n => Err(diesel::result::Error::QueryBuilderError(
            format!("storing the result updated {n} inbox rows, not the 1 just claimed").into(),
        )),
    }
}

/// The failure count of `(consumer, key)`: failures, last error, and
/// `updated_at` in microseconds (`micros`: the backend's expression).
#[diesel::dsl::auto_type]
pub(crate) fn attempts<'a>(consumer: &'a str, key: &'a str, micros: &str) -> _ {
    let updated: SqlLiteral<BigInt> = sql::<BigInt>(micros);
    counts::table
        .filter(counts::consumer.eq(consumer))
        .filter(counts::message_id.eq(key))
        .select((counts::failures, counts::last_error, updated))
}

/// The failure counts of at least `min_failures`, the latest first, at
/// most `limit`: consumer, key, failures, last error, `updated_at` in
/// microseconds (`micros`: the backend's expression).
#[diesel::dsl::auto_type]
pub(crate) fn failing(min_failures: i32, micros: &str, limit: i64) -> _ {
    let updated: SqlLiteral<BigInt> = sql::<BigInt>(micros);
    counts::table
        .filter(counts::failures.ge(min_failures))
        .select((
            counts::consumer,
            counts::message_id,
            counts::failures,
            counts::last_error,
            updated,
        ))
        .order_by((
            counts::updated_at.desc(),
            counts::consumer,
            counts::message_id,
        ))
        .limit(limit)
}

/// [`failing`] of one consumer.
#[diesel::dsl::auto_type]
pub(crate) fn failing_of<'a>(consumer: &'a str, min_failures: i32, micros: &str, limit: i64) -> _ {
    let all: failing = failing(min_failures, micros, limit);
    all.filter(counts::consumer.eq(consumer))
}

/// Deletes the failure count of `(consumer, key)`.
#[diesel::dsl::auto_type]
pub(crate) fn clear_attempts<'a>(consumer: &'a str, key: &'a str) -> _ {
    delete(
        counts::table
            .filter(counts::consumer.eq(consumer))
            .filter(counts::message_id.eq(key)),
    )
}

/// Adds one failure to the count of `(consumer, key)`: the backend's upsert
/// (`B::COUNT_FAILURE`), with the error cut to the kept length.
pub(crate) fn count_failure<'a, B>(
    consumer: &'a str,
    key: &'a str,
    error: &'a str,
) -> CountFailure<'a, B>
where
    B: Internals + HasSqlType<Text>,
    &'a str: ToSql<Text, B>,
{
    diesel::sql_query(B::COUNT_FAILURE)
        .into_boxed()
        .bind::<Text, _>(consumer)
        .bind::<Text, _>(key)
        .bind::<Text, _>(crate::rows::error_text(error))
}

/// The type of [`count_failure`].
pub(crate) type CountFailure<'a, B> =
    diesel::query_builder::BoxedSqlQuery<'a, B, diesel::query_builder::SqlQuery>;

/// Whether the connection's transaction is still open, by the backend's
/// [`OPEN_PROBE`](Internals::OPEN_PROBE): 1 open, 0 ended, NULL where the
/// server cannot tell.
#[diesel::dsl::auto_type]
pub(crate) fn still_open(probe: &str) -> _ {
    let open: SqlLiteral<Nullable<BigInt>> = sql::<Nullable<BigInt>>(probe);
    diesel::dsl::select(open)
}

/// The oldest `limit` keys claimed before `cutoff` (the backend's SQL for
/// a time), by the `received_at` index: a plain read, no locks.
#[diesel::dsl::auto_type]
pub(crate) fn oldest(cutoff: &str, limit: i64) -> _ {
    let older: SqlLiteral<Timestamp> = sql::<Timestamp>(cutoff);
    inbox::table
        .filter(inbox::received_at.lt(older))
        .order(inbox::received_at)
        .limit(limit)
        .select((inbox::consumer, inbox::message_id))
}

/// [`oldest`], of one consumer.
#[diesel::dsl::auto_type]
pub(crate) fn oldest_of<'a>(cutoff: &str, consumer: &'a str, limit: i64) -> _ {
    let older: SqlLiteral<Timestamp> = sql::<Timestamp>(cutoff);
    inbox::table
        .filter(inbox::received_at.lt(older))
        .filter(inbox::consumer.eq(consumer))
        .order(inbox::received_at)
        .limit(limit)
        .select((inbox::consumer, inbox::message_id))
}

/// The deletes of a purge batch, from the keys [`oldest`] read: one per
/// consumer and chunk, every purge in one order (sorted), so that
/// concurrent purges lock rows in the same order. Each delete checks the
/// cutoff again: a row claimed again meanwhile stays.
pub(crate) fn purge_plan(mut rows: Vec<(String, String)>) -> Vec<(String, Vec<String>)> {
    rows.sort_unstable();
    let mut plan = Vec::new();
    for group in rows.chunk_by(|a, b| a.0 == b.0) {
        for chunk in group.chunks(CLAIM_CHUNK) {
            let keys = chunk.iter().map(|(_, key)| key.clone()).collect();
            plan.push((chunk[0].0.clone(), keys));
        }
    }
    plan
}

/// One delete of a [`purge_plan`].
#[diesel::dsl::auto_type]
pub(crate) fn delete_older(cutoff: &str, consumer: String, keys: Vec<String>) -> _ {
    let older: SqlLiteral<Timestamp> = sql::<Timestamp>(cutoff);
    delete(
        inbox::table
            .filter(inbox::consumer.eq(consumer))
            .filter(inbox::message_id.eq_any(keys))
            .filter(inbox::received_at.lt(older)),
    )
}

/// Deletes the failure counts last updated before `cutoff`.
#[diesel::dsl::auto_type]
pub(crate) fn delete_attempts_older(cutoff: &str) -> _ {
    let older: SqlLiteral<Timestamp> = sql::<Timestamp>(cutoff);
    delete(counts::table.filter(counts::updated_at.lt(older)))
}

/// [`delete_attempts_older`], of one consumer.
#[diesel::dsl::auto_type]
pub(crate) fn delete_attempts_older_of<'a>(cutoff: &str, consumer: &'a str) -> _ {
    let older: SqlLiteral<Timestamp> = sql::<Timestamp>(cutoff);
    delete(
        counts::table
            .filter(counts::updated_at.lt(older))
            .filter(counts::consumer.eq(consumer)),
    )
}

/// How many rows were claimed before `cutoff`.
#[diesel::dsl::auto_type]
pub(crate) fn count_older(cutoff: &str) -> _ {
    let older: SqlLiteral<Timestamp> = sql::<Timestamp>(cutoff);
    inbox::table.filter(inbox::received_at.lt(older)).count()
}

/// [`count_older`], of one consumer.
#[diesel::dsl::auto_type]
pub(crate) fn count_older_of<'a>(cutoff: &str, consumer: &'a str) -> _ {
    let older: SqlLiteral<Timestamp> = sql::<Timestamp>(cutoff);
    inbox::table
        .filter(inbox::received_at.lt(older))
        .filter(inbox::consumer.eq(consumer))
        .count()
}

/// The row of `(consumer, key)`, `received_at` in microseconds (`micros`:
/// the backend's expression).
#[diesel::dsl::auto_type]
pub(crate) fn entry<'a>(consumer: &'a str, key: &'a str, micros: &str) -> _ {
    let received: SqlLiteral<BigInt> = sql::<BigInt>(micros);
    inbox::table
        .filter(inbox::consumer.eq(consumer))
        .filter(inbox::message_id.eq(key))
        .select((inbox::consumer, inbox::message_id, received))
}

/// Deletes the row of `(consumer, key)`.
#[diesel::dsl::auto_type]
pub(crate) fn forget<'a>(consumer: &'a str, key: &'a str) -> _ {
    delete(
        inbox::table
            .filter(inbox::consumer.eq(consumer))
            .filter(inbox::message_id.eq(key)),
    )
}

/// Rows, oldest and newest per consumer (`oldest` and `newest`: the
/// backend's `MIN(..)` and `MAX(..)` of its microseconds expression).
#[diesel::dsl::auto_type]
pub(crate) fn stats(oldest: &str, newest: &str) -> _ {
    let first: SqlLiteral<BigInt> = sql::<BigInt>(oldest);
    let last: SqlLiteral<BigInt> = sql::<BigInt>(newest);
    inbox::table
        .group_by(inbox::consumer)
        .select((inbox::consumer, count_star(), first, last))
        .order(inbox::consumer)
}

/// `MIN(..)` and `MAX(..)` of `B::RECEIVED_AT_MICROS`, for [`stats`].
pub(crate) fn stats_bounds<B: Internals>() -> (String, String) {
    let micros = B::RECEIVED_AT_MICROS;
    (format!("MIN({micros})"), format!("MAX({micros})"))
}

/// A query that loads `U` rows on every connection of backend `B`: diesel's
/// `LoadQuery` bounds, which name a connection type, stated once for the
/// backend. With it (and [`ExecuteOn`]) the statements' one blanket
/// implementation, [`Statements`], is proved once per backend, whatever
/// connection later runs it.
pub(crate) trait LoadOn<B, U>: Sized {
    /// Runs the query on `conn`: its rows.
    fn load_on<C>(self, conn: &mut C) -> QueryResult<Vec<U>>
    where
        C: diesel::connection::LoadConnection<Backend = B>,
        Self: RunQueryDsl<C>;
}

impl<T, B, U> LoadOn<B, U> for T
where
    T: diesel::query_builder::AsQuery,
    T::Query: QueryFragment<B> + QueryId,
    T::SqlType: diesel::query_dsl::CompatibleType<U, B>,
    B: diesel::backend::Backend + diesel::expression::QueryMetadata<T::SqlType> + 'static,
    U: diesel::deserialize::FromSqlRow<
            <T::SqlType as diesel::query_dsl::CompatibleType<U, B>>::SqlType,
            B,
        > + 'static,
    <T::SqlType as diesel::query_dsl::CompatibleType<U, B>>::SqlType: 'static,
{
    fn load_on<C>(self, conn: &mut C) -> QueryResult<Vec<U>>
    where
        C: diesel::connection::LoadConnection<Backend = B>,
        Self: RunQueryDsl<C>,
    {
        RunQueryDsl::load(self, conn)
    }
}

/// A statement that executes on every connection of backend `B` (as
/// [`LoadOn`] for loads).
pub(crate) trait ExecuteOn<B>: Sized {
    /// Runs the statement on `conn`: the rows it affected.
    fn execute_on<C: diesel::Connection<Backend = B>>(self, conn: &mut C) -> QueryResult<usize>;
}

impl<T, B> ExecuteOn<B> for T
where
    B: diesel::backend::Backend,
    T: QueryFragment<B> + QueryId,
{
    fn execute_on<C: diesel::Connection<Backend = B>>(self, conn: &mut C) -> QueryResult<usize> {
        diesel::query_dsl::methods::ExecuteDsl::execute(self, conn)
    }
}

/// A boxed, `Send` future of a statement's run on an async connection.
#[cfg(feature = "async")]
pub(crate) type Io<'q, T> =
    std::pin::Pin<Box<dyn std::future::Future<Output = QueryResult<T>> + Send + 'q>>;

/// [`LoadOn`] on a diesel-async connection: diesel-async's `LoadQuery`
/// bounds stated once for the backend. Its future is boxed: rustc cannot
/// prove a load's future `Send` through lifetime-bound where-clauses (it
/// erases the lifetimes when it checks auto traits), so it is proved here,
/// once, where the bounds hold.
#[cfg(feature = "async")]
pub(crate) trait LoadOnAsync<B, U>: Sized {
    /// Runs the query on `conn`: its rows.
    fn load_on_async<'c, C>(self, conn: &'c mut C) -> Io<'c, Vec<U>>
    where
        C: diesel_async::AsyncConnection<Backend = B> + Send,
        Self: 'c;
}

#[cfg(feature = "async")]
impl<T, B, U, ST> LoadOnAsync<B, U> for T
where
    T: diesel::query_builder::AsQuery + Send,
    T::Query: QueryFragment<B> + QueryId + Send,
    T::SqlType: diesel::query_dsl::CompatibleType<U, B, SqlType = ST>,
    B: diesel::backend::Backend + diesel::expression::QueryMetadata<T::SqlType> + 'static,
    U: diesel::deserialize::FromSqlRow<ST, B> + Send + 'static,
    ST: 'static,
{
    fn load_on_async<'c, C>(self, conn: &'c mut C) -> Io<'c, Vec<U>>
    where
        C: diesel_async::AsyncConnection<Backend = B> + Send,
        Self: 'c,
    {
        Box::pin(diesel_async::RunQueryDsl::load(self, conn))
    }
}
