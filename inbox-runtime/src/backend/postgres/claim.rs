//! The claim's statements on PostgreSQL: the single and the batch claim,
//! without and with fingerprints, each a cached statement guarded against a
//! connection proxy that runs another client's statement under its name,
//! and the duplicate's confirmation ([`Present`]).

use crate::backend::statements::{Fingerprinted, Plain};
use crate::rows::StoredRow;
use diesel::connection::LoadConnection;
use diesel::pg::Pg;
use diesel::prelude::*;
use diesel::result::Error;

/// PostgreSQL's claims do not trust an affected-row count. A proxy in
/// transaction mode (PgBouncer before 1.21) moves a client between server
/// sessions while diesel names its cached statements per client
/// (`__diesel_stmt_N`; tokio-postgres `sN` per process): under the claim's
/// name a session may hold another client's statement, and another client's
/// name may be this session's claim. So each claim
/// - returns a row that only the claim's own text produces (its marker,
///   [`CLAIM`] and the others) when it inserts: another statement run
///   under the claim's name returns no such row, and [`verdict`] makes
///   rows that are not the marker an error; an empty answer is a
///   `Duplicate` only once [`Present`], a statement of its own, has
///   returned its marker for the key's row, never on its own;
/// - inserts only when its last parameter is [`GUARD`]: another client's
///   statement run under the claim's name binds its own values there, and
///   the cast fails with the claim's name in its text, so that it writes no
///   inbox row.
///
/// The claim stays a cached statement (one round trip, planned once); the
/// other statements of a call run unnamed (`CACHE_SIDE_STATEMENTS`).
pub(super) const GUARD: &str = "diesel-inbox";

/// What a guarded statement is called in the error of another client's
/// statement run under its name (an SQL literal: no quotes in it).
pub(super) const CLAIM_STATEMENT: &str = "inbox claim";
/// The same for [`Present`].
pub(super) const PRESENT_STATEMENT: &str = "inbox duplicate check";
/// The same for [`Lookup`].
pub(super) const LOOKUP_STATEMENT: &str = "inbox replay read";

/// The markers of the single claim, without and with a fingerprint, and of
/// the batch claim, without and with fingerprints.
pub(super) const CLAIM: &str = "diesel-inbox claim";
/// The fingerprinted claim's marker.
pub(super) const CLAIM_FINGERPRINTED: &str = "diesel-inbox claim, fingerprinted";
/// The batch claim's marker.
pub(super) const BATCH: &str = "diesel-inbox batch claim";
/// The fingerprinted batch claim's marker.
pub(super) const BATCH_FINGERPRINTED: &str = "diesel-inbox batch claim, fingerprinted";
/// The marker of [`Present`], the duplicate's confirmation.
pub(super) const PRESENT: &str = "diesel-inbox claim, present";
/// The marker of [`Lookup`], the replay's read.
pub(super) const LOOKUP: &str = "diesel-inbox replay read";

/// Pushes ` WHERE` and the guard of `statement`: true for [`GUARD`], a
/// refusal otherwise ([`refusal_sql`]). Evaluated per execution (a
/// parameter is not a constant to fold), and once per statement whatever
/// rows it reads: every function in it is immutable or stable, so the
/// planner makes it a one-time filter, checked before any row is read (a
/// volatile one would be a filter per row, and a statement that reads no
/// row would not refuse).
pub(super) fn push_guard(
    out: &mut diesel::query_builder::AstPass<'_, '_, Pg>,
    statement: &'static str,
) -> QueryResult<()> {
    const { assert!(!has_quote(GUARD)) };
    debug_assert!(!has_quote(statement));
    out.push_sql(" WHERE CAST(CASE WHEN ");
    out.push_bind_param::<diesel::sql_types::Text, _>(GUARD)?;
    out.push_sql(" = '");
    out.push_sql(GUARD);
    out.push_sql("' THEN '1' ELSE ");
    out.push_sql(&refusal_sql(&format!(
        "'this prepared statement is the {statement}, run with the parameters of another statement'"
    )));
    out.push_sql(" END AS integer) = 1");
    Ok(())
}

/// The view that raises the guards' refusals when read, which `migrate`
/// creates with its function (`postgres_refuse.sql`): `ERROR:
/// diesel-inbox: …` with the fix as its hint, in the server's log and in
/// the client's error.
pub(crate) const REFUSED: &str = "diesel_inbox_refused";

/// An SQL expression of type text that, cast to `integer`, fails its
/// statement: it reads [`REFUSED`] where it exists (through
/// `table_to_xml`, a stable function that reads a table named at run
/// time, so that the statement prepares where the view does not exist),
/// and is otherwise the text `diesel-inbox: ` and `message` (an SQL text
/// expression whose value holds no quote), which the cast quotes in its
/// error (a database that `migrate` of this release has not seen). Wrap
/// it in a cast of a non-constant expression: a cast of a constant would
/// be folded, and fail, at plan time.
pub(crate) fn refusal_sql(message: &str) -> String {
    format!(
        "COALESCE(table_to_xml(to_regclass('{REFUSED}'), false, false, '')::text, \
         'diesel-inbox: ' || {message})"
    )
}

/// Whether `text` holds a single quote (a marker must not: it is spliced
/// into SQL as a literal).
pub(super) const fn has_quote(text: &str) -> bool {
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\'' {
            return true;
        }
        i += 1;
    }
    false
}

/// The error of a claim whose statement did not return the claim's row.
pub(super) fn misrouted(what: &str) -> Error {
    crate::backend::errors::misrouted("claim", what)
}

/// The verdict of a single claim from its rows: its marker once, the row
/// inserted (`Some(true)`); no row, nothing inserted, to be confirmed by
/// [`Present`] (`None`); anything else is another statement's answer.
pub(super) fn verdict(marker: &str, rows: &[String]) -> QueryResult<Option<bool>> {
    match rows {
        [m] if m == marker => Ok(Some(true)),
        [] => Ok(None),
        _ => Err(misrouted("returned rows that are not the claim's")),
    }
}

/// The verdict of [`Present`] after a claim that inserted nothing: its
/// marker once, a duplicate; no row means the key has no row either, so
/// the claim's empty answer was not the claim's.
pub(super) fn present_verdict(rows: &[String]) -> QueryResult<bool> {
    match rows {
        [m] if m == PRESENT => Ok(false),
        [] => Err(misrouted(
            "returned no row, and the key has no row either (unless a forget or a purge \
             deleted it in between; the broker's redelivery then applies it)",
        )),
        _ => Err(misrouted("returned rows that are not the claim's")),
    }
}

/// The keys a batch claim inserted, from its rows: at least one, each with
/// the claim's marker, and every key one the batch asked for.
pub(super) fn batch_verdict(
    marker: &str,
    keys: &[&str],
    rows: Vec<(String, Option<String>)>,
) -> QueryResult<Vec<String>> {
    if rows.is_empty() {
        return Err(misrouted("returned no row"));
    }
    if rows.iter().any(|(m, _)| m != marker) {
        return Err(misrouted("returned rows that are not the claim's"));
    }
    let claimed: Vec<String> = rows.into_iter().filter_map(|(_, key)| key).collect();
    if claimed.len() > keys.len() {
        return Err(misrouted("returned more keys than it was given"));
    }
    let asked: std::collections::HashSet<&str> = keys.iter().copied().collect();
    if claimed.iter().any(|key| !asked.contains(key.as_str())) {
        return Err(misrouted("returned a key it was not given"));
    }
    Ok(claimed)
}

/// The single claim: `INSERT ... SELECT $consumer, $key WHERE guard ON
/// CONFLICT DO NOTHING RETURNING marker`, as cheap as the plain insert. The
/// applied path is one round trip and its verdict is the statement's own
/// marker. An empty answer (the duplicate, or another statement run under
/// the claim's name) is confirmed by [`Present`], a second, guarded
/// statement that returns its own marker only if the key has a row in the
/// claim's transaction; a key without a row after an empty answer is an
/// error, never `Duplicate`. (Before: a CTE returning the marker and the
/// insert's count in one row; `docs/performance.md` has both.) With a
/// fingerprint, a statement of its own (its own query id, [`Fingerprinted`]).
#[derive(Debug, Clone, Copy)]
pub(super) struct Claim<'a, Id> {
    consumer: &'a str,
    key: &'a str,
    fingerprint: Option<&'a [u8]>,
    id: std::marker::PhantomData<Id>,
}

/// Sets a claim's wait bound (`{ms}`), setting the caller's own
/// `lock_timeout` aside in a placeholder setting of ours; both
/// transaction-local (`set_config(.., true)`).
pub(super) const WAIT_BOUND: &str =
    "SELECT set_config('diesel_inbox.lock_timeout', current_setting('lock_timeout'), true), \
     set_config('lock_timeout', '{ms}ms', true)";

/// Restores the `lock_timeout` that [`WAIT_BOUND`] set aside.
pub(super) const WAIT_RESTORE_STATEMENT: &str =
    "SELECT set_config('lock_timeout', current_setting('diesel_inbox.lock_timeout'), true)";

impl<'a> Claim<'a, Plain> {
    /// The claim of `key` without a fingerprint.
    pub(super) fn plain(consumer_name: &'a str, key: &'a str) -> Self {
        Claim {
            consumer: consumer_name,
            key,
            fingerprint: None,
            id: std::marker::PhantomData,
        }
    }
}

impl<'a> Claim<'a, Fingerprinted> {
    /// The claim of `key` with its content's fingerprint.
    pub(super) fn fingerprinted(
        consumer_name: &'a str,
        key: &'a str,
        fingerprint: &'a [u8],
    ) -> Self {
        Claim {
            consumer: consumer_name,
            key,
            fingerprint: Some(fingerprint),
            id: std::marker::PhantomData,
        }
    }
}

impl<Id> Claim<'_, Id> {
    /// The marker the claim's row answers with.
    pub(super) fn marker(&self) -> &'static str {
        match self.fingerprint {
            None => CLAIM,
            Some(_) => CLAIM_FINGERPRINTED,
        }
    }
}

impl<Id: 'static> Claim<'_, Id> {
    /// Runs the claim: whether it inserted the row.
    pub(super) fn run<C: LoadConnection<Backend = Pg>>(self, conn: &mut C) -> QueryResult<bool> {
        let (consumer, key) = (self.consumer, self.key);
        match verdict(self.marker(), &self.load(conn)?)? {
            Some(inserted) => Ok(inserted),
            None => present_verdict(&Present { consumer, key }.load(conn)?),
        }
    }
}

/// The duplicate's confirmation: the key's row, in the claim's
/// transaction, answered with [`PRESENT`]. Cached, and guarded as the claim
/// is: another client's statement under its name binds its own values to
/// the guard and fails, rather than being handed this statement's row.
#[derive(Debug, Clone, Copy)]
pub(super) struct Present<'a> {
    consumer: &'a str,
    key: &'a str,
}

impl diesel::query_builder::QueryFragment<Pg> for Present<'_> {
    fn walk_ast<'b>(
        &'b self,
        mut out: diesel::query_builder::AstPass<'_, 'b, Pg>,
    ) -> QueryResult<()> {
        use diesel::sql_types::Text;
        out.push_sql("SELECT '");
        out.push_sql(PRESENT);
        out.push_sql("'::text FROM inbox_messages");
        push_guard(&mut out, PRESENT_STATEMENT)?;
        out.push_sql(" AND consumer = ");
        out.push_bind_param::<Text, _>(self.consumer)?;
        out.push_sql(" AND message_id = ");
        out.push_bind_param::<Text, _>(self.key)?;
        Ok(())
    }
}

impl diesel::query_builder::QueryId for Present<'_> {
    type QueryId = Present<'static>;
    const HAS_STATIC_QUERY_ID: bool = true;
}

impl diesel::query_builder::Query for Present<'_> {
    type SqlType = diesel::sql_types::Text;
}

impl<Conn> diesel::RunQueryDsl<Conn> for Present<'_> {}

/// The replay's read before any transaction (`Inbox::store_result`): the
/// key's row when it holds a stored result, with [`LOOKUP`] and the key
/// in each row. Cached, and guarded as the claim is: another client's
/// statement under its name binds its own values to the guard and fails;
/// this name reaching another statement returns rows without the marker
/// (an error, never a replay) or none (the claim's path, which checks its
/// own answer).
#[derive(Debug, Clone, Copy)]
pub(super) struct Lookup<'a> {
    pub(super) consumer: &'a str,
    pub(super) key: &'a str,
}

/// A row of [`Lookup`]: marker, key, fingerprint, result.
type LookupRow = (String, String, Option<Vec<u8>>, Option<Vec<u8>>);

impl Lookup<'_> {
    /// The key's stored row, from the rows [`Lookup`] returned.
    pub(super) fn verdict(&self, rows: Vec<LookupRow>) -> QueryResult<Option<StoredRow>> {
        if rows.iter().any(|(marker, ..)| marker != LOOKUP) {
            return Err(crate::backend::errors::misrouted(
                LOOKUP_STATEMENT,
                "returned rows that are not the replay read's",
            ));
        }
        let rows = rows.into_iter().map(|(_, key, f, r)| (key, f, r)).collect();
        crate::backend::statements::looked_up(self.key, rows)
    }

    /// Runs the read: the key's stored row, if it has one.
    pub(super) fn run<C: LoadConnection<Backend = Pg>>(
        self,
        conn: &mut C,
    ) -> QueryResult<Option<StoredRow>> {
        self.verdict(self.load(conn)?)
    }
}

impl diesel::query_builder::QueryFragment<Pg> for Lookup<'_> {
    fn walk_ast<'b>(
        &'b self,
        mut out: diesel::query_builder::AstPass<'_, 'b, Pg>,
    ) -> QueryResult<()> {
        use diesel::sql_types::Text;
        out.push_sql("SELECT '");
        out.push_sql(LOOKUP);
        out.push_sql("'::text, message_id::text, fingerprint, result FROM inbox_messages");
        push_guard(&mut out, LOOKUP_STATEMENT)?;
        out.push_sql(" AND consumer = ");
        out.push_bind_param::<Text, _>(self.consumer)?;
        out.push_sql(" AND message_id = ");
        out.push_bind_param::<Text, _>(self.key)?;
        out.push_sql(" AND result IS NOT NULL");
        Ok(())
    }
}

impl diesel::query_builder::QueryId for Lookup<'_> {
    type QueryId = Lookup<'static>;
    const HAS_STATIC_QUERY_ID: bool = true;
}

impl diesel::query_builder::Query for Lookup<'_> {
    type SqlType = (
        diesel::sql_types::Text,
        diesel::sql_types::Text,
        diesel::sql_types::Nullable<diesel::sql_types::Binary>,
        diesel::sql_types::Nullable<diesel::sql_types::Binary>,
    );
}

impl<Conn> diesel::RunQueryDsl<Conn> for Lookup<'_> {}

/// The stored result's write on the async path at top level, followed
/// by the commit that requires it ([`STORED_COMMIT`]): it writes the
/// body's value into the claimed row and returns [`STORED`] only when it
/// updated exactly that row (any other count fails the statement, so the
/// transaction cannot commit), and sets a transaction-local setting that
/// the commit's batch requires: if another statement ran under this one's
/// name, the commit refuses rather than committing the body without its
/// stored result. Cached, and guarded as the claim is.
#[cfg(feature = "async")]
#[derive(Debug, Clone, Copy)]
pub(super) struct Store<'a> {
    pub(super) consumer: &'a str,
    pub(super) key: &'a str,
    pub(super) value: &'a [u8],
}

/// The marker of [`Store`].
#[cfg(feature = "async")]
pub(super) const STORED: &str = "diesel-inbox stored result";
/// What [`Store`] is called in the error of another client's statement
/// run under its name.
#[cfg(feature = "async")]
pub(super) const STORE_STATEMENT: &str = "inbox result store";

/// The commit sent after [`Store`] answered: it refuses (and so rolls back) unless
/// `Store` ran in this transaction, and fails in a transaction that a
/// statement's error aborted (25P02, as `GUARDED_COMMIT`'s savepoint
/// does), rather than letting `COMMIT` roll back silently.
#[cfg_attr(not(feature = "async"), allow(dead_code))]
pub(super) static STORED_COMMIT: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "SELECT CAST(CASE WHEN current_setting('diesel_inbox.stored', true) = '1' THEN '1' \
         ELSE {} END AS integer); COMMIT",
        refusal_sql("'the commit refused: the result was not stored in this transaction'")
    )
});

#[cfg(feature = "async")]
impl diesel::query_builder::QueryFragment<Pg> for Store<'_> {
    fn walk_ast<'b>(
        &'b self,
        mut out: diesel::query_builder::AstPass<'_, 'b, Pg>,
    ) -> QueryResult<()> {
        use diesel::sql_types::{Binary, Text};
        out.push_sql("WITH stored AS (UPDATE inbox_messages SET result = ");
        out.push_bind_param::<Binary, _>(self.value)?;
        push_guard(&mut out, STORE_STATEMENT)?;
        out.push_sql(" AND consumer = ");
        out.push_bind_param::<Text, _>(self.consumer)?;
        out.push_sql(" AND message_id = ");
        out.push_bind_param::<Text, _>(self.key)?;
        out.push_sql(" RETURNING 1) SELECT CASE WHEN count(*) = 1 THEN '");
        out.push_sql(STORED);
        out.push_sql("' || left(set_config('diesel_inbox.stored', '1', true), 0) ELSE CAST(");
        out.push_sql(&refusal_sql(
            "'storing the result updated ' || count(*) || ' inbox rows, not the 1 just claimed'",
        ));
        out.push_sql(" AS integer)::text END FROM stored");
        Ok(())
    }
}

#[cfg(feature = "async")]
impl diesel::query_builder::QueryId for Store<'_> {
    type QueryId = Store<'static>;
    const HAS_STATIC_QUERY_ID: bool = true;
}

#[cfg(feature = "async")]
impl diesel::query_builder::Query for Store<'_> {
    type SqlType = diesel::sql_types::Text;
}

#[cfg(feature = "async")]
impl<Conn> diesel::RunQueryDsl<Conn> for Store<'_> {}

impl<Id> diesel::query_builder::QueryFragment<Pg> for Claim<'_, Id> {
    fn walk_ast<'b>(
        &'b self,
        mut out: diesel::query_builder::AstPass<'_, 'b, Pg>,
    ) -> QueryResult<()> {
        use diesel::sql_types::{Binary, Text};
        match self.fingerprint {
            None => out.push_sql("INSERT INTO inbox_messages (consumer, message_id) SELECT "),
            Some(_) => out
                .push_sql("INSERT INTO inbox_messages (consumer, message_id, fingerprint) SELECT "),
        }
        out.push_bind_param::<Text, _>(self.consumer)?;
        out.push_sql(", ");
        out.push_bind_param::<Text, _>(self.key)?;
        if let Some(fingerprint) = self.fingerprint {
            out.push_sql(", ");
            out.push_bind_param::<Binary, _>(fingerprint)?;
        }
        push_guard(&mut out, CLAIM_STATEMENT)?;
        out.push_sql(" ON CONFLICT (consumer, message_id) DO NOTHING RETURNING '");
        out.push_sql(self.marker());
        out.push_sql("'::text");
        Ok(())
    }
}

impl<Id: 'static> diesel::query_builder::QueryId for Claim<'_, Id> {
    type QueryId = Claim<'static, Id>;
    const HAS_STATIC_QUERY_ID: bool = true;
}

impl<Id> diesel::query_builder::Query for Claim<'_, Id> {
    type SqlType = diesel::sql_types::Text;
}

impl<Conn, Id> diesel::RunQueryDsl<Conn> for Claim<'_, Id> {}

/// The batch claim: the keys go as one array parameter, so the statement's
/// text is the same for every batch size and diesel prepares it once per
/// connection and caches it (a multi-row `VALUES` list is a new statement,
/// parsed and planned again, for each batch). `WITH ORDINALITY ... ORDER BY`
/// keeps the batch's lock order; RETURNING names the rows inserted, joined
/// to one marker row so that a batch of duplicates still returns the
/// claim's row. One bind parameter for all the keys: no chunks, whatever
/// the batch's size. The sync and the async path send this one statement.
/// With fingerprints, a second array parameter goes with the keys (`unnest`
/// of two arrays pairs them up): a statement of its own, with its own query
/// id ([`Fingerprinted`]).
#[derive(Debug, Clone, Copy)]
pub(super) struct ClaimBatch<'a, Id> {
    consumer: &'a str,
    keys: &'a [&'a str],
    fingerprints: Option<&'a [&'a [u8]]>,
    id: std::marker::PhantomData<Id>,
}

impl<'a> ClaimBatch<'a, Plain> {
    /// The claim of `keys` without fingerprints.
    pub(super) fn plain(consumer_name: &'a str, keys: &'a [&'a str]) -> Self {
        ClaimBatch {
            consumer: consumer_name,
            keys,
            fingerprints: None,
            id: std::marker::PhantomData,
        }
    }
}

impl<'a> ClaimBatch<'a, Fingerprinted> {
    /// The claim of `keys` with their contents' fingerprints.
    pub(super) fn fingerprinted(
        consumer_name: &'a str,
        keys: &'a [&'a str],
        fingerprints: &'a [&'a [u8]],
    ) -> Self {
        ClaimBatch {
            consumer: consumer_name,
            keys,
            fingerprints: Some(fingerprints),
            id: std::marker::PhantomData,
        }
    }
}

impl<Id> ClaimBatch<'_, Id> {
    /// The marker the batch claim's rows answer with.
    pub(super) fn marker(&self) -> &'static str {
        match self.fingerprints {
            None => BATCH,
            Some(_) => BATCH_FINGERPRINTED,
        }
    }
}

impl<Id: 'static> ClaimBatch<'_, Id> {
    /// Runs the batch claim: the keys it inserted.
    pub(super) fn run<C: LoadConnection<Backend = Pg>>(
        self,
        conn: &mut C,
    ) -> QueryResult<Vec<String>> {
        batch_verdict(self.marker(), self.keys, self.load(conn)?)
    }
}

impl<Id> diesel::query_builder::QueryFragment<Pg> for ClaimBatch<'_, Id> {
    fn walk_ast<'b>(
        &'b self,
        mut out: diesel::query_builder::AstPass<'_, 'b, Pg>,
    ) -> QueryResult<()> {
        use diesel::sql_types::{Array, Binary, Text};
        match self.fingerprints {
            None => {
                out.push_sql(
                    "WITH claim AS (INSERT INTO inbox_messages (consumer, message_id) SELECT ",
                );
                out.push_bind_param::<Text, _>(self.consumer)?;
                out.push_sql(", k.key FROM unnest(");
                out.push_bind_param::<Array<Text>, _>(self.keys)?;
                out.push_sql(") WITH ORDINALITY AS k(key, n)");
            }
            Some(fingerprints) => {
                out.push_sql(
                    "WITH claim AS (INSERT INTO inbox_messages (consumer, message_id, \
                     fingerprint) SELECT ",
                );
                out.push_bind_param::<Text, _>(self.consumer)?;
                out.push_sql(", k.key, k.fingerprint FROM unnest(");
                out.push_bind_param::<Array<Text>, _>(self.keys)?;
                out.push_sql(", ");
                out.push_bind_param::<Array<Binary>, _>(fingerprints)?;
                out.push_sql(") WITH ORDINALITY AS k(key, fingerprint, n)");
            }
        }
        push_guard(&mut out, CLAIM_STATEMENT)?;
        out.push_sql(
            " ORDER BY k.n ON CONFLICT (consumer, message_id) DO NOTHING RETURNING message_id) \
             SELECT '",
        );
        out.push_sql(self.marker());
        out.push_sql(
            "'::text, claim.message_id::text FROM (VALUES (1)) AS one LEFT JOIN claim ON true",
        );
        Ok(())
    }
}

impl<Id: 'static> diesel::query_builder::QueryId for ClaimBatch<'_, Id> {
    type QueryId = ClaimBatch<'static, Id>;
    const HAS_STATIC_QUERY_ID: bool = true;
}

impl<Id> diesel::query_builder::Query for ClaimBatch<'_, Id> {
    type SqlType = (
        diesel::sql_types::Text,
        diesel::sql_types::Nullable<diesel::sql_types::Text>,
    );
}

impl<Conn, Id> diesel::RunQueryDsl<Conn> for ClaimBatch<'_, Id> {}

#[cfg(feature = "async")]
mod asynchronous {
    use super::*;
    use diesel_async::AsyncPgConnection;

    impl<Id: Send + Sync + 'static> Claim<'_, Id> {
        /// [`Claim::run`] on a diesel-async connection.
        pub(crate) async fn run_async(self, conn: &mut AsyncPgConnection) -> QueryResult<bool> {
            let (marker, consumer, key) = (self.marker(), self.consumer, self.key);
            let rows: Vec<String> = diesel_async::RunQueryDsl::load(self, conn).await?;
            match verdict(marker, &rows)? {
                Some(inserted) => Ok(inserted),
                None => {
                    let present = Present { consumer, key };
                    present_verdict(&diesel_async::RunQueryDsl::load(present, conn).await?)
                }
            }
        }
    }

    impl Store<'_> {
        /// Runs [`Store`].
        pub(crate) async fn run_async(self, conn: &mut AsyncPgConnection) -> QueryResult<()> {
            let rows: Vec<String> = diesel_async::RunQueryDsl::load(self, conn).await?;
            match rows.as_slice() {
                [marker] if marker == STORED => Ok(()),
                _ => Err(crate::backend::errors::misrouted(
                    STORE_STATEMENT,
                    "returned rows that are not the store's",
                )),
            }
        }
    }

    impl Lookup<'_> {
        /// [`Lookup::run`] on a diesel-async connection.
        pub(crate) async fn run_async(
            self,
            conn: &mut AsyncPgConnection,
        ) -> QueryResult<Option<StoredRow>> {
            self.verdict(diesel_async::RunQueryDsl::load(self, conn).await?)
        }
    }

    impl<Id: Send + Sync + 'static> ClaimBatch<'_, Id> {
        /// [`ClaimBatch::run`] on a diesel-async connection.
        pub(crate) async fn run_async(
            self,
            conn: &mut AsyncPgConnection,
        ) -> QueryResult<Vec<String>> {
            let (marker, keys) = (self.marker(), self.keys);
            batch_verdict(
                marker,
                keys,
                diesel_async::RunQueryDsl::load(self, conn).await?,
            )
        }
    }
}

/// The plain claim's SQL (its parameters: consumer, key, guard) and the
/// commit sent after a stored result, as the server receives them: the
/// refusal tests run them as another client's statement would
/// (`__testing::postgres_guarded_sql`).
pub(crate) fn guarded_sql_for_tests() -> (String, String) {
    use diesel::query_builder::{QueryBuilder, QueryFragment};
    let mut sql = <Pg as diesel::backend::Backend>::QueryBuilder::default();
    Claim::plain("c", "k")
        .to_sql(&mut sql, &Pg)
        .expect("the claim's SQL");
    (sql.finish(), STORED_COMMIT.clone())
}
