use super::shape::{parse_version_marker, read, version_marker, CatalogRow, Dialect};
use super::statements::{Fingerprinted, Plain};
use super::transaction::{begin, end_migrations, rollback, Scope};
use super::{database_error, Catalog, InboxBackend, Internals};
use crate::error::{InboxError, TableProblem};
use diesel::connection::{AnsiTransactionManager, Connection, LoadConnection};
use diesel::pg::Pg;
use diesel::prelude::*;
use diesel::result::{DatabaseErrorKind, Error};

/// Key of the transaction-scoped advisory lock that serializes `migrate`
/// (concurrent `CREATE TABLE IF NOT EXISTS` can fail on pg_type otherwise).
const MIGRATE_LOCK: i64 = 0x6469_6573_656c_5f69; // "diesel_i"

/// What PostgreSQL's catalog says about `inbox_messages` (the table the
/// search path resolves), in the rows [`Dialect`] describes:
/// - `table`: a = relkind, b = relpersistence, c = the table comment;
/// - `column`: a = type name, b = declared length, c = `deterministic` or
///   the name of a non-deterministic collation;
/// - indexes: b = `partial` or `expression`;
/// - `attempts`: a column of `inbox_attempts`.
const CATALOG: &str = r#"
WITH t AS (SELECT to_regclass('inbox_messages') AS oid)
SELECT 'table' AS kind, c.relname::text AS name, c.relkind::text AS a,
       c.relpersistence::text AS b, obj_description(c.oid, 'pg_class') AS c, NULL::text AS d
FROM pg_class c JOIN t ON c.oid = t.oid
UNION ALL
SELECT 'column', att.attname::text, ty.typname::text,
       CASE WHEN ty.typname IN ('varchar', 'bpchar') AND att.atttypmod > 4
            THEN (att.atttypmod - 4)::text END,
       CASE WHEN co.oid IS NULL OR co.collisdeterministic THEN 'deterministic'
            ELSE co.collname::text END,
       concat_ws(',', CASE WHEN att.attnotnull THEN 'notnull' END,
                      CASE WHEN att.atthasdef OR att.attgenerated <> '' OR att.attidentity <> ''
                           THEN 'default' END)
FROM pg_attribute att JOIN t ON att.attrelid = t.oid
JOIN pg_type ty ON ty.oid = att.atttypid
LEFT JOIN pg_collation co ON co.oid = att.attcollation
WHERE att.attnum > 0 AND NOT att.attisdropped
UNION ALL
SELECT CASE WHEN i.indisprimary THEN 'primary'
            WHEN i.indisunique OR i.indisexclusion THEN 'unique' ELSE 'index' END,
       ic.relname::text,
       (SELECT string_agg(k_att.attname::text, ',' ORDER BY k.ord)
          FROM unnest(i.indkey::int2[]) WITH ORDINALITY AS k(attnum, ord)
          JOIN pg_attribute k_att ON k_att.attrelid = i.indrelid AND k_att.attnum = k.attnum),
       CASE WHEN i.indpred IS NOT NULL THEN 'partial'
            WHEN i.indexprs IS NOT NULL THEN 'expression' END,
       NULL, NULL
FROM pg_index i JOIN t ON i.indrelid = t.oid JOIN pg_class ic ON ic.oid = i.indexrelid
UNION ALL
SELECT CASE con.contype WHEN 'f' THEN 'foreign key' ELSE 'check constraint' END,
       con.conname::text, NULL, NULL, NULL, NULL
FROM pg_constraint con JOIN t ON con.conrelid = t.oid WHERE con.contype IN ('f', 'c')
UNION ALL
SELECT 'trigger', tg.tgname::text, NULL, NULL, NULL, NULL
FROM pg_trigger tg JOIN t ON tg.tgrelid = t.oid
WHERE NOT tg.tgisinternal AND (tg.tgtype & 4) <> 0
UNION ALL
SELECT 'rule', r.rulename::text, NULL, NULL, NULL, NULL
FROM pg_rewrite r JOIN t ON r.ev_class = t.oid WHERE r.ev_type = '3'
UNION ALL
SELECT 'attempts', att.attname::text, NULL, NULL, NULL, NULL
FROM pg_attribute att
WHERE att.attrelid = to_regclass('inbox_attempts') AND att.attnum > 0 AND NOT att.attisdropped
UNION ALL
SELECT 'outbox', att.attname::text, NULL, NULL, NULL, NULL
FROM pg_attribute att
WHERE att.attrelid = to_regclass('outbox_messages') AND att.attnum > 0 AND NOT att.attisdropped
UNION ALL
SELECT 'positions', att.attname::text, NULL, NULL, NULL, NULL
FROM pg_attribute att
WHERE att.attrelid = to_regclass('inbox_positions') AND att.attnum > 0 AND NOT att.attisdropped
"#;

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
const GUARD: &str = "diesel-inbox";

/// The channel an outbox enqueue notifies at commit and relays `LISTEN`
/// on (`outbox::set_notify`). Notifications are per database: relays of
/// other schemas in the same database wake too, find nothing, and wait.
pub(crate) const OUTBOX_CHANNEL: &str = "diesel_inbox_outbox";

/// What a guarded statement is called in the error of another client's
/// statement run under its name (an SQL literal: no quotes in it).
const CLAIM_STATEMENT: &str = "inbox claim";
/// The same for [`Present`].
const PRESENT_STATEMENT: &str = "inbox duplicate check";

/// The markers of the single claim, without and with a fingerprint, and of
/// the batch claim, without and with fingerprints.
const CLAIM: &str = "diesel-inbox claim";
const CLAIM_FINGERPRINTED: &str = "diesel-inbox claim, fingerprinted";
const BATCH: &str = "diesel-inbox batch claim";
const BATCH_FINGERPRINTED: &str = "diesel-inbox batch claim, fingerprinted";
/// The marker of [`Present`], the duplicate's confirmation.
const PRESENT: &str = "diesel-inbox claim, present";

/// Pushes ` WHERE` and the guard of `statement`: true for [`GUARD`], an
/// error naming `statement` otherwise (evaluated per execution: a
/// parameter is not a constant to fold).
fn push_guard(
    out: &mut diesel::query_builder::AstPass<'_, '_, Pg>,
    statement: &'static str,
) -> QueryResult<()> {
    const { assert!(!has_quote(GUARD)) };
    debug_assert!(!has_quote(statement));
    out.push_sql(" WHERE CAST(CASE WHEN ");
    out.push_bind_param::<diesel::sql_types::Text, _>(GUARD)?;
    out.push_sql(" = '");
    out.push_sql(GUARD);
    out.push_sql("' THEN '1' ELSE 'diesel-inbox: this prepared statement is the ");
    out.push_sql(statement);
    out.push_sql(
        ", run with the parameters of another statement (a connection proxy shares prepared \
         statements between clients)' END AS integer) = 1",
    );
    Ok(())
}

const fn has_quote(text: &str) -> bool {
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
fn misrouted(what: &str) -> Error {
    super::errors::misrouted("claim", what)
}

/// The verdict of a single claim from its rows: its marker once, the row
/// inserted (`Some(true)`); no row, nothing inserted, to be confirmed by
/// [`Present`] (`None`); anything else is another statement's answer.
fn verdict(marker: &str, rows: &[String]) -> QueryResult<Option<bool>> {
    match rows {
        [m] if m == marker => Ok(Some(true)),
        [] => Ok(None),
        _ => Err(misrouted("returned rows that are not the claim's")),
    }
}

/// The verdict of [`Present`] after a claim that inserted nothing: its
/// marker once, a duplicate; no row means the key has no row either, so
/// the claim's empty answer was not the claim's.
fn present_verdict(rows: &[String]) -> QueryResult<bool> {
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
fn batch_verdict(
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
struct Claim<'a, Id> {
    consumer: &'a str,
    key: &'a str,
    fingerprint: Option<&'a [u8]>,
    /// Whether its `RETURNING` restores the caller's `lock_timeout`
    /// ([`Restoring`]).
    restores: bool,
    id: std::marker::PhantomData<Id>,
}

/// The claim of a call whose wait is bounded (`Inbox::wait`): its
/// `RETURNING` also restores the `lock_timeout` that [`WAIT_BOUND`] set
/// aside, in the row it returns for an inserted key, so that the body runs
/// under the connection's own; a duplicate runs no body, and its rollback
/// restores it. A statement of its own (its own query id).
#[cfg(feature = "async")]
#[derive(Debug, Clone, Copy)]
struct Restoring<Id>(std::marker::PhantomData<Id>);

/// Sets a claim's wait bound (`{ms}`), setting the caller's own
/// `lock_timeout` aside in a placeholder setting of ours; both
/// transaction-local (`set_config(.., true)`).
const WAIT_BOUND: &str =
    "SELECT set_config('diesel_inbox.lock_timeout', current_setting('lock_timeout'), true), \
     set_config('lock_timeout', '{ms}ms', true)";

/// Restores the `lock_timeout` that [`WAIT_BOUND`] set aside: an
/// expression ([`WAIT_RESTORE`]) and a statement.
macro_rules! wait_restore {
    () => {
        "set_config('lock_timeout', current_setting('diesel_inbox.lock_timeout'), true)"
    };
}
const WAIT_RESTORE: &str = wait_restore!();

impl<'a> Claim<'a, Plain> {
    fn plain(consumer_name: &'a str, key: &'a str) -> Self {
        Claim {
            consumer: consumer_name,
            key,
            fingerprint: None,
            restores: false,
            id: std::marker::PhantomData,
        }
    }
}

impl<'a> Claim<'a, Fingerprinted> {
    fn fingerprinted(consumer_name: &'a str, key: &'a str, fingerprint: &'a [u8]) -> Self {
        Claim {
            consumer: consumer_name,
            key,
            fingerprint: Some(fingerprint),
            restores: false,
            id: std::marker::PhantomData,
        }
    }
}

#[cfg(feature = "async")]
impl<'a, Id> Claim<'a, Id> {
    /// The same claim, restoring the caller's `lock_timeout` ([`Restoring`]).
    fn restoring(self) -> Claim<'a, Restoring<Id>> {
        Claim {
            consumer: self.consumer,
            key: self.key,
            fingerprint: self.fingerprint,
            restores: true,
            id: std::marker::PhantomData,
        }
    }
}

impl<Id> Claim<'_, Id> {
    fn marker(&self) -> &'static str {
        match self.fingerprint {
            None => CLAIM,
            Some(_) => CLAIM_FINGERPRINTED,
        }
    }
}

impl<Id: 'static> Claim<'_, Id> {
    /// Runs the claim: whether it inserted the row.
    fn run<C: LoadConnection<Backend = Pg>>(self, conn: &mut C) -> QueryResult<bool> {
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
struct Present<'a> {
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
        if self.restores {
            out.push_sql(" || left(");
            out.push_sql(WAIT_RESTORE);
            out.push_sql(", 0)");
        }
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
struct ClaimBatch<'a, Id> {
    consumer: &'a str,
    keys: &'a [&'a str],
    fingerprints: Option<&'a [&'a [u8]]>,
    id: std::marker::PhantomData<Id>,
}

impl<'a> ClaimBatch<'a, Plain> {
    fn plain(consumer_name: &'a str, keys: &'a [&'a str]) -> Self {
        ClaimBatch {
            consumer: consumer_name,
            keys,
            fingerprints: None,
            id: std::marker::PhantomData,
        }
    }
}

impl<'a> ClaimBatch<'a, Fingerprinted> {
    fn fingerprinted(
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
    fn marker(&self) -> &'static str {
        match self.fingerprints {
            None => BATCH,
            Some(_) => BATCH_FINGERPRINTED,
        }
    }
}

impl<Id: 'static> ClaimBatch<'_, Id> {
    /// Runs the batch claim: the keys it inserted.
    fn run<C: LoadConnection<Backend = Pg>>(self, conn: &mut C) -> QueryResult<Vec<String>> {
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

/// The commit guard: PostgreSQL turns COMMIT of an aborted transaction (a
/// statement failed and the body swallowed the error) into a silent
/// ROLLBACK, which diesel reports as success. The guard fails in an aborted
/// transaction and stops the batch before COMMIT, in the same round trip. A
/// SAVEPOINT is the cheapest such statement (a `SELECT 1` guard cost 9% of
/// throughput at 4 threads, SAVEPOINT none measurable).
const GUARDED_COMMIT: &str = "SAVEPOINT diesel_inbox_guard; COMMIT";

impl InboxBackend for Pg {
    const DDL: &'static str = super::ddl::POSTGRES;
}

impl Internals for Pg {
    const BEGIN: &'static str = "BEGIN";
    const CACHE_SIDE_STATEMENTS: bool = false;
    const KEY_TYPE: &'static str =
        "VARCHAR(255) NOT NULL (or TEXT) with a deterministic collation (the default)";
    // Nullable columns without a default: a catalog change, no table rewrite.
    // Nullable columns without a default: a catalog change, no table
    // rewrite; and the attempt counts' table.
    const UPGRADES: &'static [&'static str] = &[
        concat!(
            "ALTER TABLE inbox_messages ADD COLUMN fingerprint BYTEA, ADD COLUMN result BYTEA;\n",
            include_str!("postgres_attempts.sql")
        ),
        include_str!("postgres_outbox.sql"),
        include_str!("postgres_positions.sql"),
    ];

    fn claim<C>(
        conn: &mut C,
        consumer_name: &str,
        key: &str,
        fingerprint_bytes: Option<&[u8]>,
    ) -> QueryResult<bool>
    where
        C: LoadConnection<Backend = Self>,
    {
        match fingerprint_bytes {
            None => Claim::plain(consumer_name, key).run(conn),
            Some(bytes) => Claim::fingerprinted(consumer_name, key, bytes).run(conn),
        }
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
        match fingerprints {
            None => ClaimBatch::plain(consumer_name, keys).run(conn),
            Some(fingerprints) => {
                ClaimBatch::fingerprinted(consumer_name, keys, fingerprints).run(conn)
            }
        }
    }

    fn commit_top_level<C>(conn: &mut C) -> QueryResult<()>
    where
        C: Connection<Backend = Self, TransactionManager = AnsiTransactionManager>,
    {
        // diesel resyncs its depth from libpq's status (idle after the
        // COMMIT, also a failed one).
        let committed = conn.batch_execute(GUARDED_COMMIT);
        if committed.is_err() {
            super::transaction::rollback(conn);
        }
        committed
    }

    fn is_transient(error: &Error) -> bool {
        // 40001 arrives as SerializationFailure (diesel reads the SQLSTATE);
        // 40P01 (deadlock) and 55P03 (lock timeout, NOWAIT) only as message
        // text, in the server's `lc_messages` language (English assumed).
        match database_error(error) {
            Some((DatabaseErrorKind::SerializationFailure, _)) => true,
            Some((_, message)) => {
                message.contains("deadlock detected")
                    || message.contains("canceling statement due to lock timeout")
                    || message.contains("could not obtain lock")
            }
            None => false,
        }
    }

    /// `lock_timeout`, transaction-local (`set_config(.., true)`: a
    /// rollback restores it, and a proxy in transaction mode keeps it to
    /// this transaction), the caller's own remembered in a placeholder
    /// setting of ours. 0 would mean no bound: at least 1 ms.
    fn wait_bound(wait: std::time::Duration) -> Option<super::WaitBound> {
        let ms = wait.as_millis().clamp(1, i32::MAX as u128);
        Some(super::WaitBound {
            set: WAIT_BOUND.replace("{ms}", &ms.to_string()),
            restore: concat!("SELECT ", wait_restore!()),
            rollback_restores: true,
        })
    }

    fn is_wait_timeout(error: &Error) -> bool {
        // 55P03, by its message (see `is_transient`).
        database_error(error)
            .is_some_and(|(_, message)| message.contains("canceling statement due to lock timeout"))
    }

    fn is_aborted_commit(error: &Error) -> bool {
        // The guard of `commit_top_level` fails with this (25P02) when a
        // statement of the body failed and the body went on.
        database_error(error)
            .is_some_and(|(_, message)| message.contains("current transaction is aborted"))
    }

    fn is_missing_table(error: &Error) -> bool {
        // 42P01: relation "inbox_messages" does not exist.
        database_error(error)
            .is_some_and(|(_, message)| message.contains("\"inbox_messages\" does not exist"))
    }

    // `received_at` holds UTC wall time without a zone: its epoch is UTC.
    const COUNT_FAILURE: &'static str = "INSERT INTO inbox_attempts (consumer, message_id, failures, last_error) VALUES ($1, $2, 1, $3) \
         ON CONFLICT (consumer, message_id) DO UPDATE SET failures = inbox_attempts.failures + 1, \
         last_error = EXCLUDED.last_error, updated_at = now() AT TIME ZONE 'UTC'";

    const RECEIVED_AT_MICROS: &'static str =
        "CAST(EXTRACT(EPOCH FROM received_at) * 1000000 AS BIGINT)";
    const UPDATED_AT_MICROS: &'static str =
        "CAST(EXTRACT(EPOCH FROM updated_at) * 1000000 AS BIGINT)";

    fn cutoff_sql(older_than: std::time::Duration) -> String {
        format!(
            "((now() AT TIME ZONE 'UTC') - interval '{} microseconds')",
            older_than.as_micros()
        )
    }

    const NOW_MICROS: &'static str = "(extract(epoch from now()) * 1000000)::bigint";
    fn push_enqueue_notify<'b>(
        out: &mut diesel::query_builder::AstPass<'_, 'b, Pg>,
        notify: &'b bool,
    ) -> QueryResult<()> {
        out.push_sql(" FROM (SELECT CASE WHEN ");
        out.push_bind_param::<diesel::sql_types::Bool, bool>(notify)?;
        out.push_sql(" THEN pg_notify('");
        out.push_sql(OUTBOX_CHANNEL);
        out.push_sql("', '') END) AS notified");
        Ok(())
    }

    const GUARDED: bool = true;

    fn push_guard(
        out: &mut diesel::query_builder::AstPass<'_, '_, Self>,
        statement: &'static str,
    ) -> QueryResult<()> {
        push_guard(out, statement)
    }

    const RELAY_SETUP: Option<&'static str> =
        Some("SET LOCAL jit = off; SET LOCAL synchronous_commit = off");
    const SKIP_LOCKED: &'static str = " FOR UPDATE SKIP LOCKED";
    const LOCK_ROW: &'static str = " FOR UPDATE";

    fn catalog<C>(conn: &mut C) -> QueryResult<Catalog>
    where
        C: LoadConnection<Backend = Self>,
    {
        Ok(read::<Self>(diesel::sql_query(CATALOG).load(conn)?))
    }

    fn record_version(version: u32) -> String {
        format!(
            "COMMENT ON TABLE inbox_messages IS '{}';",
            version_marker(version)
        )
    }

    fn lock_migrations<C>(conn: &mut C) -> Result<Scope, InboxError>
    where
        C: LoadConnection<Backend = Self, TransactionManager = AnsiTransactionManager>,
    {
        // DDL is transactional: the lock and every change end together.
        let scope = begin(conn).map_err(|(_, e)| InboxError::Database(e))?;
        if let Err(e) = conn.batch_execute(&format!("SELECT pg_advisory_xact_lock({MIGRATE_LOCK})"))
        {
            rollback(conn);
            return Err(InboxError::MigrationFailed(e));
        }
        Ok(scope)
    }

    fn unlock_migrations<C>(conn: &mut C, scope: Scope, keep: bool) -> Result<(), InboxError>
    where
        C: LoadConnection<Backend = Self, TransactionManager = AnsiTransactionManager>,
    {
        end_migrations(conn, scope, keep)
    }
}

impl Dialect for Pg {
    fn version(record: &str) -> Option<u32> {
        parse_version_marker(record)
    }

    fn table_problems(table: &CatalogRow) -> Vec<TableProblem> {
        let mut problems = Vec::new();
        if !matches!(table.a.as_deref(), Some("r" | "p")) {
            problems.push(TableProblem::new(
                format!(
                    "`inbox_messages` is not a table (relkind {}), so claims cannot be inserted into it safely",
                    table.a.as_deref().unwrap_or("?")
                ),
                "drop it and run migrate() to create the table",
            ));
        }
        if table.b.as_deref() == Some("u") {
            problems.push(TableProblem::new(
                "the table is UNLOGGED: after a crash PostgreSQL empties it, and every redelivered message would be applied again",
                "ALTER TABLE inbox_messages SET LOGGED",
            ));
        }
        problems
    }

    fn key_problem(column: &CatalogRow) -> Option<String> {
        let type_name = column.a.as_deref().unwrap_or("?");
        let length: Option<u32> = column.b.as_deref().and_then(|l| l.parse().ok());
        let problem = match (type_name, length) {
            ("text", _) | ("varchar", None) => None,
            ("varchar", Some(n)) if n >= 255 => None,
            ("varchar", Some(n)) => Some(format!("holds at most {n} characters (VARCHAR({n}))")),
            ("bpchar", _) => Some(
                "is CHARACTER(n), which pads with spaces and ignores trailing spaces".to_string(),
            ),
            ("citext", _) => Some("is citext, which compares case-insensitively".to_string()),
            (other, _) => Some(format!("has type {other}, not VARCHAR or TEXT")),
        };
        problem.or_else(|| match column.c.as_deref() {
            Some("deterministic") | None => None,
            Some(collation) => Some(format!(
                "uses the non-deterministic collation {collation}, which can compare different strings as equal"
            )),
        })
    }

    fn index_problem(index: &CatalogRow) -> Option<String> {
        // A primary key compares with its columns' collations, judged above.
        match index.b.as_deref() {
            Some("partial") => Some("is partial (it has a WHERE clause)".to_string()),
            Some(_) => Some("is on an expression".to_string()),
            None => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error(kind: DatabaseErrorKind, message: &str) -> Error {
        Error::DatabaseError(kind, Box::new(message.to_string()))
    }

    #[test]
    fn transient_errors_are_serialization_failures_deadlocks_and_lock_timeouts() {
        use DatabaseErrorKind::*;
        assert!(Pg::is_transient(&error(
            SerializationFailure,
            "could not serialize access"
        )));
        assert!(Pg::is_transient(&error(Unknown, "deadlock detected")));
        assert!(Pg::is_transient(&error(
            Unknown,
            "canceling statement due to lock timeout"
        )));
        assert!(!Pg::is_transient(&error(
            UniqueViolation,
            "duplicate key value"
        )));
        assert!(!Pg::is_transient(&error(Unknown, "database is locked")));
    }

    #[test]
    fn privilege_errors_are_recognised_by_their_message() {
        use DatabaseErrorKind::Unknown;
        assert!(crate::backend::errors::postgres_privilege(&error(
            Unknown,
            "permission denied for schema public"
        )));
        assert!(crate::backend::errors::postgres_privilege(&error(
            Unknown,
            "must be owner of table inbox_messages"
        )));
        assert!(!crate::backend::errors::postgres_privilege(&error(
            Unknown,
            "column \"x\" does not exist"
        )));
    }
}

#[cfg(feature = "async")]
mod asynchronous {
    use super::*;
    use crate::backend::asynchronous::{
        AsyncInboxConnection, AsyncInternals, AsyncMigration, BeginClaim,
    };
    use crate::backend::transaction::{ansi, Scope};
    use diesel_async::{AsyncPgConnection, SimpleAsyncConnection};

    impl<Id: Send + Sync + 'static> Claim<'_, Id> {
        /// [`Claim::run`] on a diesel-async connection.
        async fn run_async(self, conn: &mut AsyncPgConnection) -> QueryResult<bool> {
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

    impl<Id: Send + Sync + 'static> ClaimBatch<'_, Id> {
        /// [`ClaimBatch::run`] on a diesel-async connection.
        async fn run_async(self, conn: &mut AsyncPgConnection) -> QueryResult<Vec<String>> {
            let (marker, keys) = (self.marker(), self.keys);
            batch_verdict(
                marker,
                keys,
                diesel_async::RunQueryDsl::load(self, conn).await?,
            )
        }
    }

    impl crate::backend::execute::asynchronous::RunsStatements for AsyncPgConnection {}

    impl AsyncInboxConnection for AsyncPgConnection {}

    impl AsyncInternals for AsyncPgConnection {
        async fn inbox_begin(&mut self) -> Result<Scope, (Scope, Error)> {
            ansi::begin(self).await
        }

        const NOTIFIES: bool = true;

        /// `LISTEN` on the outbox's channel and the probe's, in the simple
        /// query protocol (no prepared statement: it may pass a proxy).
        async fn outbox_listen(&mut self, probe: &str) -> QueryResult<bool> {
            debug_assert!(probe
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'));
            self.batch_execute(&format!("LISTEN {OUTBOX_CHANNEL}; LISTEN {probe}"))
                .await?;
            Ok(true)
        }

        async fn outbox_notify(&mut self, probe: &str) -> QueryResult<()> {
            debug_assert!(probe
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'));
            self.batch_execute(&format!("SELECT pg_notify('{probe}', '')"))
                .await
        }

        /// The next notification diesel-async's driver task received; its
        /// stream ends when the connection is gone.
        async fn outbox_notified(&mut self) -> Option<QueryResult<String>> {
            let mut notifications = std::pin::pin!(self.notifications_stream());
            std::future::poll_fn(|cx| futures_core::Stream::poll_next(notifications.as_mut(), cx))
                .await
                .map(|notified| notified.map(|n| n.channel))
        }

        async fn inbox_claim(
            &mut self,
            consumer_name: &str,
            key: &str,
            fingerprint_bytes: Option<&[u8]>,
        ) -> QueryResult<bool> {
            match fingerprint_bytes {
                None => Claim::plain(consumer_name, key).run_async(self).await,
                Some(bytes) => {
                    Claim::fingerprinted(consumer_name, key, bytes)
                        .run_async(self)
                        .await
                }
            }
        }

        /// At top level, two round trips: `BEGIN` and the bound in one
        /// (the simple query protocol runs both), then the claim, whose
        /// `RETURNING` restores the caller's `lock_timeout` ([`Restoring`]).
        /// Inside the caller's transaction, the general sequence.
        async fn inbox_begin_claim_waiting(
            &mut self,
            consumer_name: &str,
            key: &str,
            fingerprint_bytes: Option<&[u8]>,
            wait: std::time::Duration,
        ) -> BeginClaim {
            use diesel_async::TransactionManager;
            if crate::backend::transaction::transaction_open_async(self) {
                return crate::backend::asynchronous::begin_claim_waiting(
                    self,
                    consumer_name,
                    key,
                    fingerprint_bytes,
                    wait,
                )
                .await;
            }
            let bound = Pg::wait_bound(wait).expect("PostgreSQL bounds a claim's wait");
            let begin = format!("BEGIN; {}", bound.set);
            if let Err(e) = self.batch_execute(&begin).await {
                // The BEGIN may have run: end what it opened.
                let _ = self.batch_execute("ROLLBACK").await;
                return (Err((Scope::TopLevel, e)), None);
            }
            let status = diesel_async::AnsiTransactionManager::transaction_manager_status_mut(self);
            if let Err(e) = crate::backend::record_boundary(
                status,
                diesel::connection::TransactionDepthChange::IncreaseDepth,
            ) {
                let _ = self.batch_execute("ROLLBACK").await;
                return (Err((Scope::TopLevel, e)), None);
            }
            let claimed = match fingerprint_bytes {
                None => {
                    Claim::plain(consumer_name, key)
                        .restoring()
                        .run_async(self)
                        .await
                }
                Some(bytes) => {
                    Claim::fingerprinted(consumer_name, key, bytes)
                        .restoring()
                        .run_async(self)
                        .await
                }
            };
            (Ok(Scope::TopLevel), Some(claimed))
        }

        async fn inbox_claim_batch(
            &mut self,
            consumer_name: &str,
            keys: &[&str],
            fingerprints: Option<&[&[u8]]>,
        ) -> QueryResult<Vec<String>> {
            match fingerprints {
                None => ClaimBatch::plain(consumer_name, keys).run_async(self).await,
                Some(fingerprints) => {
                    ClaimBatch::fingerprinted(consumer_name, keys, fingerprints)
                        .run_async(self)
                        .await
                }
            }
        }

        async fn inbox_commit(&mut self, scope: Scope) -> QueryResult<()> {
            if scope == Scope::Savepoint {
                return ansi::commit(self).await;
            }
            // diesel-async does not read the session's transaction status:
            // record the end of the transaction the guard's COMMIT ended.
            // Cancelled before that, the connection still counts as in a
            // transaction, which pools discard.
            match self.batch_execute(GUARDED_COMMIT).await {
                Ok(()) => ansi::ended(self),
                Err(e) => {
                    ansi::rollback(self).await;
                    Err(e)
                }
            }
        }

        async fn inbox_rollback(&mut self) {
            ansi::rollback(self).await
        }
    }

    impl AsyncMigration for AsyncPgConnection {
        async fn catalog(&mut self) -> QueryResult<Catalog> {
            let rows = diesel_async::RunQueryDsl::load(diesel::sql_query(CATALOG), self).await?;
            Ok(read::<Pg>(rows))
        }

        async fn lock(&mut self) -> Result<Scope, InboxError> {
            // DDL is transactional: the lock and every change end together.
            let scope = ansi::begin(self).await.map_err(|(_, e)| e)?;
            let lock = format!("SELECT pg_advisory_xact_lock({MIGRATE_LOCK})");
            if let Err(e) = self.batch_execute(&lock).await {
                ansi::rollback(self).await;
                return Err(InboxError::MigrationFailed(e));
            }
            Ok(scope)
        }

        async fn unlock(&mut self, scope: Scope, keep: bool) -> Result<(), InboxError> {
            if !keep {
                ansi::rollback(self).await;
                return Ok(());
            }
            // A commit at top level, a release inside the caller's transaction.
            let _ = scope;
            ansi::commit(self)
                .await
                .map_err(InboxError::MigrationFailed)
        }
    }
}
