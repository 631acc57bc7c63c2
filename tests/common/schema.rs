//! `migrate` against existing tables: wrong shapes refused, a table of
//! diesel-inbox 0.1 upgraded in place, a newer schema refused. Generic over
//! the backend; each backend file supplies its DDL and runs these.

use super::TestDb;
use diesel::connection::{AnsiTransactionManager, LoadConnection, SimpleConnection};
use diesel::prelude::*;
use diesel_inbox::{InboxBackend, InboxError, Processed, SCHEMA_VERSION};

/// A table shape that differs from the library's in one way, and the words
/// its one problem must contain.
pub struct WrongShape {
    pub name: &'static str,
    pub ddl: &'static str,
    pub problem: &'static str,
}

/// Each wrong shape, on an empty database of its own: `migrate` refuses it
/// with exactly one problem (the deviation, so a correct table raises
/// none), names the fix, changes nothing (a second run refuses the same),
/// and claims are not attempted on it.
pub fn wrong_shapes_are_refused<C>(
    fresh: fn(&str) -> Option<TestDb>,
    open: fn(&str) -> C,
    shapes: &[WrongShape],
) where
    C: LoadConnection<TransactionManager = AnsiTransactionManager>,
    C::Backend: InboxBackend,
{
    for shape in shapes {
        let Some(db) = fresh(&format!("shape_{}", shape.name)) else {
            return;
        };
        let mut conn = open(&db);
        conn.batch_execute(shape.ddl)
            .unwrap_or_else(|e| panic!("{}: create the wrong table: {e}", shape.name));
        for run in ["first", "second"] {
            match diesel_inbox::migrate(&mut conn) {
                Err(InboxError::IncompatibleTable(problems)) => {
                    assert_eq!(
                        problems.len(),
                        1,
                        "{} ({run} migrate): {problems:#?}",
                        shape.name
                    );
                    assert!(
                        problems[0].problem.contains(shape.problem),
                        "{}: {:?} does not mention {:?}",
                        shape.name,
                        problems[0].problem,
                        shape.problem
                    );
                    assert!(!problems[0].fix.is_empty());
                }
                other => panic!(
                    "{} ({run} migrate): expected IncompatibleTable, got {other:?}",
                    shape.name
                ),
            }
        }
        assert_eq!(
            diesel_inbox::schema_version(&mut conn).expect("read the version"),
            None,
            "{}: a refused table was recorded",
            shape.name
        );
    }
}

/// A table created by diesel-inbox 0.1 (`legacy_ddl`, no version record)
/// with a row in it: four connections migrate it at once; all succeed, the
/// version is recorded, the row is kept (its redelivery is a duplicate)
/// and new messages apply.
pub fn unversioned_table_is_upgraded_in_place<C>(
    fresh: fn(&str) -> Option<TestDb>,
    open: fn(&str) -> C,
    legacy_ddl: &'static str,
) where
    C: LoadConnection<TransactionManager = AnsiTransactionManager> + 'static,
    C::Backend: InboxBackend,
{
    let Some(db) = fresh("upgrade") else { return };
    let mut conn = open(&db);
    conn.batch_execute(legacy_ddl).expect("the 0.1 table");
    let claim = |conn: &mut C, key: &str| -> QueryResult<Processed<()>> {
        diesel_inbox::Inbox::consumer("legacy")
            .retries(0)
            .run(conn, key, |_| Ok(()))
    };
    // Written before the upgrade, as 0.1 wrote it.
    assert_eq!(
        claim(&mut conn, "m-1").expect("0.1 claim"),
        Processed::Applied(())
    );
    assert_eq!(
        diesel_inbox::schema_version(&mut conn).expect("version"),
        None
    );

    let barrier = std::sync::Arc::new(std::sync::Barrier::new(4));
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let (url, barrier) = (db.to_string(), barrier.clone());
            std::thread::spawn(move || {
                let mut conn = open(&url);
                barrier.wait();
                diesel_inbox::migrate(&mut conn)
            })
        })
        .collect();
    for thread in threads {
        thread
            .join()
            .expect("no panic")
            .expect("concurrent upgrade");
    }
    assert_eq!(
        diesel_inbox::schema_version(&mut conn).expect("version"),
        Some(SCHEMA_VERSION)
    );
    assert_eq!(
        claim(&mut conn, "m-1").expect("redelivery"),
        Processed::Duplicate
    );
    assert_eq!(
        claim(&mut conn, "m-2").expect("new"),
        Processed::Applied(())
    );
    diesel_inbox::migrate(&mut conn).expect("migrate again");
    schema_2_works_on_upgraded_rows(&mut conn);
}

/// After an upgrade from version 1 (the consumer `legacy` holds `m-1`,
/// written before it): the row written before accepts any content and holds
/// no stored result, and fingerprints, stored results and attempt counts
/// work for new keys.
fn schema_2_works_on_upgraded_rows<C>(conn: &mut C)
where
    C: LoadConnection<TransactionManager = AnsiTransactionManager>,
    C::Backend: InboxBackend,
{
    use diesel_inbox::{Fingerprint, Inbox, Stored};
    let with = |conn: &mut C, key: &str, content: &[u8]| -> QueryResult<Stored<i64>> {
        Inbox::consumer("legacy")
            .retries(0)
            .classify(diesel_inbox::ErrorClass::of)
            .fingerprint(Fingerprint::of_bytes(content))
            .max_attempts(2)
            .store_result()
            .run(conn, key, |_| Ok(7))
    };
    // Applied before the upgrade: any content is a duplicate, with no value.
    assert_eq!(
        with(conn, "m-1", b"a").expect("old row"),
        Stored::Duplicate(None)
    );
    assert_eq!(
        with(conn, "m-1", b"b").expect("old row"),
        Stored::Duplicate(None)
    );
    // New keys get all of schema 2.
    assert_eq!(with(conn, "m-3", b"a").expect("new"), Stored::Applied(7));
    assert_eq!(
        with(conn, "m-3", b"a").expect("again"),
        Stored::Duplicate(Some(7))
    );
    let reused = with(conn, "m-3", b"b");
    assert!(
        matches!(&reused, Err(diesel::result::Error::QueryBuilderError(e))
            if matches!(e.downcast_ref::<InboxError>(), Some(InboxError::KeyReused { .. }))),
        "{reused:?}"
    );
    let failing = |conn: &mut C| -> QueryResult<Processed<()>> {
        Inbox::consumer("legacy")
            .retries(0)
            .classify(diesel_inbox::ErrorClass::of)
            .max_attempts(1)
            .run(conn, "m-4", |_| Err(diesel::result::Error::NotFound))
    };
    assert!(matches!(
        failing(conn),
        Err(diesel::result::Error::NotFound)
    ));
    let count = diesel_inbox::attempts(conn, "legacy", "m-4").expect("attempts");
    assert_eq!(count.map(|c| c.failures), Some(1));
    assert!(matches!(
        failing(conn),
        Err(diesel::result::Error::QueryBuilderError(_))
    ));
}

/// A table recorded as version 1 (`legacy_ddl` and version 1's record, as
/// a release with versioning and schema 1 left it) is upgraded to the
/// current version in place, and schema 2 works on it.
pub fn version_1_table_is_upgraded_in_place<C>(
    fresh: fn(&str) -> Option<TestDb>,
    open: fn(&str) -> C,
    legacy_ddl: &'static str,
) where
    C: LoadConnection<TransactionManager = AnsiTransactionManager>,
    C::Backend: InboxBackend,
{
    let Some(db) = fresh("upgrade_v1") else {
        return;
    };
    let mut conn = open(&db);
    conn.batch_execute(legacy_ddl).expect("the version 1 table");
    conn.batch_execute(&diesel_inbox::__testing::record_version::<C::Backend>(1))
        .expect("record version 1");
    assert_eq!(
        diesel_inbox::schema_version(&mut conn).expect("version"),
        Some(1)
    );
    let plain = |conn: &mut C, key: &str| -> QueryResult<Processed<()>> {
        diesel_inbox::Inbox::consumer("legacy")
            .retries(0)
            .classify(diesel_inbox::ErrorClass::of)
            .run(conn, key, |_| Ok(()))
    };
    assert_eq!(
        plain(&mut conn, "m-1").expect("version 1 claim"),
        Processed::Applied(())
    );
    diesel_inbox::migrate(&mut conn).expect("upgrade");
    assert_eq!(
        diesel_inbox::schema_version(&mut conn).expect("version"),
        Some(SCHEMA_VERSION)
    );
    assert_eq!(
        plain(&mut conn, "m-1").expect("redelivery"),
        Processed::Duplicate
    );
    schema_2_works_on_upgraded_rows(&mut conn);
    the_outbox_works(&mut conn);
}

/// Schema 3's outbox on an upgraded database: a message enqueued in a
/// handler's transaction is pending; outside one, enqueue is refused.
fn the_outbox_works<C>(conn: &mut C)
where
    C: LoadConnection<TransactionManager = AnsiTransactionManager>,
    C::Backend: InboxBackend,
{
    use diesel_inbox::outbox::{self, Outgoing};
    let before = outbox::status(conn).expect("status").pending;
    let enqueued = diesel_inbox::Inbox::consumer("upgraded")
        .retries(0)
        .classify(diesel_inbox::ErrorClass::of)
        .run(conn, "m-9", |conn| {
            outbox::enqueue(conn, Outgoing::new("stock", "{}").ordering_key("k"))
                .map_err(diesel::result::Error::from)
        })
        .expect("enqueue in the handler");
    assert!(matches!(enqueued, Processed::Applied(id) if id.len() == 36));
    assert_eq!(outbox::status(conn).expect("status").pending, before + 1);
    assert!(matches!(
        outbox::enqueue(conn, Outgoing::new("stock", "{}")),
        Err(InboxError::NotInTransaction { .. })
    ));
}

/// A database at schema 2 (no outbox table) is upgraded to the current
/// version in place: its inbox rows stay, and the outbox works.
pub fn version_2_is_upgraded_with_the_outbox<C>(
    fresh: fn(&str) -> Option<TestDb>,
    open: fn(&str) -> C,
) where
    C: LoadConnection<TransactionManager = AnsiTransactionManager>,
    C::Backend: InboxBackend,
{
    let Some(db) = fresh("upgrade_v2") else {
        return;
    };
    let mut conn = open(&db);
    diesel_inbox::migrate(&mut conn).expect("migrate");
    // Schema 2 as its release left it: no outbox table, no positions,
    // version 2.
    conn.batch_execute("DROP TABLE outbox_messages")
        .expect("drop the outbox");
    conn.batch_execute("DROP TABLE inbox_positions")
        .expect("drop the positions");
    conn.batch_execute(&diesel_inbox::__testing::record_version::<C::Backend>(2))
        .expect("record version 2");
    assert_eq!(
        diesel_inbox::schema_version(&mut conn).expect("version"),
        Some(2)
    );
    let plain = |conn: &mut C, key: &str| -> QueryResult<Processed<()>> {
        diesel_inbox::Inbox::consumer("v2")
            .retries(0)
            .classify(diesel_inbox::ErrorClass::of)
            .run(conn, key, |_| Ok(()))
    };
    assert_eq!(
        plain(&mut conn, "m-1").expect("claim"),
        Processed::Applied(())
    );
    diesel_inbox::migrate(&mut conn).expect("upgrade");
    assert_eq!(
        diesel_inbox::schema_version(&mut conn).expect("version"),
        Some(SCHEMA_VERSION)
    );
    assert_eq!(
        plain(&mut conn, "m-1").expect("redelivery"),
        Processed::Duplicate
    );
    the_outbox_works(&mut conn);
    // Schema 4's positions table is there, empty.
    assert_eq!(
        diesel_inbox::positions(&mut conn, None).expect("positions"),
        Vec::new()
    );
    // A later `migrate` finds it current.
    diesel_inbox::migrate(&mut conn).expect("migrate again");
}

/// What an operator can drop of the schema, and `migrate` must make again:
/// each library table, each column a schema step added, and several at
/// once (as a run interrupted between its pieces leaves MySQL, whose DDL
/// is not transactional).
const DROPPED: [&[(&str, Option<&str>)]; 8] = [
    &[("inbox_messages", None)],
    &[("inbox_attempts", None)],
    &[("outbox_messages", None)],
    &[("inbox_positions", None)],
    &[("inbox_messages", Some("fingerprint"))],
    &[("inbox_messages", Some("result"))],
    &[("outbox_messages", Some("txid"))],
    &[
        ("inbox_attempts", None),
        ("inbox_positions", None),
        ("outbox_messages", Some("txid")),
        ("inbox_messages", Some("result")),
    ],
];

/// A count read by `rows_per_table`.
#[derive(QueryableByName)]
pub struct Count {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    pub n: i64,
}

/// The rows of each library table, each read through every column the
/// current schema has (a missing column fails the read).
fn rows_per_table<C>(conn: &mut C) -> [i64; 4]
where
    C: LoadConnection<TransactionManager = AnsiTransactionManager>,
    C::Backend: InboxBackend,
    for<'a> diesel::query_builder::SqlQuery: diesel::query_dsl::LoadQuery<'a, C, Count>,
{
    [
        "SELECT COUNT(*) AS n FROM inbox_messages WHERE received_at IS NOT NULL \
         AND (fingerprint IS NULL OR result IS NULL OR 1 = 1)",
        "SELECT COUNT(*) AS n FROM inbox_attempts WHERE failures >= 0 AND last_error IS NOT NULL",
        "SELECT COUNT(*) AS n FROM outbox_messages WHERE (txid IS NULL OR txid IS NOT NULL) \
         AND dead_at IS NULL",
        "SELECT COUNT(*) AS n FROM inbox_positions WHERE next_offset >= 0",
    ]
    .map(|sql| {
        diesel::sql_query(sql)
            .get_result::<Count>(conn)
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
            .n
    })
}

/// `migrate` converges from each state an operator (or an interrupted
/// run) can leave: on a database with rows in every library table, each
/// table and each column a schema step added is dropped in turn; `migrate`
/// makes it again, records the current version, keeps the rows of every
/// table it did not drop, and the first claim on a new connection finds
/// the schema whole (its shape check reads every table and column).
pub fn migrate_converges_after_a_table_or_column_is_dropped<C>(
    fresh: fn(&str) -> Option<TestDb>,
    open: fn(&str) -> C,
) where
    C: LoadConnection<TransactionManager = AnsiTransactionManager>,
    C::Backend: InboxBackend,
    for<'a> diesel::query_builder::SqlQuery: diesel::query_dsl::LoadQuery<'a, C, Count>,
{
    for (n, dropped) in DROPPED.into_iter().enumerate() {
        let what = dropped
            .iter()
            .map(|(table, column)| match column {
                None => format!("table {table}"),
                Some(column) => format!("column {table}.{column}"),
            })
            .collect::<Vec<_>>()
            .join(", ");
        let Some(db) = fresh(&format!("converge_{n}")) else {
            return;
        };
        let mut conn = open(&db);
        diesel_inbox::migrate(&mut conn).expect("migrate");
        conn.batch_execute(
            "INSERT INTO inbox_messages (consumer, message_id) VALUES ('kept', 'm-1'); \
             INSERT INTO inbox_messages (consumer, message_id) VALUES ('kept', 'm-2'); \
             INSERT INTO inbox_attempts (consumer, message_id, failures, last_error) \
             VALUES ('kept', 'm-3', 1, 'boom'); \
             INSERT INTO inbox_positions (consumer, topic, partition_id, next_offset, updated_at) \
             VALUES ('kept', 'orders', 0, 7, 0)",
        )
        .expect("rows");
        conn.transaction(|conn| {
            diesel_inbox::outbox::enqueue(conn, diesel_inbox::outbox::Outgoing::new("stock", "{}"))
                .map_err(diesel::result::Error::from)
        })
        .expect("an outbox row");
        let before = rows_per_table(&mut conn);
        assert_eq!(before, [2, 1, 1, 1]);
        for (table, column) in dropped {
            let drop = match column {
                None => format!("DROP TABLE {table}"),
                Some(column) => format!("ALTER TABLE {table} DROP COLUMN {column}"),
            };
            conn.batch_execute(&drop).expect(&drop);
        }
        diesel_inbox::migrate(&mut conn)
            .unwrap_or_else(|e| panic!("migrate after dropping {what}: {e}"));
        assert_eq!(
            diesel_inbox::schema_version(&mut conn).expect("version"),
            Some(SCHEMA_VERSION),
            "after dropping {what}"
        );
        let mut expected = before;
        for (table, column) in dropped {
            if column.is_none() {
                let index = [
                    "inbox_messages",
                    "inbox_attempts",
                    "outbox_messages",
                    "inbox_positions",
                ]
                .iter()
                .position(|t| t == table)
                .expect("a library table");
                expected[index] = 0;
            }
        }
        assert_eq!(rows_per_table(&mut conn), expected, "after dropping {what}");
        // Current: a second run changes nothing, and a new connection's
        // first claim (its shape check) finds every table and column.
        diesel_inbox::migrate(&mut conn).expect("migrate again");
        let mut other = open(&db);
        let applied = diesel_inbox::Inbox::consumer("kept")
            .retries(0)
            .classify(diesel_inbox::ErrorClass::of)
            .run(&mut other, "m-4", |_| Ok::<_, diesel::result::Error>(()))
            .unwrap_or_else(|e| panic!("a claim after dropping {what}: {e}"));
        assert_eq!(applied, Processed::Applied(()), "after dropping {what}");
        the_outbox_works(&mut other);
    }
}

/// An `outbox_messages` table of the application's own is refused before
/// any DDL runs, with what is wrong and how to fix it; the inbox is not
/// created either.
pub fn a_foreign_outbox_table_is_refused<C>(fresh: fn(&str) -> Option<TestDb>, open: fn(&str) -> C)
where
    C: LoadConnection<TransactionManager = AnsiTransactionManager>,
    C::Backend: InboxBackend,
{
    let Some(db) = fresh("foreign_outbox") else {
        return;
    };
    let mut conn = open(&db);
    conn.batch_execute("CREATE TABLE outbox_messages (id INTEGER PRIMARY KEY, body TEXT)")
        .expect("an application's outbox");
    match diesel_inbox::migrate(&mut conn) {
        Err(e @ InboxError::IncompatibleTable(_)) => {
            let text = e.to_string();
            assert!(text.contains("schema 3 did not create"), "{text}");
            assert!(
                text.contains("column `destination` of `outbox_messages` is missing"),
                "{text}"
            );
        }
        other => panic!("expected IncompatibleTable, got {other:?}"),
    }
    assert_eq!(
        diesel_inbox::schema_version(&mut conn).expect("version"),
        None
    );
}

/// A positions table that lost a column (schema 4, the Kafka runner's) is
/// refused by `migrate`, naming the column and the fix.
pub fn a_wrong_positions_table_is_refused<C>(fresh: fn(&str) -> Option<TestDb>, open: fn(&str) -> C)
where
    C: LoadConnection<TransactionManager = AnsiTransactionManager>,
    C::Backend: InboxBackend,
{
    let Some(db) = fresh("wrong_positions") else {
        return;
    };
    let mut conn = open(&db);
    diesel_inbox::migrate(&mut conn).expect("migrate");
    conn.batch_execute("DROP TABLE inbox_positions")
        .expect("drop the positions");
    conn.batch_execute(
        "CREATE TABLE inbox_positions (consumer VARCHAR(255) NOT NULL, topic VARCHAR(255) NOT NULL, next_offset BIGINT NOT NULL, updated_at BIGINT NOT NULL)",
    )
    .expect("a positions table without its partition");
    match diesel_inbox::migrate(&mut conn) {
        Err(e @ InboxError::IncompatibleTable(_)) => {
            let text = e.to_string();
            assert!(
                text.contains("column `partition_id` of `inbox_positions` is missing"),
                "{text}"
            );
        }
        other => panic!("expected IncompatibleTable, got {other:?}"),
    }
}

/// A schema newer than this release (`record(v)` is the SQL with which
/// that release records version `v`) is refused, and left as it is.
pub fn newer_schema_is_refused<C>(
    fresh: fn(&str) -> Option<TestDb>,
    open: fn(&str) -> C,
    record: fn(u32) -> String,
) where
    C: LoadConnection<TransactionManager = AnsiTransactionManager>,
    C::Backend: InboxBackend,
{
    let Some(db) = fresh("newer") else { return };
    let mut conn = open(&db);
    diesel_inbox::migrate(&mut conn).expect("migrate");
    let newer = SCHEMA_VERSION + 1;
    conn.batch_execute(&record(newer))
        .expect("record a newer version");
    match diesel_inbox::migrate(&mut conn) {
        Err(e @ InboxError::SchemaTooNew { found, supported }) => {
            assert_eq!((found, supported), (newer, SCHEMA_VERSION));
            assert!(e.to_string().contains("upgrade diesel-inbox"), "{e}");
        }
        other => panic!("expected SchemaTooNew, got {other:?}"),
    }
    assert_eq!(
        diesel_inbox::schema_version(&mut conn).expect("version"),
        Some(newer)
    );
}

/// How a delivery on a wrong-shaped table must end: refused with
/// `IncompatibleTable` whose one problem mentions the shape's.
fn assert_refused<T: std::fmt::Debug>(shape: &WrongShape, how: &str, got: Result<T, InboxError>) {
    match got {
        Err(InboxError::IncompatibleTable(problems)) => {
            assert_eq!(problems.len(), 1, "{} ({how}): {problems:#?}", shape.name);
            assert!(
                problems[0].problem.contains(shape.problem),
                "{} ({how}): {:?} does not mention {:?}",
                shape.name,
                problems[0].problem,
                shape.problem
            );
        }
        other => panic!(
            "{} ({how}): expected IncompatibleTable, got {other:?}",
            shape.name
        ),
    }
}

/// Each wrong shape, made without `migrate` (as an application's own
/// migrations make its tables): the first delivery on a connection, sync
/// and async, is refused with `IncompatibleTable` before its body runs
/// and before any inbox row is written; so is the next one on the same
/// connection, and one on a new connection.
pub fn wrong_shapes_are_refused_at_the_first_claim<B: super::backend::TestBackend>(
    shapes: &[WrongShape],
) {
    for shape in shapes {
        let Some(db) = B::fresh(&format!("cs_{}", shape.name)) else {
            return;
        };
        let mut conn = B::open(&db);
        conn.batch_execute(shape.ddl)
            .unwrap_or_else(|e| panic!("{}: create the wrong table: {e}", shape.name));
        let ran = std::sync::atomic::AtomicBool::new(false);
        let deliver = |conn: &mut B::Conn, key: &str| {
            diesel_inbox::Inbox::consumer("shapes").run(conn, key, |_| {
                ran.store(true, std::sync::atomic::Ordering::SeqCst);
                Ok::<_, InboxError>(())
            })
        };
        assert_refused(shape, "first claim", deliver(&mut conn, "m-1"));
        assert_refused(shape, "second claim", deliver(&mut conn, "m-1"));
        assert_refused(shape, "new connection", deliver(&mut B::open(&db), "m-2"));
        #[cfg(feature = "async")]
        {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime");
            runtime.block_on(async {
                let pool = B::pool(&db);
                let mut pooled = B::pooled(&pool).await;
                for how in ["first async claim", "second async claim"] {
                    let got = diesel_inbox::Inbox::consumer("shapes")
                        .run_async(&mut *pooled, "m-3", async |_| Ok::<_, InboxError>(()))
                        .await;
                    assert_refused(shape, how, got);
                }
            });
        }
        assert!(
            !ran.load(std::sync::atomic::Ordering::SeqCst),
            "{}: a body ran on a refused table",
            shape.name
        );
        for key in ["m-1", "m-2", "m-3"] {
            assert_eq!(
                B::inbox_rows(&mut conn, "shapes", key),
                0,
                "{}: a refused claim wrote an inbox row",
                shape.name
            );
        }
    }
}

/// Counts the statements a connection starts.
#[derive(Clone, Default)]
struct Statements(std::sync::Arc<std::sync::atomic::AtomicUsize>);

impl diesel::connection::Instrumentation for Statements {
    fn on_connection_event(&mut self, event: diesel::connection::InstrumentationEvent<'_>) {
        if let diesel::connection::InstrumentationEvent::StartQuery { .. } = event {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }
}

/// The shape check costs one catalog query per connection and nothing per
/// message: on a migrated table, the first delivery on a connection runs
/// exactly one statement more than each later one, whose counts are equal.
/// A connection with an instrumentation of its own wrapped in
/// `ErrorObserver` keeps that; one with its own unwrapped has nowhere to
/// record the check, which is then remembered per process and backend: at
/// most its first delivery pays the query (none if a connection of this
/// test binary with an unwrapped instrumentation checked before), never
/// every delivery.
pub fn the_shape_is_checked_once_per_connection<B: super::backend::TestBackend>() {
    let Some(db) = B::fresh("shape_once") else {
        return;
    };
    diesel_inbox::migrate(&mut B::open(&db)).expect("migrate");
    let statements_of = |conn: &mut B::Conn, counter: &Statements, keys: &[&str]| {
        keys.iter()
            .map(|key| {
                let before = counter.0.load(std::sync::atomic::Ordering::SeqCst);
                let out = diesel_inbox::Inbox::consumer("once")
                    .run(conn, *key, |_| Ok::<_, InboxError>(()))
                    .expect("delivery");
                assert_eq!(out, Processed::Applied(()));
                counter.0.load(std::sync::atomic::Ordering::SeqCst) - before
            })
            .collect::<Vec<_>>()
    };
    let counter = Statements::default();
    let mut conn = B::open(&db);
    conn.set_instrumentation(diesel_inbox::ErrorObserver::wrapping(counter.clone()));
    let wrapped = statements_of(&mut conn, &counter, &["w-1", "w-2", "w-3"]);
    assert_eq!(
        wrapped[0],
        wrapped[1] + 1,
        "statements per delivery: {wrapped:?}"
    );
    assert_eq!(
        wrapped[1], wrapped[2],
        "statements per delivery: {wrapped:?}"
    );

    let counter = Statements::default();
    let mut conn = B::open(&db);
    conn.set_instrumentation(counter.clone());
    let own = statements_of(&mut conn, &counter, &["o-1", "o-2", "o-3"]);
    assert!(
        own[0] == wrapped[0] || own[0] == wrapped[1],
        "own instrumentation: {own:?}, wrapped: {wrapped:?}"
    );
    assert_eq!(
        own[1..],
        [wrapped[1], wrapped[1]],
        "own instrumentation: {own:?}, wrapped: {wrapped:?}"
    );
}

/// A connection whose first claim found no table is not marked checked:
/// the wrong-shaped table the application creates next is refused at the
/// next claim on that same connection.
pub fn a_table_made_after_a_failed_claim_is_checked<B: super::backend::TestBackend>(
    shape: &WrongShape,
) {
    let Some(db) = B::fresh("made_later") else {
        return;
    };
    let mut conn = B::open(&db);
    let deliver = |conn: &mut B::Conn| {
        diesel_inbox::Inbox::consumer("later").run(conn, "m-1", |_| Ok::<_, InboxError>(()))
    };
    assert!(deliver(&mut conn).is_err(), "no table yet");
    B::open(&db)
        .batch_execute(shape.ddl)
        .unwrap_or_else(|e| panic!("{}: create the wrong table: {e}", shape.name));
    assert_refused(shape, "after the table was made", deliver(&mut conn));
    assert_eq!(B::inbox_rows(&mut conn, "later", "m-1"), 0);
}

/// The schema checks' `#[test]` shims for one backend `$B`. In scope where
/// it is invoked: the backend's `fresh` and `open`, its `SHAPES` and its
/// `LEGACY_DDL`; `newer` makes the statement that records a newer schema
/// version.
#[macro_export]
macro_rules! schema_tests {
    ($B:ty, runs_if = $runs_if:meta, else_ignored = $why:literal, newer = $newer:expr) => {
        #[test]
        #[cfg_attr(not($runs_if), ignore = $why)]
        fn migrate_refuses_each_wrong_table_shape() {
            $crate::common::schema::wrong_shapes_are_refused(fresh, open, SHAPES);
        }

        #[test]
        #[cfg_attr(not($runs_if), ignore = $why)]
        fn the_first_claim_refuses_each_wrong_table_shape_without_migrate() {
            $crate::common::schema::wrong_shapes_are_refused_at_the_first_claim::<$B>(SHAPES);
        }

        #[test]
        #[cfg_attr(not($runs_if), ignore = $why)]
        fn the_table_shape_is_checked_once_per_connection() {
            $crate::common::schema::the_shape_is_checked_once_per_connection::<$B>();
        }

        #[test]
        #[cfg_attr(not($runs_if), ignore = $why)]
        fn a_table_made_after_a_failed_claim_is_checked() {
            $crate::common::schema::a_table_made_after_a_failed_claim_is_checked::<$B>(&SHAPES[0]);
        }

        #[test]
        #[cfg_attr(not($runs_if), ignore = $why)]
        fn migrate_upgrades_a_table_of_release_0_1_in_place() {
            $crate::common::schema::unversioned_table_is_upgraded_in_place(fresh, open, LEGACY_DDL);
        }

        #[test]
        #[cfg_attr(not($runs_if), ignore = $why)]
        fn migrate_upgrades_a_version_1_table_in_place() {
            $crate::common::schema::version_1_table_is_upgraded_in_place(fresh, open, LEGACY_DDL);
        }

        #[test]
        #[cfg_attr(not($runs_if), ignore = $why)]
        fn migrate_upgrades_a_version_2_database_with_the_outbox() {
            $crate::common::schema::version_2_is_upgraded_with_the_outbox(fresh, open);
        }

        #[test]
        #[cfg_attr(not($runs_if), ignore = $why)]
        fn migrate_converges_after_a_table_or_column_is_dropped() {
            $crate::common::schema::migrate_converges_after_a_table_or_column_is_dropped(
                fresh, open,
            );
        }

        #[test]
        #[cfg_attr(not($runs_if), ignore = $why)]
        fn migrate_refuses_an_outbox_table_of_the_application() {
            $crate::common::schema::a_foreign_outbox_table_is_refused(fresh, open);
        }

        #[test]
        #[cfg_attr(not($runs_if), ignore = $why)]
        fn migrate_refuses_a_positions_table_without_its_columns() {
            $crate::common::schema::a_wrong_positions_table_is_refused(fresh, open);
        }

        #[test]
        #[cfg_attr(not($runs_if), ignore = $why)]
        fn migrate_refuses_a_newer_schema() {
            $crate::common::schema::newer_schema_is_refused(fresh, open, $newer);
        }
    };
}
