//! PostgreSQL: what this backend knows. The claim's statements are in
//! [`claim`]; the async connection (its transactions, the claim's round
//! trips and the outbox's `LISTEN`) in `connection`; this file holds the
//! backend's constants and error classes (`Internals`), the catalog query
//! and the table checks (`Dialect`), and the migration lock.

use crate::backend::shape::{parse_version_marker, version_marker, CatalogRow, Dialect};
use crate::backend::transaction::{begin, end_migrations, rollback, Scope};
use crate::backend::{database_error, Catalog, InboxBackend, Internals};
use crate::error::{InboxError, TableProblem};
use crate::prerequisite::Prerequisite;
use crate::rows::StoredRow;
pub(crate) use claim::guarded_sql_for_tests;
use claim::push_guard;
use claim::{Claim, ClaimBatch};
use diesel::connection::{AnsiTransactionManager, Connection, LoadConnection};
use diesel::pg::Pg;
use diesel::prelude::*;
use diesel::result::{DatabaseErrorKind, Error};

mod claim;
#[cfg(feature = "async")]
mod connection;

/// Key of the transaction-scoped advisory lock that serializes `migrate`
/// (concurrent `CREATE TABLE IF NOT EXISTS` can fail on pg_type otherwise).
const MIGRATE_LOCK: i64 = 0x6469_6573_656c_5f69; // "diesel_i"

/// What PostgreSQL's catalog says about `inbox_messages` (the table the
/// search path resolves), in the rows [`Dialect`] describes:
/// - `table`: a = relkind, b = relpersistence, c = the table comment;
/// - `column`: a = type name, b = declared length, c = `deterministic` or
///   the name of a non-deterministic collation;
/// - indexes: b = `partial` or `expression`;
/// - `attempts`: a column of `inbox_attempts`;
/// - `function`: the view `diesel_inbox_refused` (and so its function
///   `diesel_inbox_refuse`), where it exists;
/// - `may create`: the schema tables are created in, where the role may
///   create objects in it.
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
UNION ALL
SELECT 'function', 'diesel_inbox_refused', NULL, NULL, NULL, NULL
WHERE to_regclass('diesel_inbox_refused') IS NOT NULL
UNION ALL
SELECT 'may create', current_schema()::text, NULL, NULL, NULL, NULL
WHERE has_schema_privilege(current_schema(), 'CREATE')
UNION ALL
SELECT 'setting', name::text, setting::text, NULL, NULL, NULL
FROM pg_settings
WHERE name IN ('fsync', 'synchronous_commit', 'full_page_writes')
UNION ALL
SELECT 'setting', 'replication', count(*)::text,
       (count(*) FILTER (WHERE r.sync_state IN ('sync', 'quorum')))::text,
       (count(*) FILTER (WHERE r.sync_state IS NULL))::text,
       concat_ws('|', current_setting('synchronous_standby_names'),
                 current_setting('synchronous_commit'), pg_is_in_recovery()::text)
FROM pg_stat_replication r
WHERE r.state IS DISTINCT FROM 'backup'
  AND EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.pid = r.pid AND a.datid IS NULL)
"#;
/// The channel an outbox enqueue notifies at commit and relays `LISTEN`
/// on (`outbox::set_notify`). Notifications are per database: relays of
/// other schemas in the same database wake too, find nothing, and wait.
pub(crate) const OUTBOX_CHANNEL: &str = "diesel_inbox_outbox";

/// The advisory lock a relay holds (shared, on its `LISTEN` connection)
/// while it sleeps, keyed by the outbox table the search path resolves: an
/// enqueue notifies only when it finds the lock held, so that while every
/// relay is awake no commit takes `NOTIFY`'s commit-time lock. The
/// protocol, and why no enqueue's message can wait for a poll because of
/// it: `outbox::notify`.
pub(crate) const ASLEEP_LOCK: &str =
    "1684627297, CAST(CAST(CAST('outbox_messages' AS regclass) AS oid) AS integer)";

/// The commit guard: PostgreSQL turns COMMIT of an aborted transaction (a
/// statement failed and the body swallowed the error) into a silent
/// ROLLBACK, which diesel reports as success. The guard fails in an aborted
/// transaction and stops the batch before COMMIT, in the same round trip. A
/// SAVEPOINT is the cheapest such statement (docs/performance.md
/// compares it with a `SELECT 1` guard).
const GUARDED_COMMIT: &str = "SAVEPOINT diesel_inbox_guard; COMMIT";

/// PostgreSQL's 55P03 (a lock wait ended by `lock_timeout`, or `NOWAIT`).
/// Neither diesel's `PgConnection` nor diesel-async keeps its SQLSTATE, and
/// the error has no field but its message: read in English, the server's
/// default language. Under another `lc_messages` it is not recognised, and
/// the claim's error is returned rather than retried.
fn lock_not_available(error: &Error) -> bool {
    database_error(error).is_some_and(|(_, message)| {
        message.contains("canceling statement due to lock timeout")
            || message.contains("could not obtain lock")
    })
}

impl InboxBackend for Pg {
    const DDL: &'static str = crate::backend::ddl::POSTGRES;
}

impl Internals for Pg {
    const BEGIN: &'static str = "BEGIN";
    const CACHE_SIDE_STATEMENTS: bool = false;
    const KEY_TYPE: &'static str =
        "VARCHAR(255) NOT NULL (or TEXT) with a deterministic collation (the default)";
    // Nullable columns without a default: a catalog change, no table
    // rewrite.
    const SCHEMA: crate::backend::Schema = crate::backend::Schema {
        inbox: include_str!("../postgres.sql"),
        inbox_columns: [
            (
                "fingerprint",
                "ALTER TABLE inbox_messages ADD COLUMN IF NOT EXISTS fingerprint BYTEA;",
            ),
            (
                "result",
                "ALTER TABLE inbox_messages ADD COLUMN IF NOT EXISTS result BYTEA;",
            ),
        ],
        attempts: include_str!("../postgres_attempts.sql"),
        outbox: include_str!("../postgres_outbox.sql"),
        outbox_txid: include_str!("../postgres_outbox_txid.sql"),
        positions: include_str!("../postgres_positions.sql"),
        refuse: Some((claim::REFUSED, include_str!("../postgres_refuse.sql"))),
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

    fn lookup<C>(conn: &mut C, consumer_name: &str, key: &str) -> QueryResult<Option<StoredRow>>
    where
        C: LoadConnection<Backend = Self>,
    {
        claim::Lookup {
            consumer: consumer_name,
            key,
        }
        .run(conn)
    }

    fn commit_top_level<C>(conn: &mut C) -> QueryResult<()>
    where
        C: Connection<Backend = Self, TransactionManager = AnsiTransactionManager>,
    {
        // diesel resyncs its depth from libpq's status (idle after the
        // COMMIT, also a failed one).
        let Err(error) = conn.batch_execute(GUARDED_COMMIT) else {
            return Ok(());
        };
        // The guard fails only inside an aborted transaction, and then the
        // COMMIT never ran: the transaction is still open, which a failed
        // COMMIT never leaves it.
        let aborted = crate::backend::transaction::transaction_open(conn);
        crate::backend::transaction::rollback(conn);
        Err(match aborted {
            true => crate::backend::errors::aborted_transaction(error),
            false => error,
        })
    }

    fn is_transient(error: &Error) -> bool {
        // 40001 arrives as SerializationFailure (diesel reads the SQLSTATE);
        // 40P01 (deadlock) by the untranslated lock modes of its detail;
        // 55P03 (lock timeout, NOWAIT) only as message text.
        matches!(
            database_error(error),
            Some((DatabaseErrorKind::SerializationFailure, _))
        ) || crate::backend::errors::postgres_deadlock(error)
            || lock_not_available(error)
    }

    /// `lock_timeout`, transaction-local (`set_config(.., true)`: a
    /// rollback restores it, and a proxy in transaction mode keeps it to
    /// this transaction), the caller's own remembered in a placeholder
    /// setting of ours. 0 would mean no bound: at least 1 ms.
    fn wait_bound(wait: std::time::Duration) -> Option<crate::backend::WaitBound> {
        let ms = wait.as_millis().clamp(1, i32::MAX as u128);
        Some(crate::backend::WaitBound {
            set: claim::WAIT_BOUND.replace("{ms}", &ms.to_string()),
            restore: claim::WAIT_RESTORE_STATEMENT,
            rollback_restores: true,
        })
    }

    fn is_wait_timeout(error: &Error) -> bool {
        // 55P03, by its message (see `lock_not_available`).
        database_error(error)
            .is_some_and(|(_, message)| message.contains("canceling statement due to lock timeout"))
    }

    fn is_aborted_commit(error: &Error) -> bool {
        // Marked by the commit that found its guard refused (25P02): a
        // statement of the body failed and the body went on.
        crate::backend::errors::is_aborted_transaction(error)
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
    const RECEIVED_AT_OF_MICROS: (&'static str, &'static str) =
        ("(TIMESTAMP 'epoch' + interval '1 microsecond' * ", ")");

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
        // The transaction's id first (so that a relay's snapshot taken
        // after this probe lists it, or sees it finished), then the probe:
        // the exclusive lock is free unless a relay sleeps (it holds it
        // shared), and taken and given back in one expression.
        out.push_sql(" FROM (SELECT CASE WHEN NOT ");
        out.push_bind_param::<diesel::sql_types::Bool, bool>(notify)?;
        out.push_sql(
            " THEN NULL WHEN pg_current_xact_id() IS NULL THEN NULL WHEN pg_try_advisory_lock(",
        );
        out.push_sql(ASLEEP_LOCK);
        out.push_sql(") THEN pg_advisory_unlock(");
        out.push_sql(ASLEEP_LOCK);
        out.push_sql(") AND NULL ELSE (SELECT true FROM pg_notify('");
        out.push_sql(OUTBOX_CHANNEL);
        out.push_sql("', '')) END) AS notified");
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
    // NULL, and no floor, on a table without `txid` (not yet migrated to
    // schema 5): the look then starts at the lowest `seq`, as before.
    const SNAPSHOT_XMIN: Option<&'static str> = Some(
        "(SELECT txid_snapshot_xmin(txid_current_snapshot()) WHERE EXISTS (SELECT 1 \
         FROM pg_attribute WHERE attrelid = CAST('outbox_messages' AS regclass) \
         AND attname = 'txid' AND NOT attisdropped))",
    );
    // NULL (no floor) on a standby: a session opened there lives on
    // through its promotion, past rows the old primary deleted.
    const SESSION: Option<&'static str> = Some(
        "(SELECT CASE WHEN pg_is_in_recovery() THEN NULL ELSE a.pid || ':' || \
         CAST(EXTRACT(EPOCH FROM a.backend_start) * 1000000 AS BIGINT) END \
         FROM pg_stat_get_activity(pg_backend_pid()) a)",
    );
    const SET_TXID: Option<&'static str> = Some(", txid = txid_current()");

    const WAL: bool = true;
    const SKIP_LOCKED: &'static str = " FOR UPDATE SKIP LOCKED";
    const LOCK_ROW: &'static str = " FOR UPDATE";

    const FENCED_IDLE_LIMIT: Option<&'static str> =
        Some("set_config('idle_in_transaction_session_timeout', '30s', true)");
    const FENCE_IN_ONE: bool = true;

    fn catalog<C>(conn: &mut C) -> QueryResult<Catalog>
    where
        C: LoadConnection<Backend = Self>,
    {
        crate::backend::shape::catalog(conn)
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

/// The catalog's `replication` row judged: `a` the physical standbys
/// streaming from this server (a sender of logical decoding, such as the
/// WAL outbox's relay, is connected to a database and is not one; nor is
/// a base backup), `b` those whose `sync_state` is `sync` or `quorum`,
/// `c` those whose state this role cannot read (without
/// `pg_read_all_stats`), `d` `synchronous_standby_names`,
/// `synchronous_commit` and `pg_is_in_recovery()`, joined by `|`. With
/// asynchronous standbys, a failover (Patroni, repmgr, a managed service's)
/// can promote one that never received a commit this server acknowledged:
/// its message was acked to the broker, and it is gone.
fn replication(row: &CatalogRow) -> Prerequisite {
    let count = |v: &Option<String>| {
        v.as_deref()
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let (standbys, synchronous, unread) = (count(&row.a), count(&row.b), count(&row.c));
    let d = row.d.as_deref().unwrap_or("");
    let mut parts = d.rsplitn(3, '|');
    let (recovery, commit, names) = (
        parts.next().unwrap_or(""),
        parts.next().unwrap_or(""),
        parts.next().unwrap_or(""),
    );
    const FIX: &str = "make the standbys a failover can promote synchronous: synchronous_standby_names = 'FIRST 1 (<standby>)' (or 'ANY 1 (..)') with synchronous_commit = on or remote_apply in postgresql.conf, then reload (Patroni: synchronous_mode: true); or fail over only once the standby has replayed all of the primary's WAL";
    if recovery == "true" {
        return Prerequisite::unknown("replication", "a standby",
            "this server is a standby in recovery: it refuses writes, so no claim or enqueue can commit here, and its primary's replication is not readable from it",
            "point the database URL at the primary (or at the address a failover moves with it)");
    }
    if standbys == 0 {
        return Prerequisite::ok("replication", "no standby",
            "no standby streams from this server, so no failover can promote one that missed a commit (a managed service's replicas that do not stream WAL, and standbys of standbys, do not show here)");
    }
    let plural = if standbys == 1 { "" } else { "s" };
    if names.trim().is_empty() || matches!(commit, "local" | "off") {
        return Prerequisite::warn("replication", "asynchronous",
            format!("{standbys} standby{plural} stream{} from this server asynchronously (synchronous_standby_names = '{names}', synchronous_commit = {commit}): a failover to one may lose commits this server acknowledged, whose messages the inbox acked to their broker", if standbys == 1 { "s" } else { "" }),
            FIX);
    }
    if unread == standbys {
        return Prerequisite::unknown("replication", "not readable",
            format!("synchronous_standby_names = '{names}' with synchronous_commit = {commit}: a commit waits for a named standby, but whether the {standbys} connected standby{plural} a failover could promote {} synchronous is not readable by this role", if standbys == 1 { "is" } else { "are" }),
            "GRANT pg_read_all_stats TO the role, then run doctor again (or read sync_state in pg_stat_replication as a superuser)");
    }
    if synchronous == 0 {
        return Prerequisite::warn("replication", "no synchronous standby",
            format!("synchronous_standby_names = '{names}', but none of the {standbys} connected standby{plural} is synchronous now (sync_state async or potential): commits wait for a standby that is not there, and a failover to a connected one may lose acknowledged commits"),
            FIX);
    }
    let rest = match standbys - synchronous {
        0 => String::new(),
        n => format!(
            "; {n} other{} asynchronous or potential: fail over only to a synchronous one",
            if n == 1 { " is" } else { "s are" }
        ),
    };
    Prerequisite::ok("replication", "synchronous",
        format!("{synchronous} of {standbys} standby{plural} synchronous (synchronous_standby_names = '{names}', synchronous_commit = {commit}): a commit is acknowledged once a standby has it{rest}"))
}

impl Dialect for Pg {
    const CATALOG: &'static str = CATALOG;
    fn version(record: &str) -> Option<u32> {
        parse_version_marker(record)
    }

    fn durability(setting: &CatalogRow) -> Option<Prerequisite> {
        let value = setting.a.as_deref()?;
        Some(match (setting.name.as_str(), value) {
            ("fsync", "off") => Prerequisite::warn("fsync", value,
                "fsync is off: a crash of the machine can lose or corrupt committed transactions",
                "fsync = on in postgresql.conf, then reload",
            ),
            ("fsync", _) => Prerequisite::ok("fsync", value, "each commit's WAL is flushed to disk"),
            ("synchronous_commit", "off") => Prerequisite::warn("synchronous_commit", value,
                "synchronous_commit is off: a commit is acknowledged (a message acked to its broker, an enqueued message published) before it is on disk, and a crash of the server loses it",
                "synchronous_commit = on (or local, remote_write, remote_apply) in postgresql.conf, for the role (ALTER ROLE .. SET synchronous_commit = on) or the session",
            ),
            ("synchronous_commit", _) => Prerequisite::ok("synchronous_commit", value, "a commit is acknowledged once its WAL is on disk"),
            ("full_page_writes", "off") => Prerequisite::warn("full_page_writes", value,
                "full_page_writes is off: a crash of the machine can leave torn pages that recovery cannot repair",
                "full_page_writes = on in postgresql.conf, unless the file system writes pages atomically",
            ),
            ("full_page_writes", _) => Prerequisite::ok("full_page_writes", value, "recovery repairs pages torn by a crash"),
            ("replication", _) => replication(setting),
            _ => return None,
        })
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
    /// The replication row, judged: no standby is ok; asynchronous
    /// standbys WARN; synchronous ones are ok when one is readable as
    /// synchronous, WARN when none is, unknown when the role cannot read
    /// it; a standby in recovery is unknown; names with `|` parse.
    #[test]
    fn replication_is_judged_from_what_the_server_reports() {
        use crate::prerequisite::Verdict;
        let row = |a: &str, b: &str, c: &str, d: &str| CatalogRow {
            kind: "setting".into(),
            name: "replication".into(),
            a: Some(a.into()),
            b: Some(b.into()),
            c: Some(c.into()),
            d: Some(d.into()),
        };
        let judged = |a, b, c, d| {
            let p = replication(&row(a, b, c, d));
            (p.verdict, p.value)
        };
        let v = |verdict, value: &str| (verdict, value.to_owned());
        assert_eq!(
            judged("0", "0", "0", "|on|false"),
            v(Verdict::Ok, "no standby")
        );
        assert_eq!(
            judged("1", "0", "0", "|on|false"),
            v(Verdict::Warn, "asynchronous")
        );
        assert_eq!(
            judged("2", "0", "2", "|on|false"),
            v(Verdict::Warn, "asynchronous")
        );
        assert_eq!(
            judged("1", "1", "0", "s1|local|false"),
            v(Verdict::Warn, "asynchronous")
        );
        assert_eq!(
            judged("1", "1", "0", "s1|on|false"),
            v(Verdict::Ok, "synchronous")
        );
        assert_eq!(
            judged("2", "1", "0", "FIRST 1 (s1, s2)|remote_apply|false"),
            v(Verdict::Ok, "synchronous")
        );
        assert_eq!(
            judged("1", "0", "0", "s1|on|false"),
            v(Verdict::Warn, "no synchronous standby")
        );
        assert_eq!(
            judged("1", "0", "1", "s1|on|false"),
            v(Verdict::Unknown, "not readable")
        );
        assert_eq!(
            judged("0", "0", "0", "|on|true"),
            v(Verdict::Unknown, "a standby")
        );
        let odd = replication(&row("1", "1", "0", "\"a|b\"|on|false"));
        assert_eq!(odd.verdict, Verdict::Ok);
        assert!(odd.detail.contains("'\"a|b\"'"), "{}", odd.detail);
    }

    use super::*;

    fn error(kind: DatabaseErrorKind, message: &str) -> Error {
        Error::DatabaseError(kind, Box::new(message.to_string()))
    }

    /// A deadlock as the server reports it: message, detail, hint.
    fn deadlock(message: &str, detail: &str) -> Error {
        #[derive(Debug)]
        struct Report(String, String);
        impl diesel::result::DatabaseErrorInformation for Report {
            fn message(&self) -> &str {
                &self.0
            }
            fn details(&self) -> Option<&str> {
                Some(&self.1)
            }
            fn hint(&self) -> Option<&str> {
                Some("See server log for query details.")
            }
            fn table_name(&self) -> Option<&str> {
                None
            }
            fn column_name(&self) -> Option<&str> {
                None
            }
            fn constraint_name(&self) -> Option<&str> {
                None
            }
            fn statement_position(&self) -> Option<i32> {
                None
            }
        }
        Error::DatabaseError(
            DatabaseErrorKind::Unknown,
            Box::new(Report(message.into(), detail.into())),
        )
    }

    #[test]
    fn the_fenced_idle_limit_is_the_documented_one() {
        let limit = format!("'{}s'", crate::fence::FENCED_IDLE_LIMIT_SECS);
        assert!(Pg::FENCED_IDLE_LIMIT.is_some_and(|sql| sql.contains(&limit)));
    }

    #[test]
    fn transient_errors_are_serialization_failures_deadlocks_and_lock_timeouts() {
        use DatabaseErrorKind::*;
        assert!(Pg::is_transient(&error(
            SerializationFailure,
            "could not serialize access"
        )));
        assert!(Pg::is_transient(&deadlock(
            "Verklemmung (Deadlock) entdeckt",
            "Prozess 20154 wartet auf ShareLock-Sperre auf Transaktion 734; blockiert von Prozess 20150.\n\
             Prozess 20150 wartet auf ShareLock-Sperre auf Transaktion 736; blockiert von Prozess 20154."
        )));
        assert!(Pg::is_transient(&deadlock(
            "deadlock detected",
            "Process 1 waits for ExclusiveLock on advisory lock [5,0,1,1]; blocked by process 2.\n\
             Process 2 waits for ShareLock on transaction 9; blocked by process 1."
        )));
        // The words alone are not a deadlock: the lock modes of its detail are.
        assert!(!Pg::is_transient(&error(Unknown, "deadlock detected")));
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
