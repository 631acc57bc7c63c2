//! `migrate` against existing tables: wrong shapes refused, a table of
//! diesel-inbox 0.1 upgraded in place, a newer schema refused. Generic over
//! the backend; each backend file supplies its DDL and runs these.

use super::TestDb;
use diesel::connection::{AnsiTransactionManager, LoadConnection};
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
    conn.batch_execute(&<C::Backend as InboxBackend>::record_version(1))
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
